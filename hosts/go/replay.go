package clb

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Replay (docs/traces.md, "Replay and the shadow check"): every call of a trace made on a
// component, each result's canonical text compared with the recorded one. Where the document
// leaves a choice open this follows clb-host replay, as the Python host does, so that the
// reports are the same bytes: the recorded side is the line's own text; a resource the replayed
// logic makes where the recording names none is written as 18446744073709551615; a rebuild or
// rollback whose lineage does not re-run, a swap whose export-state traps and a call on a handle
// the replay does not hold are exit 2; rollback lines are not compared; a last line without its
// newline is a truncated trace.

// Exit codes of a replay.
const (
	ExitIdentical  = 0
	ExitDiverged   = 1
	ExitUnreadable = 2
)

// MaxLineBytes bounds a trace line (not counting its newline).
const MaxLineBytes = 64 << 20

const (
	maxExtraRounds = 8
	noHandle       = ^uint64(0)
)

// The commands the extra tracker.complete calls answer with ok; others stay unanswered.
var okAnswered = map[string]bool{
	"emit-event": true, "update-services": true, "update-address-locations": true, "put-load-balancer": true,
	"put-nat-gateway": true, "delete-resource": true, "patch-service-status": true, "set-finalizer": true,
}

// Calls whose result is a step, whose commands are aligned.
var stepCalls = map[string]bool{"tracker.observe": true, "tracker.complete": true, "tracker.tick": true}

// TraceError is a trace that cannot be read or replayed at Line (1-based; 0: no line).
type TraceError struct {
	Line    int
	Message string
}

func (e *TraceError) Error() string { return fmt.Sprintf("%d: %s", e.Line, e.Message) }

// problem is why the current line cannot be replayed (a TraceError at its line).
type problem struct{ msg string }

func (p problem) Error() string { return p.msg }

func problemf(format string, a ...any) problem { return problem{fmt.Sprintf(format, a...)} }

// Divergence is one result that differs.
type Divergence struct {
	Line     int
	Seq      uint64
	Call     string
	Args     string // as recorded
	Recorded string // the recorded result's text, or {"trap":…}
	Replayed string // the replayed result's canonical text (ids aligned), or {"trap":…}
	Kinds    []string
}

// TraceReport is what the replay of one trace found.
type TraceReport struct {
	File        string
	Calls       uint64
	Divergences []*Divergence
}

func trapJSON(text string) string { return `{"trap":` + quote(text) + "}" }

type made struct {
	fn     *Function
	params []any
}

// held is a handle's resource, the instance it lives in, and how to make it again.
type held struct {
	component *Component
	session   *Session
	resource  any
	// The call that made the resource, then every call on it since that did not trap, as this
	// replay made them (aligned ids, extra completes included).
	lineage []made
	// Before a swap: the component and lineage a rollback returns to.
	beforeComponent *Component
	beforeLineage   []made
	ids             map[uint64]uint64 // recorded command id -> the replayed logic's
	missing         map[uint64]bool   // recorded ids the replayed logic did not issue
}

type line struct {
	seq        uint64
	call       string
	args       *JSON
	argsText   string
	result     *JSON
	resultText string
	trap       *string
}

func (l *line) recorded() string {
	if l.trap != nil {
		return trapJSON(*l.trap)
	}
	return l.resultText
}

// recordedHandle is the handle a recorded result names (N, or {"tag":"ok","val":N}).
func (l *line) recordedHandle() (uint64, bool) {
	r := l.result
	if r == nil {
		return 0, false
	}
	if v, ok := r.Uint(); ok {
		return v, true
	}
	if tag := r.Get("tag"); tag != nil && tag.Kind == JSONString && tag.Text == "ok" {
		return r.Get("val").Uint()
	}
	return 0, false
}

func parseLine(text string) (*line, error) {
	j, err := ParseJSON(text)
	if err != nil {
		return nil, problemf("not a trace line: %v", err)
	}
	if j.Kind != JSONObject {
		return nil, problemf("not a trace line: expected an object")
	}
	for _, k := range j.Keys {
		if !slices.Contains([]string{"seq", "call", "args", "result", "trap"}, k) {
			return nil, problemf("not a trace line: unknown field `%s`", k)
		}
	}
	for _, k := range []string{"seq", "call", "args"} {
		if j.Get(k) == nil {
			return nil, problemf("not a trace line: missing field `%s`", k)
		}
	}
	seq, ok := j.Get("seq").Uint()
	if !ok {
		return nil, problemf("not a trace line: `seq` is not a number from 0")
	}
	call := j.Get("call")
	if call.Kind != JSONString {
		return nil, problemf("not a trace line: `call` is not a string")
	}
	l := &line{seq: seq, call: call.Text, args: j.Get("args"), resultText: "null"}
	l.argsText = l.args.raw(text)
	if r := j.Get("result"); r != nil {
		l.result, l.resultText = r, r.raw(text)
	}
	if t := j.Get("trap"); t != nil && t.Kind != JSONNull {
		if t.Kind != JSONString {
			return nil, problemf("not a trace line: `trap` is not a string")
		}
		l.trap = &t.Text
	}
	return l, nil
}

func selfHandle(args *JSON) (uint64, error) {
	h, ok := args.Get("self").Uint()
	if !ok {
		return 0, problemf(`argument "self" (a handle) missing`)
	}
	return h, nil
}

type got struct {
	value any
	trap  *Trap
}

func invoke(s *Session, fn *Function, params []any) (got, error) {
	v, err := s.Call(fn, params)
	var trap *Trap
	var de *DecodeError
	switch {
	case err == nil:
		return got{value: v}, nil
	case errors.As(err, &trap):
		return got{trap: trap}, nil
	case errors.As(err, &de):
		return got{}, problemf("%s: an argument does not fit its type: %v", fn.Call, de)
	}
	return got{}, problem{err.Error()}
}

func newSession(c *Component) (*Session, error) {
	s, err := c.Session()
	if err != nil {
		return nil, problemf("instantiating: %v", err)
	}
	return s, nil
}

// build is a fresh instance of component holding the state lineage builds.
func build(c *Component, lineage []made) (*Session, any, error) {
	if len(lineage) == 0 {
		return nil, nil, problemf("an empty lineage")
	}
	s, err := newSession(c)
	if err != nil {
		return nil, nil, err
	}
	root := lineage[0]
	g, err := invoke(s, root.fn, root.params)
	if err != nil {
		return nil, nil, err
	}
	if g.trap != nil {
		return nil, nil, problemf("rebuilding: %s trapped: %v", root.fn.Call, g.trap)
	}
	resource := root.fn.Result.resourceIn(g.value)
	if resource == nil {
		return nil, nil, problemf("rebuilding: %s made no resource", root.fn.Call)
	}
	for _, m := range lineage[1:] {
		g, err := invoke(s, m.fn, append([]any{resource}, m.params...))
		if err != nil {
			return nil, nil, err
		}
		if g.trap != nil {
			return nil, nil, problemf("rebuilding: %s trapped on a call it took before: %v", m.fn.Call, g.trap)
		}
	}
	return s, resource, nil
}

// replayer replays the lines of one trace.
type replayer struct {
	primary     *Component
	named       map[string]*Component
	schema      *Schema
	held        map[uint64]*held
	pure        *Session
	commandType *Type
}

func newReplayer(primary *Component, named map[string]*Component) *replayer {
	r := &replayer{primary: primary, named: named, schema: primary.Schema, held: map[uint64]*held{}}
	if tick := r.schema.Function("tracker.tick"); tick != nil && tick.Result != nil && tick.Result.Kind == KRecord {
		for _, f := range tick.Result.Fields {
			if f.Name == "commands" && f.Type.Kind == KList && f.Type.Elem.Kind == KRecord {
				for _, g := range f.Type.Elem.Fields {
					if g.Name == "command" {
						r.commandType = g.Type
					}
				}
			}
		}
	}
	return r
}

func (r *replayer) line(l *line) (*Divergence, error) {
	if l.args.Kind != JSONObject {
		return nil, problemf("args: not an object")
	}
	switch l.call {
	case "rebuild":
		h, err := selfHandle(l.args)
		if err != nil {
			return nil, err
		}
		return nil, r.rebuild(h)
	case "swap":
		return r.swap(l)
	case "rollback":
		return nil, r.rollback(l)
	}
	return r.callLine(l)
}

func (r *replayer) encode(g got, fn *Function, handle uint64, hasHandle bool) string {
	if g.trap != nil {
		return trapJSON(g.trap.Error())
	}
	if fn.Result == nil {
		return "null"
	}
	number := noHandle
	if hasHandle {
		number = handle
	}
	text, err := fn.Result.Encode(g.value, func(any) uint64 { return number })
	if err != nil {
		panic(err) // a lifted value always encodes
	}
	return text
}

func (r *replayer) verdict(l *line, g got, recorded, replayed string) *Divergence {
	trapped := g.trap != nil
	if (trapped && l.trap != nil) || recorded == replayed {
		return nil
	}
	kind := l.call
	if trapped != (l.trap != nil) {
		kind = "trap"
	}
	return &Divergence{Seq: l.seq, Call: l.call, Args: l.argsText, Recorded: recorded, Replayed: replayed, Kinds: []string{kind}}
}

func (r *replayer) callLine(l *line) (*Divergence, error) {
	fn := r.schema.Function(l.call)
	if fn == nil {
		return nil, problemf("unknown call %s", quote(l.call))
	}
	for _, k := range l.args.Keys {
		if !slices.ContainsFunc(fn.Params, func(p Param) bool { return p.Name == k }) {
			return nil, problemf("unknown argument %s of %s", quote(k), fn.Call)
		}
	}
	method := fn.MethodOf != ""
	var target uint64
	if method {
		var err error
		if target, err = selfHandle(l.args); err != nil {
			return nil, err
		}
	}
	var params []any
	for _, p := range fn.Params[min(len(fn.Params), btoi(method)):] {
		a := l.args.Get(p.Name)
		if a == nil {
			return nil, problemf("argument %s missing", quote(p.Name))
		}
		v, err := p.Type.FromJSON(a)
		if err != nil {
			return nil, problemf("%s: %v", p.Name, err)
		}
		params = append(params, v)
	}
	recorded := l.recorded()
	recordedHandle, hasHandle := l.recordedHandle()

	if !method {
		// A pure function, or a resource's first call (in an instance of its own).
		root := fn.isRoot()
		var s *Session
		var err error
		if root {
			s, err = newSession(r.primary)
		} else {
			if r.pure == nil {
				r.pure, err = newSession(r.primary)
			}
			s = r.pure
		}
		if err != nil {
			return nil, err
		}
		g, err := invoke(s, fn, params)
		if err != nil {
			return nil, err
		}
		replayed := r.encode(g, fn, recordedHandle, hasHandle)
		kept := false
		if g.trap == nil && root && hasHandle {
			if res := fn.Result.resourceIn(g.value); res != nil {
				if old := r.held[recordedHandle]; old != nil {
					old.session.Close()
				}
				r.held[recordedHandle] = &held{component: r.primary, session: s, resource: res,
					lineage: []made{{fn, params}}, ids: map[uint64]uint64{}, missing: map[uint64]bool{}}
				kept = true
			}
		}
		if g.trap != nil && !root {
			r.pure.Close()
			r.pure = nil
		} else if root && !kept {
			s.Close() // it holds no resource of this replay
		}
		return r.verdict(l, g, recorded, replayed), nil
	}

	h := r.held[target]
	if h == nil {
		return nil, problemf("handle %d does not exist in this replay", target)
	}
	if fn.Call == "tracker.complete" {
		params[1] = mapOutcomeIDs(h, params[1].([]any))
	}
	g, err := invoke(h.session, fn, append([]any{h.resource}, params...))
	if err != nil {
		return nil, err
	}
	if g.trap == nil {
		h.lineage = append(h.lineage, made{fn, params})
	}
	var replayed string
	var kinds []string
	if g.trap == nil && stepCalls[fn.Call] && l.trap == nil && r.commandType != nil {
		var extra []uint64
		replayed, kinds, extra, err = r.align(h, fn, g.value, l)
		if err != nil {
			return nil, err
		}
		if err := r.answerExtra(target, params[0], extra); err != nil {
			return nil, err
		}
	} else {
		replayed = r.encode(g, fn, recordedHandle, hasHandle)
	}
	if g.trap != nil && l.trap == nil {
		// The recording host's logic did not trap here: go on from the state before.
		if err := r.rebuild(target); err != nil {
			return nil, err
		}
	}
	d := r.verdict(l, g, recorded, replayed)
	if d != nil && kinds != nil && !(len(d.Kinds) == 1 && d.Kinds[0] == "trap") {
		d.Kinds = kinds
	}
	return d, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// mapOutcomeIDs turns recorded ids into the replayed logic's, leaving out the outcomes of
// commands it never issued.
func mapOutcomeIDs(h *held, results []any) []any {
	out := make([]any, 0, len(results))
	for _, x := range results {
		pair := x.([]any)
		id := pair[0].(uint64)
		if h.missing[id] {
			continue
		}
		if mapped, ok := h.ids[id]; ok {
			out = append(out, []any{mapped, pair[1]})
		} else {
			out = append(out, pair)
		}
	}
	return out
}

type ourCommand struct {
	id   uint64
	text string
	tag  string
}

func commandsOf(step any) []map[string]any {
	var out []map[string]any
	for _, c := range step.(map[string]any)["commands"].([]any) {
		out = append(out, c.(map[string]any))
	}
	return out
}

// align is the replayed step's canonical text with its matched ids replaced by the recorded
// ones, the summary keys of a difference, and the ids of the commands only the replayed logic
// issued that ok answers.
func (r *replayer) align(h *held, fn *Function, replayed any, l *line) (string, []string, []uint64, error) {
	recordedStep, derr := fn.Result.FromJSON(l.result)
	if derr != nil {
		return "", nil, nil, problemf("recorded result: %v", derr)
	}
	ct := r.commandType
	var ours []ourCommand
	firstUnused := map[string][]int{}
	for j, c := range commandsOf(replayed) {
		text, err := ct.Encode(c["command"], nil)
		if err != nil {
			return "", nil, nil, problem{err.Error()}
		}
		ours = append(ours, ourCommand{c["id"].(uint64), text, c["command"].(Variant).Tag})
		firstUnused[text] = append(firstUnused[text], j)
	}
	used := make([]bool, len(ours))
	toRecorded := map[uint64]uint64{}
	var unmatched []string
	for _, c := range commandsOf(recordedStep) {
		text, err := ct.Encode(c["command"], nil)
		if err != nil {
			return "", nil, nil, problem{err.Error()}
		}
		rid := c["id"].(uint64)
		if q := firstUnused[text]; len(q) > 0 {
			j := q[0]
			firstUnused[text] = q[1:]
			used[j] = true
			toRecorded[ours[j].id] = rid
			h.ids[rid] = ours[j].id
		} else {
			h.missing[rid] = true
			unmatched = append(unmatched, c["command"].(Variant).Tag)
		}
	}
	var extra []uint64
	for j, o := range ours {
		if !used[j] {
			unmatched = append(unmatched, o.tag)
			if okAnswered[o.tag] {
				extra = append(extra, o.id)
			}
		}
	}
	normalized := map[string]any{}
	for k, v := range replayed.(map[string]any) {
		normalized[k] = v
	}
	var cmds []any
	for _, c := range commandsOf(replayed) {
		id := c["id"].(uint64)
		if rid, ok := toRecorded[id]; ok {
			id = rid
		}
		cmds = append(cmds, map[string]any{"id": id, "command": c["command"]})
	}
	if cmds == nil {
		cmds = []any{}
	}
	normalized["commands"] = cmds
	text, err := fn.Result.Encode(normalized, nil)
	if err != nil {
		return "", nil, nil, problem{err.Error()}
	}
	var kinds []string
	for _, k := range unmatched {
		if !slices.Contains(kinds, k) {
			kinds = append(kinds, k)
		}
	}
	if kinds == nil {
		kinds = []string{"step"}
	}
	return text, kinds, extra, nil
}

// answerExtra answers with ok the commands only the replayed logic issued, and what those
// answers make it issue, for at most 8 rounds; nothing of it is compared.
func (r *replayer) answerExtra(handle uint64, now any, ids []uint64) error {
	complete := r.schema.Function("tracker.complete")
	for range maxExtraRounds {
		if len(ids) == 0 {
			return nil
		}
		h := r.held[handle]
		results := make([]any, len(ids))
		for i, id := range ids {
			results[i] = []any{id, Variant{Tag: "ok"}}
		}
		params := []any{now, results, nil}
		g, err := invoke(h.session, complete, append([]any{h.resource}, params...))
		if err != nil {
			return err
		}
		if g.trap != nil {
			return r.rebuild(handle)
		}
		h.lineage = append(h.lineage, made{complete, params})
		ids = nil
		for _, c := range commandsOf(g.value) {
			if okAnswered[c["command"].(Variant).Tag] {
				ids = append(ids, c["id"].(uint64))
			}
		}
	}
	return nil
}

func (r *replayer) rebuild(handle uint64) error {
	h := r.held[handle]
	if h == nil {
		return problemf("rebuild of handle %d, which does not exist", handle)
	}
	s, res, err := build(h.component, h.lineage)
	if err != nil {
		return err
	}
	h.session.Close()
	h.session, h.resource = s, res
	return nil
}

func (r *replayer) swap(l *line) (*Divergence, error) {
	handle, err := selfHandle(l.args)
	if err != nil {
		return nil, err
	}
	name := l.args.Get("component").Get("name")
	if name == nil || name.Kind != JSONString {
		return nil, problemf("swap: component.name missing")
	}
	component := r.named[name.Text]
	if component == nil {
		component = r.primary
	}
	h := r.held[handle]
	if h == nil {
		return nil, problemf("swap of handle %d, which does not exist", handle)
	}
	export, imp := r.schema.Function("tracker.export-state"), r.schema.Function("tracker.import-state")
	if export == nil || imp == nil {
		return nil, problemf("the component lacks tracker.export-state / tracker.import-state")
	}
	g, err := invoke(h.session, export, []any{h.resource})
	if err != nil {
		return nil, err
	}
	if g.trap != nil {
		return nil, problemf("swap: the replayed logic trapped on export-state: %v", g.trap)
	}
	if len(h.lineage) == 0 || len(h.lineage[0].params) == 0 {
		return nil, problemf("swap: no config")
	}
	params := []any{h.lineage[0].params[0], g.value}
	s, err := newSession(component)
	if err != nil {
		return nil, err
	}
	g, err = invoke(s, imp, params)
	if err != nil {
		return nil, err
	}
	newHandle, hasHandle := l.recordedHandle()
	replayed := r.encode(g, imp, newHandle, hasHandle)
	if g.trap == nil && hasHandle {
		if res := imp.Result.resourceIn(g.value); res != nil {
			delete(r.held, handle)
			h.session.Close()
			r.held[newHandle] = &held{component: component, session: s, resource: res, lineage: []made{{imp, params}},
				beforeComponent: h.component, beforeLineage: h.lineage, ids: h.ids, missing: h.missing}
		}
	}
	return r.verdict(l, g, l.recorded(), replayed), nil
}

func (r *replayer) rollback(l *line) error {
	handle, err := selfHandle(l.args)
	if err != nil {
		return err
	}
	newHandle, ok := l.result.Uint()
	if l.trap != nil || !ok || !isDigits(l.resultText) {
		return problemf("rollback: the result must be a handle")
	}
	h := r.held[handle]
	if h == nil {
		return problemf("rollback of handle %d, which does not exist", handle)
	}
	delete(r.held, handle)
	h.session.Close()
	if h.beforeComponent == nil {
		return problemf("rollback of a handle that no swap made")
	}
	lineage := append(slices.Clone(h.beforeLineage), h.lineage[1:]...)
	s, res, err := build(h.beforeComponent, lineage)
	if err != nil {
		return err
	}
	r.held[newHandle] = &held{component: h.beforeComponent, session: s, resource: res, lineage: lineage, ids: h.ids, missing: h.missing}
	return nil
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// ReplayFile replays the trace at path; allDivergences goes on past the first divergence.
// The error is a *TraceError.
func ReplayFile(path string, primary *Component, named map[string]*Component, allDivergences bool) (*TraceReport, error) {
	report := &TraceReport{File: path}
	f, err := os.Open(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, &TraceError{0, "cannot read: " + errText(err)}
	}
	defer f.Close()
	reader := bufio.NewReaderSize(f, 1<<16)
	lineno := 0
	next := func() (string, bool, error) {
		lineno++
		var buf []byte
		for {
			chunk, err := reader.ReadSlice('\n')
			if len(buf)+len(chunk) > MaxLineBytes+1 {
				return "", false, &TraceError{lineno, fmt.Sprintf("a line over %d bytes", MaxLineBytes)}
			}
			buf = append(buf, chunk...)
			if errors.Is(err, bufio.ErrBufferFull) {
				continue
			}
			if err == io.EOF {
				if len(buf) == 0 {
					return "", false, nil
				}
				if len(buf) > MaxLineBytes {
					return "", false, &TraceError{lineno, fmt.Sprintf("a line over %d bytes", MaxLineBytes)}
				}
				return "", false, &TraceError{lineno, "the last line has no newline: the trace is truncated"}
			}
			if err != nil {
				return "", false, &TraceError{lineno, "cannot read: " + errText(err)}
			}
			text := buf[:len(buf)-1]
			if !utf8.Valid(text) {
				return "", false, &TraceError{lineno, "not UTF-8"}
			}
			return string(text), true, nil
		}
	}
	first, ok, err := next()
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, &TraceError{1, "empty: no header"}
	}
	header, err := ParseJSON(first)
	if err != nil {
		return nil, &TraceError{1, "not a trace header: " + err.Error()}
	}
	format, version := header.Get("format"), header.Get("version")
	v, vok := version.Uint()
	if format == nil || format.Kind != JSONString || !vok || v >= 1<<32 {
		return nil, &TraceError{1, "not a trace header: `format` (a string) and `version` (a number) are required"}
	}
	if format.Text != "clb-trace" || v != 1 {
		return nil, &TraceError{1, fmt.Sprintf("format %s version %d; this host reads clb-trace version 1", quote(format.Text), v)}
	}
	r := newReplayer(primary, named)
	defer r.close()
	for {
		text, ok, err := next()
		if err != nil {
			return nil, err
		}
		if !ok {
			return report, nil
		}
		l, err := parseLine(text)
		if err == nil && l.seq != report.Calls {
			err = problemf("seq %d where %d was due", l.seq, report.Calls)
		}
		var d *Divergence
		if err == nil {
			report.Calls++
			d, err = r.line(l)
		}
		if err != nil {
			return nil, &TraceError{lineno, err.Error()}
		}
		if d != nil {
			d.Line = lineno
			report.Divergences = append(report.Divergences, d)
			if !allDivergences {
				return report, nil
			}
		}
	}
}

func (r *replayer) close() {
	// Instances are garbage once the replay ends; closing them frees their memory at once.
	for _, h := range r.held {
		h.session.Close()
	}
	if r.pure != nil {
		r.pure.Close()
	}
}

func errText(err error) string {
	s := err.Error()
	if s == "" {
		return "unknown error"
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func byKind(reports []*TraceReport) ([]string, map[string]int) {
	counts := map[string]int{}
	for _, r := range reports {
		for _, d := range r.Divergences {
			for _, k := range d.Kinds {
				counts[k]++
			}
		}
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	slices.Sort(keys) // byte order
	return keys, counts
}

// TextReport is the report clb-host replay prints.
func TextReport(reports []*TraceReport, allDivergences bool) string {
	var b strings.Builder
	for _, r := range reports {
		for _, d := range r.Divergences {
			fmt.Fprintf(&b, "%s:%d: seq %d: %s differs\n", r.File, d.Line, d.Seq, d.Call)
			fmt.Fprintf(&b, "  args: %s\n", d.Args)
			fmt.Fprintf(&b, "  recorded: %s\n", d.Recorded)
			fmt.Fprintf(&b, "  replayed: %s\n", d.Replayed)
		}
		if len(r.Divergences) > 0 {
			fmt.Fprintf(&b, "%s: %d calls, %d divergences\n", r.File, r.Calls, len(r.Divergences))
		} else {
			fmt.Fprintf(&b, "%s: %d calls, identical\n", r.File, r.Calls)
		}
	}
	if allDivergences {
		keys, counts := byKind(reports)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = k + "=" + strconv.Itoa(counts[k])
		}
		b.WriteString("by kind: " + strings.Join(parts, ", ") + "\n")
	}
	return b.String()
}

// JSONReport is the report of clb-host replay --json: one JSON object, keys in the documented
// order; args and recorded are the trace's texts, replayed the canonical text.
func JSONReport(reports []*TraceReport, allDivergences bool) string {
	var b bytes.Buffer
	b.WriteString(`{"traces":[`)
	identical := true
	for i, r := range reports {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"file":%s,"calls":%d,"divergences":[`, quote(r.File), r.Calls)
		for j, d := range r.Divergences {
			if j > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"line":%d,"seq":%d,"call":%s,"args":%s,"recorded":%s,"replayed":%s}`,
				d.Line, d.Seq, quote(d.Call), d.Args, d.Recorded, d.Replayed)
		}
		b.WriteString("]}")
		identical = identical && len(r.Divergences) == 0
	}
	fmt.Fprintf(&b, `],"identical":%t`, identical)
	if allDivergences {
		keys, counts := byKind(reports)
		b.WriteString(`,"by-kind":{`)
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%s:%d", quote(k), counts[k])
		}
		b.WriteByte('}')
	}
	b.WriteByte('}')
	return b.String()
}
