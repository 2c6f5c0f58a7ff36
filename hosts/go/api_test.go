package clb

import (
	"errors"
	"os"
	"path/filepath"
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
	if c.Package != "clb:reconciler@0.8.0" {
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
