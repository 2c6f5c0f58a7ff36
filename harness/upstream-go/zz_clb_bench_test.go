/*
The CLB reconciler's harness for upstream cloud-provider-azure's ServiceGateway DiffTracker, at
the cluster shape of the project's `tests/benches/difftracker.rs` (1,000 nodes, 30,000 ready pods,
1,000 LoadBalancer Services; everything divided by CLB_BENCH_SHRINK and multiplied by
CLB_BENCH_SCALE), so that the two are measured side by side (harness/upstream-go/README.md).

It lives in package difftracker so it can drive the upstream code exactly as the provider does
(InitializeFromCluster, ReconcileEndpointSlice, LocationsUpdater.process) with in-memory clients:
a fake clientset whose List reactors hand back prebuilt lists (no apiserver, no decode, no copy),
and Azure client stubs that answer from prebuilt NRP DTOs and accept every update.

side-by-side.py copies it into pkg/provider/servicegateway/difftracker/ of upstream's source at
7b31c76c and builds it there (-mod=vendor: offline).
*/

package difftracker

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"sigs.k8s.io/cloud-provider-azure/pkg/azclient"
	"sigs.k8s.io/cloud-provider-azure/pkg/azclient/loadbalancerclient"
	"sigs.k8s.io/cloud-provider-azure/pkg/azclient/natgatewayclient"
	"sigs.k8s.io/cloud-provider-azure/pkg/azclient/publicipaddressclient"
	"sigs.k8s.io/cloud-provider-azure/pkg/azclient/servicegatewayclient"
)

// ---------------------------------------------------------------------------------------------
// The cluster: a port of tests/support/cluster.rs.
// ---------------------------------------------------------------------------------------------

const clbPodsPerService = 30

func clbShrink() int {
	if v, err := strconv.Atoi(os.Getenv("CLB_BENCH_SHRINK")); err == nil && v > 0 {
		return v
	}
	return 1
}

// clbScale multiplies the cluster (nodes and Services; pods per Service stay 30), as the Rust
// side's CLB_BENCH_SCALE does: node_count = service_count = 1000/SHRINK * SCALE.
func clbScale() int {
	if v, err := strconv.Atoi(os.Getenv("CLB_BENCH_SCALE")); err == nil && v > 0 {
		return v
	}
	return 1
}

func clbNodeCount() int    { return 1000 / clbShrink() * clbScale() }
func clbServiceCount() int { return 1000 / clbShrink() * clbScale() }

// clbUID is cluster.rs's uid(): a random-looking version 4 UUID (same bytes as the Rust side).
func clbUID(service int) string {
	h := uint64(service+1) * 0x9e3779b97f4a7c15
	next := func() uint64 {
		h ^= h >> 31
		h *= 0xbf58476d1ce4e5b9
		return h
	}
	a, b, c := next(), next(), next()
	return fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", a>>32, a&0xffff, b&0xfff, (b>>16)&0xfff, c&0xffffffffffff)
}

func clbNodeIP(node int) string { return fmt.Sprintf("10.%d.%d.4", node/250, node%250) }
func clbPodIP(pod int) string {
	return fmt.Sprintf("10.%d.%d.%d", 100+pod/65536, (pod/256)%256, pod%256)
}
func clbPodNode(service, pod int) int { return (service*clbPodsPerService + pod) % clbNodeCount() }

func clbNodes() []v1.Node {
	nodes := make([]v1.Node, 0, clbNodeCount())
	for n := 0; n < clbNodeCount(); n++ {
		nodes = append(nodes, v1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%d", n)},
			Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
				{Type: v1.NodeInternalIP, Address: clbNodeIP(n)},
				{Type: v1.NodeHostName, Address: fmt.Sprintf("node-%d", n)},
			}},
		})
	}
	return nodes
}

// clbService is the etp-local.yaml fixture with the bench's uid/name/ingress and our finalizer.
func clbService(s int) v1.Service {
	return v1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:  "shop",
			Name:       fmt.Sprintf("svc-%d", s),
			UID:        types.UID(clbUID(s)),
			Finalizers: []string{"servicegateway.azure.com/service-cleanup"},
		},
		Spec: v1.ServiceSpec{
			Type:                  v1.ServiceTypeLoadBalancer,
			ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyLocal,
			Selector:              map[string]string{"app": "web"},
			Ports: []v1.ServicePort{{
				Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080),
			}},
		},
		Status: v1.ServiceStatus{LoadBalancer: v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{
			{IP: fmt.Sprintf("20.0.%d.%d", s/250, s%250+1)},
		}}},
	}
}

// clbSlice is cluster.rs's slice(): 30 endpoints, one address each, pod notReady (if >= 0) not ready.
func clbSlice(s int, notReady int) *discoveryv1.EndpointSlice {
	eps := make([]discoveryv1.Endpoint, 0, clbPodsPerService)
	for p := 0; p < clbPodsPerService; p++ {
		eps = append(eps, discoveryv1.Endpoint{
			Addresses:  []string{clbPodIP(s*clbPodsPerService + p)},
			NodeName:   ptr.To(fmt.Sprintf("node-%d", clbPodNode(s, p))),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(p != notReady)},
		})
	}
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "shop",
			Name:      fmt.Sprintf("svc-%d-abcde", s),
			Labels:    map[string]string{discoveryv1.LabelServiceName: fmt.Sprintf("svc-%d", s)},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Service", Name: fmt.Sprintf("svc-%d", s), UID: types.UID(clbUID(s)),
			}},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
}

// clbNRP is cluster.rs's nrp_in_sync(): NRP already holding the whole cluster.
func clbNRP() ([]*armnetwork.ServiceGatewayService, []*armnetwork.ServiceGatewayAddressLocationResponse) {
	locations := make([]*armnetwork.ServiceGatewayAddressLocationResponse, clbNodeCount())
	for n := range locations {
		locations[n] = &armnetwork.ServiceGatewayAddressLocationResponse{AddressLocation: ptr.To(clbNodeIP(n))}
	}
	services := make([]*armnetwork.ServiceGatewayService, 0, clbServiceCount())
	for s := 0; s < clbServiceCount(); s++ {
		for p := 0; p < clbPodsPerService; p++ {
			loc := locations[clbPodNode(s, p)]
			loc.Addresses = append(loc.Addresses, &armnetwork.ServiceGatewayAddress{
				Address: ptr.To(clbPodIP(s*clbPodsPerService + p)), Services: []*string{ptr.To(clbUID(s))},
			})
		}
		services = append(services, &armnetwork.ServiceGatewayService{
			Name: ptr.To(clbUID(s)),
			Properties: &armnetwork.ServiceGatewayServicePropertiesFormat{
				ServiceType: ptr.To(armnetwork.ServiceTypeInbound), IsDefault: ptr.To(false),
			},
		})
	}
	return services, locations
}

// ---------------------------------------------------------------------------------------------
// In-memory clients.
// ---------------------------------------------------------------------------------------------

type clbSGW struct {
	servicegatewayclient.Interface // anything not overridden panics (nil)
	services                       []*armnetwork.ServiceGatewayService
	locations                      []*armnetwork.ServiceGatewayAddressLocationResponse
	updates                        int
	lastAddresses                  int
}

func (s *clbSGW) GetServices(context.Context, string, string) ([]*armnetwork.ServiceGatewayService, error) {
	return s.services, nil
}
func (s *clbSGW) GetAddressLocations(context.Context, string, string) ([]*armnetwork.ServiceGatewayAddressLocationResponse, error) {
	return s.locations, nil
}
func (s *clbSGW) UpdateAddressLocations(_ context.Context, _, _ string, req armnetwork.ServiceGatewayUpdateAddressLocationsRequest) error {
	s.updates++
	s.lastAddresses = 0
	for _, l := range req.AddressLocations {
		s.lastAddresses += len(l.Addresses)
	}
	return nil
}
func (s *clbSGW) UpdateServices(context.Context, string, string, armnetwork.ServiceGatewayUpdateServicesRequest) error {
	return nil
}

type clbLB struct{ loadbalancerclient.Interface }

func (clbLB) List(context.Context, string) ([]*armnetwork.LoadBalancer, error) {
	return []*armnetwork.LoadBalancer{}, nil
}

type clbNAT struct{ natgatewayclient.Interface }

func (clbNAT) List(context.Context, string) ([]*armnetwork.NatGateway, error) {
	return []*armnetwork.NatGateway{}, nil
}

type clbPIP struct{ publicipaddressclient.Interface }

func (clbPIP) List(context.Context, string) ([]*armnetwork.PublicIPAddress, error) {
	return []*armnetwork.PublicIPAddress{}, nil
}

type clbFactory struct {
	azclient.ClientFactory // anything not overridden panics (nil)
	sgw                    *clbSGW
}

func (f *clbFactory) GetServiceGatewayClient() servicegatewayclient.Interface { return f.sgw }
func (f *clbFactory) GetLoadBalancerClient() loadbalancerclient.Interface     { return clbLB{} }
func (f *clbFactory) GetNatGatewayClient() natgatewayclient.Interface         { return clbNAT{} }
func (f *clbFactory) GetPublicIPAddressClient() publicipaddressclient.Interface {
	return clbPIP{}
}

type clbCluster struct {
	nodes    *v1.NodeList
	services *v1.ServiceList
	slices   *discoveryv1.EndpointSliceList
	sgw      *clbSGW
}

func newCLBCluster() *clbCluster {
	c := &clbCluster{
		nodes:    &v1.NodeList{Items: clbNodes()},
		services: &v1.ServiceList{},
		slices:   &discoveryv1.EndpointSliceList{},
		sgw:      &clbSGW{},
	}
	for s := 0; s < clbServiceCount(); s++ {
		c.services.Items = append(c.services.Items, clbService(s))
		c.slices.Items = append(c.slices.Items, *clbSlice(s, -1))
	}
	c.sgw.services, c.sgw.locations = clbNRP()
	return c
}

// kube returns a fake clientset whose Lists return the prebuilt lists themselves: no apiserver
// round trip, no decode, no deep copy (the typed fake returns the reactor's object as is when the
// List has no label selector).
func (c *clbCluster) kube() *fake.Clientset {
	kube := fake.NewSimpleClientset()
	ret := func(obj kruntime.Object) k8stesting.ReactionFunc {
		return func(k8stesting.Action) (bool, kruntime.Object, error) { return true, obj, nil }
	}
	kube.PrependReactor("list", "nodes", ret(c.nodes))
	kube.PrependReactor("list", "services", ret(c.services))
	kube.PrependReactor("list", "endpointslices", ret(c.slices))
	kube.PrependReactor("list", "pods", ret(&v1.PodList{}))
	return kube
}

func clbBenchConfig() Config {
	return Config{
		SubscriptionID: "sub", ResourceGroup: "rg", Location: "eastus", VNetName: "vnet",
		ServiceGatewayResourceName: "sgw",
	}
}

func median(samples []time.Duration) time.Duration {
	s := append([]time.Duration(nil), samples...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// ---------------------------------------------------------------------------------------------
// The benchmark.
// ---------------------------------------------------------------------------------------------

func TestCLBUpstreamBench(t *testing.T) {
	if os.Getenv("CLB_UPSTREAM_BENCH") != "1" {
		t.Skip("set CLB_UPSTREAM_BENCH=1")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := newCLBCluster()
	cfg := clbBenchConfig()

	// (a) Start-up: InitializeFromCluster end to end (lists, NRP reads, diff, updaters started,
	// the initial LocationsUpdater pass, WaitForInitialSync). Median of 3.
	// startInitialization sleeps a fixed 50 ms; reported both with and without it.
	var full []time.Duration
	var dt *DiffTracker
	for run := 0; run < 3; run++ {
		if dt != nil {
			dt.serviceUpdater.Stop()
			dt.locationsUpdater.Stop()
			dt = nil
		}
		kube := c.kube()
		factory := &clbFactory{sgw: c.sgw}
		runtime.GC()
		start := time.Now()
		got, err := InitializeFromCluster(ctx, cfg, factory, kube)
		full = append(full, time.Since(start))
		if err != nil {
			t.Fatal(err)
		}
		dt = got
	}
	if c.sgw.updates != 0 {
		t.Fatalf("start-up sent %d location updates; NRP was in sync", c.sgw.updates)
	}
	if ops := dt.GetSyncOperations(); ops.SyncStatus != AlreadyInSync {
		t.Fatalf("not in sync after start-up: %v", ops.SyncStatus)
	}

	// (a') The in-memory core of the same start-up, without goroutines, sleep or wait: the K8s
	// and NRP state builds, New, the EndpointSlice cache, the full diff (GetSyncOperations) and the
	// LocationsUpdater's full diff (GetSyncLocationsAddresses). Median of 3.
	var core []time.Duration
	for run := 0; run < 3; run++ {
		kube := c.kube()
		factory := &clbFactory{sgw: c.sgw}
		runtime.GC()
		start := time.Now()
		k8s, _, _, sliceList, _, nodeIPs, err := buildK8sState(ctx, kube)
		if err != nil {
			t.Fatal(err)
		}
		nrp, _, _, _, _, err := buildNRPState(ctx, cfg, factory)
		if err != nil {
			t.Fatal(err)
		}
		d, err := New(dt.logger, k8s, nrp, cfg, factory, kube)
		if err != nil {
			t.Fatal(err)
		}
		d.initializeEndpointSlicesCache(sliceList)
		d.seedClusterAddressFamilies(nodeIPs)
		ops := d.GetSyncOperations()
		ld := d.GetSyncLocationsAddresses()
		core = append(core, time.Since(start))
		if ops.SyncStatus != AlreadyInSync || len(ld.Locations) != 0 {
			t.Fatalf("core start-up not in sync: %v, %d locations", ops.SyncStatus, len(ld.Locations))
		}
	}

	// Steady state: the updaters are stopped and the LocationsUpdater's pass is run inline, so each
	// change is timed without goroutine hand-offs. The Node lister is published as the provider
	// does after initialization (SetInformers).
	dt.serviceUpdater.Stop()
	dt.locationsUpdater.Stop()
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for i := range c.nodes.Items {
		if err := indexer.Add(&c.nodes.Items[i]); err != nil {
			t.Fatal(err)
		}
	}
	dt.SetNodeLister(corelisters.NewNodeLister(indexer))
	lu := NewLocationsUpdater(ctx, dt)

	// (b) One endpoint change: a pod of the Service in the middle goes not-ready (even rounds) and
	// ready again (odd), as the EndpointSlice informer reports it (old, new); then the
	// LocationsUpdater pass it triggers: full diff, DTO, NRP call (stub, success), NRP mirror
	// update, pending-deletion checks, gauges. Median of 400.
	mid := clbServiceCount() / 2
	ready, notReady := clbSlice(mid, -1), clbSlice(mid, 7)
	var observe, sync []time.Duration
	for round := 0; round < 400; round++ {
		oldES, newES := ready, notReady
		if round%2 == 1 {
			oldES, newES = notReady, ready
		}
		before := c.sgw.updates
		start := time.Now()
		dt.ReconcileEndpointSlice(oldES, newES)
		observe = append(observe, time.Since(start))
		start = time.Now()
		select { // what LocationsUpdater.Run does before process()
		case <-dt.locationsUpdaterTrigger:
		default:
			t.Fatal("the change did not trigger the LocationsUpdater")
		}
		lu.process(ctx)
		sync = append(sync, time.Since(start))
		if c.sgw.updates != before+1 || c.sgw.lastAddresses != 1 {
			t.Fatalf("round %d: %d updates, %d addresses; want one update of one address", round, c.sgw.updates-before, c.sgw.lastAddresses)
		}
	}

	// (b') Breakdown: the diff alone (GetSyncLocationsAddresses with one pending change), 100 rounds.
	var diff []time.Duration
	for round := 0; round < 100; round++ {
		oldES, newES := ready, notReady
		if round%2 == 1 {
			oldES, newES = notReady, ready
		}
		dt.ReconcileEndpointSlice(oldES, newES)
		start := time.Now()
		ld := dt.GetSyncLocationsAddresses()
		diff = append(diff, time.Since(start))
		if len(ld.Locations) != 1 {
			t.Fatalf("diff found %d locations", len(ld.Locations))
		}
		<-dt.locationsUpdaterTrigger
		lu.process(ctx)
	}

	fullMed := median(full)
	sleep := 50 * time.Millisecond
	fmt.Printf("Cluster: %d nodes, %d ready pods, %d LoadBalancer Services (upstream %s)\n",
		clbNodeCount(), clbServiceCount()*clbPodsPerService, clbServiceCount(), "cloud-provider-azure")
	fmt.Printf("| measure | upstream Go |\n|---|---|\n")
	fmt.Printf("| (a) InitializeFromCluster, end to end | %.2fms |\n", ms(fullMed))
	fmt.Printf("| (a) same, less its fixed 50 ms sleep | %.2fms |\n", ms(fullMed-sleep))
	fmt.Printf("| (a) in-memory core (state builds + New + cache + both full diffs) | %.2fms |\n", ms(median(core)))
	fmt.Printf("| (b) one endpoint change: ReconcileEndpointSlice | %.2fµs |\n", us(median(observe)))
	fmt.Printf("| (b) one endpoint change: LocationsUpdater.process | %.2fµs |\n", us(median(sync)))
	fmt.Printf("| (b) one endpoint change: total (medians summed) | %.2fµs |\n", us(median(observe)+median(sync)))
	fmt.Printf("| (b) of which the full diff (GetSyncLocationsAddresses) | %.2fµs |\n", us(median(diff)))
	fmt.Printf("GO_RESULT scale=%d shrink=%d startup_full_ms=%.3f startup_nosleep_ms=%.3f startup_core_ms=%.3f observe_us=%.3f sync_us=%.3f total_us=%.3f diff_us=%.3f\n",
		clbScale(), clbShrink(), ms(fullMed), ms(fullMed-sleep), ms(median(core)), us(median(observe)), us(median(sync)),
		us(median(observe)+median(sync)), us(median(diff)))
}

func ms(d time.Duration) float64 { return d.Seconds() * 1e3 }
func us(d time.Duration) float64 { return d.Seconds() * 1e6 }
