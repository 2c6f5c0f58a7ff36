package clb

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Each way a trace cannot be read or replayed is exit 2 at its line, as clb-host replay has it.
func TestAnUnreadableTraceIsATraceErrorAtItsLine(t *testing.T) {
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
	lines := strings.SplitAfter(string(data), "\n")
	lines = lines[:len(lines)-1]
	with := func(i int, edit func(string) string) string {
		out := append([]string(nil), lines...)
		out[i] = edit(strings.TrimSuffix(out[i], "\n")) + "\n"
		return strings.Join(out, "")
	}
	cases := []struct {
		name, text string
		line       int
		want       string
	}{
		{"empty", "", 1, "empty: no header"},
		{"header", with(0, func(string) string { return `{"format":"x","version":1}` }), 1, `format "x" version 1`},
		{"seq", with(3, func(l string) string { return strings.Replace(l, `"seq":2`, `"seq":5`, 1) }), 4, "seq 5 where 2 was due"},
		{"call", with(3, func(l string) string { return strings.Replace(l, `"call":"`, `"call":"zz`, 1) }), 4, "unknown call"},
		{"argument", with(3, func(l string) string { return strings.Replace(l, `"now-ms":"`, `"now-ms":"x`, 1) }), 4, "now-ms: "},
		{"field", with(3, func(l string) string { return l[:len(l)-1] + `,"extra":1}` }), 4, "unknown field `extra`"},
		{"duplicate", with(3, func(l string) string { return l[:len(l)-1] + `,"seq":2}` }), 4, "duplicate key"},
		{"utf-8", with(3, func(l string) string { return l + "\xff" }), 4, "not UTF-8"},
		{"handle", with(3, func(l string) string { return strings.Replace(l, `"self":0`, `"self":9`, 1) }), 4, "handle 9 does not exist"},
		{"json", with(3, func(string) string { return "{" }), 4, "not a trace line"},
	}
	dir := t.TempDir()
	for _, tc := range cases {
		path := filepath.Join(dir, tc.name+".jsonl")
		os.WriteFile(path, []byte(tc.text), 0o644)
		_, err := ReplayFile(path, c, nil, false)
		var te *TraceError
		if !errors.As(err, &te) || te.Line != tc.line || !strings.Contains(te.Message, tc.want) {
			t.Errorf("%s: got %v, want line %d: …%s…", tc.name, err, tc.line, tc.want)
		}
	}
	_, err = ReplayFile(filepath.Join(dir, "absent.jsonl"), c, nil, false)
	var te *TraceError
	if !errors.As(err, &te) || te.Line != 0 || !strings.Contains(te.Message, "cannot read") {
		t.Errorf("absent: got %v", err)
	}
}

func TestTheReportsAreClbHostsFormat(t *testing.T) {
	reports := []*TraceReport{
		{File: "a.jsonl", Calls: 3},
		{File: "b.jsonl", Calls: 7, Divergences: []*Divergence{{Line: 4, Seq: 2, Call: "tracker.tick", Args: `{"self":0,"now-ms":"5"}`,
			Recorded: `{"trap":"x"}`, Replayed: `{"commands":[],"wake-at-ms":null,"idle":true}`, Kinds: []string{"trap"}}}},
	}
	text := TextReport(reports, true)
	want := "a.jsonl: 3 calls, identical\n" +
		"b.jsonl:4: seq 2: tracker.tick differs\n" +
		"  args: {\"self\":0,\"now-ms\":\"5\"}\n" +
		"  recorded: {\"trap\":\"x\"}\n" +
		"  replayed: {\"commands\":[],\"wake-at-ms\":null,\"idle\":true}\n" +
		"b.jsonl: 7 calls, 1 divergences\n" +
		"by kind: trap=1\n"
	if text != want {
		t.Errorf("got\n%s\nwant\n%s", text, want)
	}
	j := JSONReport(reports, true)
	wantJSON := `{"traces":[{"file":"a.jsonl","calls":3,"divergences":[]},{"file":"b.jsonl","calls":7,"divergences":[` +
		`{"line":4,"seq":2,"call":"tracker.tick","args":{"self":0,"now-ms":"5"},"recorded":{"trap":"x"},` +
		`"replayed":{"commands":[],"wake-at-ms":null,"idle":true}}]}],"identical":false,"by-kind":{"trap":1}}`
	if j != wantJSON {
		t.Errorf("got\n%s\nwant\n%s", j, wantJSON)
	}
}

func TestATraceWithStatsCallsReplaysIdenticallyAndAChangedStatsResultDiverges(t *testing.T) {
	c := component(t, "CLB_COMPONENT")
	r := startedWithAServiceBeingCreated(t, c)
	r.do("tracker.stats", 1400)
	r.do("tracker.stats", 1400)
	answerThePublicIP(r)
	at := slices.IndexFunc(r.lines, func(l string) bool { return strings.Contains(l, `"call":"tracker.stats"`) })
	if at < 0 || !strings.Contains(r.lines[at], `"k8s-services":1,`) {
		t.Fatal(r.lines[at])
	}
	path := filepath.Join(t.TempDir(), "stats.jsonl")
	os.WriteFile(path, []byte(strings.Join(r.lines, "\n")+"\n"), 0o644)
	report, err := ReplayFile(path, c, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	if report.Calls != uint64(len(r.lines)-1) || len(report.Divergences) != 0 {
		t.Fatal(TextReport([]*TraceReport{report}, true))
	}
	r.lines[at] = strings.Replace(r.lines[at], `"k8s-services":1,`, `"k8s-services":2,`, 1)
	os.WriteFile(path, []byte(strings.Join(r.lines, "\n")+"\n"), 0o644)
	if report, err = ReplayFile(path, c, nil, true); err != nil {
		t.Fatal(err)
	}
	if len(report.Divergences) != 1 || report.Divergences[0].Seq != uint64(at-1) || report.Divergences[0].Call != "tracker.stats" {
		t.Fatal(TextReport([]*TraceReport{report}, true))
	}
}
