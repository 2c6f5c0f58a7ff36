package clb

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// The components come from the environment (the test suite sets them; see README.md):
// CLB_COMPONENT the built-in logic, CLB_NEXT_COMPONENT the next guest.
func component(t *testing.T, env string) *Component {
	t.Helper()
	path := os.Getenv(env)
	if path == "" {
		t.Skipf("%s is not set", env)
	}
	c, err := LoadFile(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func config() map[string]any {
	return map[string]any{"backend-pool-type": "podIP", "load-balancer-sku": "standardV2",
		"multiple-standard-load-balancers": []any{}, "write-budgets": nil}
}

func TestATrackerAnswersItsFirstObservationWithAReadOfNRP(t *testing.T) {
	c := component(t, "CLB_COMPONENT")
	if c.Package != "clb:reconciler@0.14.0" {
		t.Errorf("package %q", c.Package)
	}
	mode, err := c.ValidateConfig(config())
	if err != nil || mode.Tag != "ok" {
		t.Fatalf("%v %v", mode, err)
	}
	tracker, err := CreateTracker(c, config())
	if err != nil {
		t.Fatal(err)
	}
	defer tracker.Close()
	step, err := tracker.Observe(0, []any{Variant{Tag: "lists-complete"}})
	if err != nil {
		t.Fatal(err)
	}
	text, err := c.Encode("tracker.observe", step)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(text, `{"commands":[{"id":"0","command":{"tag":"read-nrp"}}]`) {
		t.Errorf("got %s", text)
	}
	state, err := tracker.ExportState()
	if err != nil {
		t.Fatal(err)
	}
	version, err := tracker.StateVersion()
	if err != nil || uint64(version) != state["version"].(uint64) {
		t.Errorf("state-version %d, exported %v (%v)", version, state["version"], err)
	}
	again, err := ImportTracker(c, config(), state)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := again.Tick(1000); err != nil {
		t.Fatal(err)
	}
}

func TestARefusedConfigAndABadArgumentAreGoErrors(t *testing.T) {
	c := component(t, "CLB_COMPONENT")
	bad := config()
	bad["load-balancer-sku"] = "basic"
	_, err := CreateTracker(c, bad)
	var refused *Refused
	if !errors.As(err, &refused) || refused.Call != "tracker.create" {
		t.Fatalf("got %v", err)
	}
	if !strings.HasPrefix(err.Error(), "`tracker.create` refused: {\"field\":") {
		t.Errorf("%v", err)
	}
	if refused.Value.(map[string]any)["field"] == nil {
		t.Errorf("the config-error record: %v", refused.Value)
	}
	delete(bad, "write-budgets")
	_, err = c.ValidateConfig(bad)
	var de *DecodeError
	if !errors.As(err, &de) || !strings.Contains(err.Error(), "write-budgets") {
		t.Fatalf("got %v", err)
	}
	_, err = ImportTracker(c, config(), map[string]any{"version": 1, "payload": []byte("garbage")})
	if !errors.As(err, &refused) || refused.Call != "tracker.import-state" {
		t.Fatalf("got %v", err)
	}
}

func TestAPoolQueueQueuesAndDrains(t *testing.T) {
	c := component(t, "CLB_COMPONENT")
	q, err := CreatePoolQueue(c, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	op := map[string]any{"service": "shop/web", "load-balancer": "lb1", "pool": "shop-web", "kind": "add", "node-ips": []any{"10.0.0.4"}}
	if err := q.Enqueue([]any{op}); err != nil {
		t.Fatal(err)
	}
	status, err := q.Status(0)
	if err != nil || status["queued"].(uint64) != 1 || status["ready"] != true {
		t.Fatalf("%v %v", status, err)
	}
	groups, err := q.DrainAndGroup(0, []any{map[string]any{"service": "shop/web", "load-balancer": "lb1"}})
	if err != nil || len(groups) != 1 {
		t.Fatalf("%v %v", groups, err)
	}
	id := groups[0].(map[string]any)["id"].(uint64)
	report, err := q.Report(0, id, Variant{Tag: "updated"})
	if err != nil || report["disposition"] != "done" {
		t.Fatalf("%v %v", report, err)
	}
	if report, err := q.Report(0, id, Variant{Tag: "updated"}); err != nil || report != nil {
		t.Fatalf("a group reported twice: %v %v", report, err)
	}
	n, err := q.RemoveOperations("shop/web")
	if err != nil || n != 0 {
		t.Fatalf("%d %v", n, err)
	}
}

func TestATrackerSwapsToTheNextGuest(t *testing.T) {
	c, next := component(t, "CLB_COMPONENT"), component(t, "CLB_NEXT_COMPONENT")
	tracker, err := CreateTracker(c, config())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tracker.Observe(0, []any{Variant{Tag: "lists-complete"}}); err != nil {
		t.Fatal(err)
	}
	swapped, err := tracker.Swap(next)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := swapped.Tick(1); err != nil {
		t.Fatal(err)
	}
}

// recording calls a tracker and writes each call as a trace line (docs/traces.md), so that the
// replay of what the calls did can be checked.
type recording struct {
	t       *testing.T
	c       *Component
	tracker *Tracker
	lines   []string
}

func newRecording(t *testing.T, c *Component) *recording {
	t.Helper()
	tracker, err := CreateTracker(c, config())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tracker.Close() })
	header := fmt.Sprintf(`{"format":"clb-trace","version":1,"host":"test","component":{"package":%q,"sha256":%q},"source":"test"}`, c.Package, c.SHA256)
	r := &recording{t: t, c: c, tracker: tracker, lines: []string{header}}
	text, err := c.Schema.Function("tracker.create").Params[0].Type.Encode(config(), nil)
	if err != nil {
		t.Fatal(err)
	}
	r.lines = append(r.lines, `{"seq":0,"call":"tracker.create","args":{"config":`+text+`},"result":{"tag":"ok","val":0}}`)
	return r
}

// do makes the call on the tracker with args (after self, in WIT order) and records it.
func (r *recording) do(call string, args ...any) any {
	r.t.Helper()
	v, err := r.tracker.call(call, args...)
	if err != nil {
		r.t.Fatal(err)
	}
	parts := []string{`"self":0`}
	for i, p := range r.c.Schema.Function(call).Params[1:] {
		text, err := p.Type.Encode(args[i], nil)
		if err != nil {
			r.t.Fatal(err)
		}
		parts = append(parts, fmt.Sprintf("%q:%s", p.Name, text))
	}
	result, err := r.c.Encode(call, v)
	if err != nil {
		r.t.Fatal(err)
	}
	r.lines = append(r.lines, fmt.Sprintf(`{"seq":%d,"call":%q,"args":{%s},"result":%s}`, len(r.lines)-1, call, strings.Join(parts, ","), result))
	return v
}

const uid = "6a1f0c8e-2b3d-4e5f-8a9b-0c1d2e3f4a01"

// startedWithAServiceBeingCreated is start-up (lists complete, NRP and ARM read) with one
// Service and its endpoints, up to the first write of its creation: the flow of the golden
// trace a-first-service-with-endpoints-….
func startedWithAServiceBeingCreated(t *testing.T, c *Component) *recording {
	r := newRecording(t, c)
	service := map[string]any{"uid": uid, "namespace": "shop", "name": "web", "service-type": "LoadBalancer",
		"external-traffic-policy": "Local", "session-affinity": nil, "load-balancer-ip": nil, "load-balancer-class": nil,
		"ip-families": []any{}, "ports": []any{map[string]any{"name": "http", "protocol": "TCP", "port": 80,
			"target-port": Variant{Tag: "number", Val: 8080}, "node-port": nil}},
		"annotations": []any{}, "finalizers": []any{}, "deleting": false, "ingress-ips": []any{}, "labels": []any{}}
	slice := map[string]any{"namespace": "shop", "name": "web-abc12", "owner-service-uid": uid, "address-type": "IPv4",
		"endpoints": []any{map[string]any{"addresses": []any{"10.244.1.10"}, "node-name": "aks-node-1", "ready": true}},
		"deleting":  false}
	node := map[string]any{"name": "aks-node-1", "internal-ips": []any{"10.224.0.4"}}
	r.do("tracker.observe", 1000, []any{Variant{Tag: "lists-complete"}})
	r.do("tracker.observe", 1000, []any{Variant{Tag: "node-upserted", Val: node},
		Variant{Tag: "service-upserted", Val: service}, Variant{Tag: "slice-upserted", Val: slice}})
	nrp := map[string]any{"services": []any{}, "locations": []any{}}
	r.do("tracker.complete", 1100, []any{[]any{0, Variant{Tag: "nrp-snapshot", Val: nrp}}}, nil)
	arm := map[string]any{"public-ips": []any{}, "load-balancers": []any{}, "nat-gateways": []any{}}
	r.do("tracker.complete", 1200, []any{[]any{1, Variant{Tag: "arm-inventory", Val: arm}}}, nil)
	r.do("tracker.complete", 1300, []any{[]any{2, Variant{Tag: "ok"}}}, nil)
	return r
}

// answerThePublicIP is the call after the stats: the answer to the public IP the creation asked for.
func answerThePublicIP(r *recording) map[string]any {
	return r.do("tracker.complete", 1500, []any{[]any{3, Variant{Tag: "public-ip-address", Val: "20.1.2.3"}}}, nil).(map[string]any)
}

func TestStatsShowsAServiceBeingCreatedAsPendingInboundAmongAllTwelveStatesAndTheThreeBudgets(t *testing.T) {
	c := component(t, "CLB_COMPONENT")
	stats, err := startedWithAServiceBeingCreated(t, c).tracker.Stats(1400)
	if err != nil {
		t.Fatal(err)
	}
	if !stats.ServiceGatewayEnabled {
		t.Error("service-gateway-enabled is false")
	}
	if len(stats.Pending) != 12 {
		t.Fatalf("%d pending entries: %+v", len(stats.Pending), stats.Pending)
	}
	var keys, want []string
	var nonZero []PendingOperations
	for _, p := range stats.Pending {
		keys = append(keys, string(p.State)+"/"+string(p.ServiceType))
		if p.Count != 0 {
			nonZero = append(nonZero, p)
		}
	}
	for _, s := range []OperationState{OperationStateNotStarted, OperationStateCreationInProgress, OperationStateCreated,
		OperationStateDeletionPending, OperationStateDeletionInProgress, OperationStateUpdateInProgress} {
		for _, side := range []ServiceType{ServiceTypeInbound, ServiceTypeOutbound} {
			want = append(want, string(s)+"/"+string(side))
		}
	}
	slices.Sort(keys)
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		t.Errorf("states %v", keys)
	}
	began := uint64(1000)
	creating := []PendingOperations{{OperationStateCreationInProgress, ServiceTypeInbound, 1, &began}}
	if !reflect.DeepEqual(nonZero, creating) {
		t.Errorf("pending %+v", nonZero)
	}
	if stats.K8sServices != 1 {
		t.Errorf("k8s-services %d", stats.K8sServices)
	}
	var buckets []string
	for _, b := range stats.Budgets {
		buckets = append(buckets, b.Bucket)
		if b.PerMinute == 0 {
			t.Errorf("budget %+v", b)
		}
	}
	if !slices.Equal(buckets, []string{"update-address-locations", "update-services", "arm-writes"}) {
		t.Errorf("budgets %v", buckets)
	}
}

func TestStatsReadsOnlyTwiceTheSameAnswerAndTheNextStepAsWithoutIt(t *testing.T) {
	c := component(t, "CLB_COMPONENT")
	asked, unasked := startedWithAServiceBeingCreated(t, c), startedWithAServiceBeingCreated(t, c)
	first, err := asked.tracker.Stats(1400)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := asked.tracker.Stats(1400); err != nil || !reflect.DeepEqual(again, first) {
		t.Fatalf("%+v then %+v (%v)", first, again, err)
	}
	after := answerThePublicIP(asked)
	if without := answerThePublicIP(unasked); !reflect.DeepEqual(after, without) {
		t.Errorf("after stats %v, without %v", after, without)
	}
	if len(after["commands"].([]any)) == 0 {
		t.Error("the next step does nothing, so a change would not show")
	}
	state, _ := asked.tracker.ExportState()
	if without, _ := unasked.tracker.ExportState(); !reflect.DeepEqual(state, without) {
		t.Error("the states differ")
	}
}

func goldenTraces(t *testing.T) []string {
	traces, _ := filepath.Glob("../../tests/traces/*.jsonl")
	if len(traces) == 0 {
		t.Skip("no golden traces (not in a checkout)")
	}
	return traces
}

func TestEveryGoldenTraceReplaysIdentically(t *testing.T) {
	c, next := component(t, "CLB_COMPONENT"), component(t, "CLB_NEXT_COMPONENT")
	named := map[string]*Component{"next-guest": next}
	var reports []*TraceReport
	for _, path := range goldenTraces(t) {
		r, err := ReplayFile(path, c, named, false)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		reports = append(reports, r)
	}
	text := TextReport(reports, false)
	if strings.Count(text, "calls, identical\n") != len(reports) {
		t.Fatal(text)
	}
}

func TestAChangedResultDivergesAtItsSeqAndATruncatedTraceIsUnreadable(t *testing.T) {
	c := component(t, "CLB_COMPONENT")
	var source string
	for _, p := range goldenTraces(t) {
		if strings.Contains(p, "a-first-service") {
			source = p
		}
	}
	data, err := os.ReadFile(source)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	changed := -1
	for i, l := range lines {
		if strings.Contains(l, `"call":"tracker.complete"`) && strings.HasSuffix(l, `,"idle":false}}`) {
			lines[i] = strings.TrimSuffix(l, `,"idle":false}}`) + `,"idle":true}}`
			changed = i
			break
		}
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "changed.jsonl")
	os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o644)
	r, err := ReplayFile(path, c, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Divergences) != 1 || r.Divergences[0].Line != changed+1 || r.Divergences[0].Seq != uint64(changed-1) {
		t.Fatalf("%s", TextReport([]*TraceReport{r}, false))
	}
	if !strings.HasPrefix(JSONReport([]*TraceReport{r}, true), `{"traces":[{"file":`) {
		t.Error(JSONReport([]*TraceReport{r}, true))
	}
	truncated := filepath.Join(dir, "truncated.jsonl")
	os.WriteFile(truncated, data[:len(data)-10], 0o644)
	_, err = ReplayFile(truncated, c, nil, false)
	var te *TraceError
	if !errors.As(err, &te) || te.Line != strings.Count(string(data), "\n") || !strings.Contains(te.Message, "truncated") {
		t.Fatalf("got %v", err)
	}
}

func TestACallPastItsDeadlineIsATrap(t *testing.T) {
	path := os.Getenv("CLB_COMPONENT")
	if path == "" {
		t.Skip("CLB_COMPONENT is not set")
	}
	c, err := LoadFile(path, Options{Limits: Limits{Deadline: time.Nanosecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = CreateTracker(c, config())
	var trap *Trap
	if !errors.As(err, &trap) || trap.Kind != "deadline" {
		t.Fatalf("got %v", err)
	}
}

func TestAnAllocationPastTheMemoryCapIsATrap(t *testing.T) {
	path := os.Getenv("CLB_COMPONENT")
	if path == "" {
		t.Skip("CLB_COMPONENT is not set")
	}
	c, err := LoadFile(path, Options{Limits: Limits{MemoryMiB: 4}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = ImportTracker(c, config(), map[string]any{"version": 7, "payload": make([]byte, 8<<20)})
	var trap *Trap
	if !errors.As(err, &trap) || trap.Kind != "trap" {
		t.Fatalf("got %v", err)
	}
}

func TestNotAComponentIsALoadError(t *testing.T) {
	for _, wasm := range [][]byte{nil, []byte("\x00asm\x01\x00\x00\x00"), []byte("\x00asm\x0d\x00\x01\x00")} {
		_, err := Load("x.wasm", wasm, Options{})
		var le *LoadError
		if !errors.As(err, &le) || !strings.HasPrefix(err.Error(), "x.wasm: ") {
			t.Errorf("%q: got %v", wasm, err)
		}
	}
}
