// Command bench measures what calls cost through the Go host, on the workload of the Python
// host's bench (hosts/python/bench.py), so the hosts' figures compare:
//
//	bench COMPONENT [N]
//
// It prints the load (compile) time of the component, then the median and mean per-call time
// of `admit-service` and of one `tracker.observe` carrying one EndpointSlice change on a small
// settled tracker (3 nodes, 2 Services, 2 slices); each step's commands are answered outside
// the timed call. N calls each (default 2000).
package main

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"time"

	clb "clb-reconciler/hosts/go"
)

var config = map[string]any{"backend-pool-type": "podIP", "load-balancer-sku": "standardV2",
	"multiple-standard-load-balancers": []any{}, "write-budgets": nil}

func service(i int) map[string]any {
	return map[string]any{
		"uid": fmt.Sprintf("6a1f0c8e-2b3d-4e5f-8a9b-0c1d2e3f4a0%d", i), "namespace": "shop",
		"name": fmt.Sprintf("web%d", i), "service-type": "LoadBalancer", "external-traffic-policy": "Local",
		"session-affinity": nil, "load-balancer-ip": nil, "load-balancer-class": nil, "ip-families": []any{},
		"ports": []any{map[string]any{"name": nil, "protocol": "TCP", "port": 80,
			"target-port": clb.Variant{Tag: "number", Val: 8080}, "node-port": nil}},
		"annotations": []any{}, "finalizers": []any{}, "deleting": false, "ingress-ips": []any{}, "labels": []any{},
	}
}

func endpointSlice(i int, ips []string) map[string]any {
	endpoints := make([]any, len(ips))
	for k, ip := range ips {
		endpoints[k] = map[string]any{"addresses": []any{ip}, "node-name": fmt.Sprintf("node-%d", k%3), "ready": nil}
	}
	return map[string]any{"namespace": "shop", "name": fmt.Sprintf("web%d-abc", i),
		"owner-service-uid": service(i)["uid"], "address-type": "IPv4", "endpoints": endpoints, "deleting": false}
}

// answer gives every command of a step the answer an empty, obliging NRP would.
func answer(step map[string]any) []any {
	var out []any
	for _, c := range step["commands"].([]any) {
		c := c.(map[string]any)
		var result clb.Variant
		switch c["command"].(clb.Variant).Tag {
		case "read-nrp":
			result = clb.Variant{Tag: "nrp-snapshot", Val: map[string]any{"services": []any{}, "locations": []any{}}}
		case "read-arm":
			result = clb.Variant{Tag: "arm-inventory", Val: map[string]any{"public-ips": []any{}, "load-balancers": []any{}, "nat-gateways": []any{}}}
		case "put-public-ip":
			result = clb.Variant{Tag: "public-ip-address", Val: "20.0.0.1"}
		default:
			result = clb.Variant{Tag: "ok"}
		}
		out = append(out, []any{c["id"], result})
	}
	return out
}

func settle(tracker *clb.Tracker, now uint64, step map[string]any) {
	for range 50 {
		if len(step["commands"].([]any)) == 0 {
			return
		}
		step = must(tracker.Complete(now, answer(step)))
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	return v
}

func report(name string, samples []time.Duration) {
	slices.Sort(samples)
	var sum time.Duration
	for _, s := range samples {
		sum += s
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	fmt.Printf("%s: median %.1f us, mean %.1f us, n=%d\n", name, us(samples[len(samples)/2]), us(sum/time.Duration(len(samples))), len(samples))
}

func main() {
	if len(os.Args) < 2 || len(os.Args) > 3 {
		fmt.Fprintln(os.Stderr, "usage: bench COMPONENT [N]")
		os.Exit(2)
	}
	n := 2000
	if len(os.Args) == 3 {
		var err error
		if n, err = strconv.Atoi(os.Args[2]); err != nil || n < 1 {
			fmt.Fprintln(os.Stderr, "bench: N must be a positive number")
			os.Exit(2)
		}
	}
	started := time.Now()
	component := must(clb.LoadFile(os.Args[1], clb.Options{}))
	fmt.Printf("load (compile): %.0f ms\n", float64(time.Since(started).Microseconds())/1e3)

	svc := service(1)
	must(component.AdmitService(config, svc)) // instantiates the pure functions' instance
	samples := make([]time.Duration, n)
	for i := range samples {
		t := time.Now()
		must(component.AdmitService(config, svc))
		samples[i] = time.Since(t)
	}
	report("admit-service", samples)

	tracker := must(clb.CreateTracker(component, config))
	var batch []any
	for k := range 3 {
		batch = append(batch, clb.Variant{Tag: "node-upserted", Val: map[string]any{
			"name": fmt.Sprintf("node-%d", k), "internal-ips": []any{fmt.Sprintf("10.224.0.%d", 4+k)}}})
	}
	for _, i := range []int{1, 2} {
		batch = append(batch, clb.Variant{Tag: "service-upserted", Val: service(i)})
	}
	for _, i := range []int{1, 2} {
		batch = append(batch, clb.Variant{Tag: "slice-upserted", Val: endpointSlice(i,
			[]string{fmt.Sprintf("10.244.%d.1", i), fmt.Sprintf("10.244.%d.2", i), fmt.Sprintf("10.244.%d.3", i)})})
	}
	batch = append(batch, clb.Variant{Tag: "lists-complete"})
	const now = 0
	settle(tracker, now, must(tracker.Observe(now, batch)))
	var last map[string]any
	for i := range samples {
		ips := []string{fmt.Sprintf("10.244.1.%d", 1+(i+1)%50), "10.244.1.2", "10.244.1.3"}
		change := []any{clb.Variant{Tag: "slice-upserted", Val: endpointSlice(1, ips)}}
		t := time.Now()
		last = must(tracker.Observe(now, change))
		samples[i] = time.Since(t)
		settle(tracker, now, last)
	}
	report("tracker.observe (one EndpointSlice change)", samples)
	var tags []string
	for _, c := range last["commands"].([]any) {
		tags = append(tags, c.(map[string]any)["command"].(clb.Variant).Tag)
	}
	fmt.Printf("last step: %d command(s): %v\n", len(tags), tags)
}
