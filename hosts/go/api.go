// Package clb runs the CLB reconciler's WebAssembly component in Go, without cgo: wazero runs
// the component's core module, and this package does what a component-model runtime would —
// the canonical ABI's lifting and lowering, driven by the schema
// (hosts/schema/clb-reconciler.json), the handles of the guest's resources, and the
// `diagnostics` imports.
//
// Values go in and come out in the shapes documented on Variant: records are map[string]any
// with every field (kebab-case keys), variants and results are Variant, u64 is uint64. Inputs
// are checked against the schema before the guest sees them (a *DecodeError).
//
// Each Tracker and PoolQueue lives in its own instance, so a trap (a *Trap) costs only that one;
// the pure functions run in another instance, which is replaced after a trap.
package clb

import (
	"fmt"
	"reflect"
)

// Refused is the logic's `err` answer to a constructor: Value is the error value (a
// config-error record for tracker.create, a state-error variant for tracker.import-state).
type Refused struct {
	Call  string
	Value any
	text  string // Value's canonical text
}

func (e *Refused) Error() string { return fmt.Sprintf("`%s` refused: %s", e.Call, e.text) }

func (c *Component) function(call string) (*Function, error) {
	fn := c.Schema.Function(call)
	if fn == nil {
		return nil, fmt.Errorf("the schema has no function `%s`", call)
	}
	return fn, nil
}

// callPure calls a pure function in the instance of the pure functions.
func (c *Component) callPure(call string, args ...any) (any, error) {
	fn, err := c.function(call)
	if err != nil {
		return nil, err
	}
	if c.pure == nil || c.pure.Poisoned() {
		if c.pure != nil {
			c.pure.Close()
		}
		if c.pure, err = c.Session(); err != nil {
			return nil, err
		}
	}
	return c.pure.Call(fn, args)
}

// ValidateConfig is `validate-config`: Variant{"ok", mode} or Variant{"err", config-error}.
func (c *Component) ValidateConfig(config map[string]any) (Variant, error) {
	v, err := c.callPure("validate-config", config)
	if err != nil {
		return Variant{}, err
	}
	return v.(Variant), nil
}

// AdmitService is `admit-service`: the admission, a record of the verdict
// (`"verdict"`: Variant{"admitted", nil}, …) and the warnings (`"warnings"`: []any of strings).
func (c *Component) AdmitService(config, service map[string]any) (map[string]any, error) {
	v, err := c.callPure("admit-service", config, service)
	if err != nil {
		return nil, err
	}
	return v.(map[string]any), nil
}

// PlaceService is `place-service` (upstream's placement): Variant{"not-local", nil},
// Variant{"at", a service-placement record} or Variant{"refused", upstream's words}. facts is a
// placement-facts record.
func (c *Component) PlaceService(configurations []any, service, facts map[string]any) (Variant, error) {
	v, err := c.callPure("place-service", configurations, service, facts)
	if err != nil {
		return Variant{}, err
	}
	return v.(Variant), nil
}

// Encode is the canonical text (docs/traces.md) of value as the result of call.
func (c *Component) Encode(call string, value any) (string, error) {
	fn, err := c.function(call)
	if err != nil {
		return "", err
	}
	if fn.Result == nil {
		return "null", nil
	}
	return fn.Result.Encode(value, func(any) uint64 { return noHandle })
}

// handle is a resource in its own instance.
type handle struct {
	component *Component
	session   *Session
	resource  Resource
}

func (h *handle) call(call string, args ...any) (any, error) {
	fn, err := h.component.function(call)
	if err != nil {
		return nil, err
	}
	return h.session.Call(fn, append([]any{h.resource}, args...))
}

// Poisoned is true once a call trapped: the instance is unusable; make a new one (for a
// tracker, from an earlier ExportState).
func (h *handle) Poisoned() bool { return h.session.Poisoned() }

// Close releases the instance.
func (h *handle) Close() error { return h.session.Close() }

// construct calls a constructor in a fresh instance: the resource, or a *Refused.
func construct(c *Component, call string, args ...any) (*handle, error) {
	fn, err := c.function(call)
	if err != nil {
		return nil, err
	}
	s, err := c.Session()
	if err != nil {
		return nil, err
	}
	v, err := s.Call(fn, args)
	if err != nil {
		s.Close()
		return nil, err
	}
	if x, ok := v.(Variant); ok {
		if x.Tag != "ok" {
			s.Close()
			text, _ := fn.Result.Cases[1].Type.Encode(x.Val, nil)
			return nil, &Refused{Call: call, Value: x.Val, text: text}
		}
		v = x.Val
	}
	r, ok := v.(Resource)
	if !ok {
		s.Close()
		return nil, fmt.Errorf("%s returned no resource", call)
	}
	return &handle{component: c, session: s, resource: r}, nil
}

// Tracker is the stateful core (`reconciler`'s `tracker`): observations and outcomes in,
// commands out. Every step method returns a `step` record:
// {"commands": [{"id": uint64, "command": Variant}…], "wake-at-ms": uint64 or nil, "idle": bool}.
type Tracker struct {
	handle
	Config map[string]any
}

// CreateTracker is `tracker.create`: a tracker with empty state, or a *Refused whose Value is
// the config-error record.
func CreateTracker(c *Component, config map[string]any) (*Tracker, error) {
	h, err := construct(c, "tracker.create", config)
	if err != nil {
		return nil, err
	}
	return &Tracker{*h, config}, nil
}

// ImportTracker is `tracker.import-state`: a tracker from {"version": uint32, "payload":
// []byte} (what ExportState returned, maybe from another version of the logic), or a *Refused
// whose Value is the state-error variant.
func ImportTracker(c *Component, config, state map[string]any) (*Tracker, error) {
	h, err := construct(c, "tracker.import-state", config, state)
	if err != nil {
		return nil, err
	}
	return &Tracker{*h, config}, nil
}

func (t *Tracker) step(call string, args ...any) (map[string]any, error) {
	v, err := t.call(call, args...)
	if err != nil {
		return nil, err
	}
	return v.(map[string]any), nil
}

// Observe is `tracker.observe`: what the watchers saw since the last call, in order
// (observation variants: service-upserted, slice-upserted, lists-complete, …).
func (t *Tracker) Observe(nowMs uint64, batch []any) (map[string]any, error) {
	return t.step("tracker.observe", nowMs, batch)
}

// Complete is `tracker.complete`: outcomes by command id, []any{[]any{id, Variant{Tag: "ok"}}, …},
// with no figure from ARM.
func (t *Tracker) Complete(nowMs uint64, results []any) (map[string]any, error) {
	return t.CompletePaced(nowMs, results, nil)
}

// CompletePaced is `tracker.complete` with what ARM's x-ms-ratelimit-remaining-subscription-writes
// said on the latest of the answers that carried it (nil: none did).
func (t *Tracker) CompletePaced(nowMs uint64, results []any, armRemainingWrites *uint32) (map[string]any, error) {
	var figure any
	if armRemainingWrites != nil {
		figure = *armRemainingWrites
	}
	return t.step("tracker.complete", nowMs, results, figure)
}

// Tick is `tracker.tick`: time passed (at wake-at-ms or on the periodic resync).
func (t *Tracker) Tick(nowMs uint64) (map[string]any, error) {
	return t.step("tracker.tick", nowMs)
}

// ExportState is `tracker.export-state`: {"version": uint64, "payload": []byte}.
func (t *Tracker) ExportState() (map[string]any, error) {
	return t.step("tracker.export-state")
}

// StateVersion is `tracker.state-version`: the schema version ExportState writes.
func (t *Tracker) StateVersion() (uint32, error) {
	v, err := t.call("tracker.state-version")
	if err != nil {
		return 0, err
	}
	return uint32(v.(uint64)), nil
}

// Stats is `tracker.stats`: what the tracker is doing, for dashboards. It reads only: calling
// it or not changes no later answer. nowMs is when the write budgets' levels are taken.
func (t *Tracker) Stats(nowMs uint64) (Stats, error) {
	v, err := t.call("tracker.stats", nowMs)
	if err != nil {
		return Stats{}, err
	}
	var stats Stats
	if err := typed(v, reflect.ValueOf(&stats).Elem()); err != nil {
		return Stats{}, err.prepend("result")
	}
	return stats, nil
}

// Swap is a hot swap as clb-host records it: this tracker's state imported into a fresh
// instance of component with the same configuration. This tracker stays usable.
func (t *Tracker) Swap(component *Component) (*Tracker, error) {
	state, err := t.ExportState()
	if err != nil {
		return nil, err
	}
	return ImportTracker(component, t.Config, state)
}

// PoolQueue is the backend-pool updater's queue (`backend-pools`' `pool-queue`).
type PoolQueue struct{ handle }

// CreatePoolQueue is `pool-queue.create`: an empty queue; a failed group is retried at most
// maxRetries times.
func CreatePoolQueue(c *Component, maxRetries uint32) (*PoolQueue, error) {
	h, err := construct(c, "pool-queue.create", maxRetries)
	if err != nil {
		return nil, err
	}
	return &PoolQueue{*h}, nil
}

// Enqueue is `pool-queue.enqueue`: pool-operation records
// ({"service", "load-balancer", "pool", "kind": "add"|"remove"|"delete-pool"|"ensure-pool", "node-ips"}).
func (q *PoolQueue) Enqueue(operations []any) error {
	_, err := q.call("pool-queue.enqueue", operations)
	return err
}

// RemoveOperations is `pool-queue.remove-operations`: how many queued operations of
// namespace/name were removed.
func (q *PoolQueue) RemoveOperations(service string) (uint32, error) {
	v, err := q.call("pool-queue.remove-operations", service)
	if err != nil {
		return 0, err
	}
	return uint32(v.(uint64)), nil
}

// Status is `pool-queue.status`: {"queued": uint64, "ready": bool, "wake-at-ms": uint64 or nil}.
func (q *PoolQueue) Status(nowMs uint64) (map[string]any, error) {
	v, err := q.call("pool-queue.status", nowMs)
	if err != nil {
		return nil, err
	}
	return v.(map[string]any), nil
}

// DrainAndGroup is `pool-queue.drain-and-group`: pool-group records, one per pool, sorted by key.
func (q *PoolQueue) DrainAndGroup(nowMs uint64, assignment []any) ([]any, error) {
	v, err := q.call("pool-queue.drain-and-group", nowMs, assignment)
	if err != nil {
		return nil, err
	}
	return v.([]any), nil
}

// Report is `pool-queue.report`: the group-report record, or nil for an unknown group.
func (q *PoolQueue) Report(nowMs, group uint64, outcome Variant) (map[string]any, error) {
	v, err := q.call("pool-queue.report", nowMs, group, outcome)
	if err != nil || v == nil {
		return nil, err
	}
	return v.(map[string]any), nil
}
