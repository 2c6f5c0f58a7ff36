package clb

import (
	"fmt"
	"reflect"
)

// Stats is `tracker-stats`, what Tracker.Stats answers: what the tracker is doing, for
// dashboards (wit/clb.wit has what each field counts). The gauges describe its state at the
// call; the counters and histograms count since the tracker was created or imported.
type Stats struct {
	// ServiceGatewayEnabled: the configuration is the Container Load Balancer's.
	ServiceGatewayEnabled bool `wit:"service-gateway-enabled"`
	// Pending has every state of both service types, twelve entries, zeros included.
	Pending                    []PendingOperations `wit:"pending"`
	K8sServices                uint32              `wit:"k8s-services"`
	NRPLoadBalancers           uint32              `wit:"nrp-load-balancers"`
	NRPNatGateways             uint32              `wit:"nrp-nat-gateways"`
	NRPLocations               uint32              `wit:"nrp-locations"`
	NRPAddresses               uint32              `wit:"nrp-addresses"`
	PendingDeletions           uint32              `wit:"pending-deletions"`
	BlockedByLocations         uint32              `wit:"blocked-by-locations"`
	PodFinalizersHeld          uint32              `wit:"pod-finalizers-held"`
	CommandsInFlight           uint32              `wit:"commands-in-flight"`
	Attempts                   []AttemptCount      `wit:"attempts"`
	Durations                  []Histogram         `wit:"durations"`
	Retries                    []Histogram         `wit:"retries"`
	Parked                     []NamedCount        `wit:"parked"`
	OrphansCleaned             uint64              `wit:"orphans-cleaned"`
	DeleteSubstepFailures      []NamedCount        `wit:"delete-substep-failures"`
	LocationSyncTerminalErrors uint64              `wit:"location-sync-terminal-errors"`
	// InitializedAfterMs is nil until start-up has ended.
	InitializedAfterMs *uint64 `wit:"initialized-after-ms"`
	// Budgets: update-address-locations, update-services, arm-writes, then arm-pace while ARM's
	// figures come.
	Budgets []BudgetLevel `wit:"budgets"`
}

// OperationState is `operation-state`: where an operation on a Service's or egress identity's
// Azure resources is.
type OperationState string

// The cases of OperationState.
const (
	OperationStateNotStarted         OperationState = "not-started"
	OperationStateCreationInProgress OperationState = "creation-in-progress"
	OperationStateCreated            OperationState = "created"
	OperationStateDeletionPending    OperationState = "deletion-pending"
	OperationStateDeletionInProgress OperationState = "deletion-in-progress"
	OperationStateUpdateInProgress   OperationState = "update-in-progress"
)

// ServiceType is `service-type`: inbound (a Service's load balancer) or outbound (an egress
// identity's NAT gateway).
type ServiceType string

// The cases of ServiceType.
const (
	ServiceTypeInbound  ServiceType = "inbound"
	ServiceTypeOutbound ServiceType = "outbound"
)

// Operation is `operation`: what an operation does, by the state it started from.
type Operation string

// The cases of Operation.
const (
	OperationCreate Operation = "create"
	OperationUpdate Operation = "update"
	OperationDelete Operation = "delete"
)

// PendingOperations is `pending-operations`: the lifecycles in one state of one type.
type PendingOperations struct {
	State       OperationState `wit:"state"`
	ServiceType ServiceType    `wit:"service-type"`
	Count       uint32         `wit:"count"`
	// OldestBeganMs is when the oldest of them began its operation (the host's clock); nil
	// when there are none.
	OldestBeganMs *uint64 `wit:"oldest-began-ms"`
}

// AttemptCount is `attempt-count`: attempts of operations that ended one way.
type AttemptCount struct {
	Operation   Operation   `wit:"operation"`
	ServiceType ServiceType `wit:"service-type"`
	Success     bool        `wit:"success"`
	ErrorCode   string      `wit:"error-code"`
	Orphan      bool        `wit:"orphan"`
	Count       uint64      `wit:"count"`
}

// Histogram is `histogram`: observations of one operation and type, in upstream's buckets
// (Counts[i] is how many were at most the i-th bound and more than the one before it).
type Histogram struct {
	Operation   Operation   `wit:"operation"`
	ServiceType ServiceType `wit:"service-type"`
	Counts      []uint64    `wit:"counts"`
	Count       uint64      `wit:"count"`
	Sum         uint64      `wit:"sum"`
}

// NamedCount is `named-count`: a count by a reason or step name.
type NamedCount struct {
	Name  string `wit:"name"`
	Count uint64 `wit:"count"`
}

// BudgetLevel is `budget-level`: one write budget's level.
type BudgetLevel struct {
	Bucket    string `wit:"bucket"`
	Tokens    int64  `wit:"tokens"`
	PerMinute uint32 `wit:"per-minute"`
}

// typed fills dst, a struct whose fields carry `wit` tags (or a field of one), from v in the
// API shape (types.go). The schema has already checked v against the WIT type; this fails only
// when the Go type and the schema disagree (a schema from CLB_SCHEMA of another version).
func typed(v any, dst reflect.Value) *DecodeError {
	switch dst.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return decodeErr("expected a record for %s, found %T", dst.Type(), v)
		}
		for i := 0; i < dst.NumField(); i++ {
			name := dst.Type().Field(i).Tag.Get("wit")
			x, ok := m[name]
			if !ok {
				return decodeErr("the record lacks the field `%s`", name)
			}
			if err := typed(x, dst.Field(i)); err != nil {
				return err.prepend("." + name)
			}
		}
	case reflect.Slice:
		items, ok := v.([]any)
		if !ok {
			return decodeErr("expected a list, found %T", v)
		}
		s := reflect.MakeSlice(dst.Type(), len(items), len(items))
		for i, x := range items {
			if err := typed(x, s.Index(i)); err != nil {
				return err.prepend(fmt.Sprintf("[%d]", i))
			}
		}
		dst.Set(s)
	case reflect.Pointer:
		if v == nil {
			dst.SetZero()
			return nil
		}
		p := reflect.New(dst.Type().Elem())
		if err := typed(v, p.Elem()); err != nil {
			return err
		}
		dst.Set(p)
	case reflect.Bool:
		b, ok := v.(bool)
		if !ok {
			return decodeErr("expected a bool, found %T", v)
		}
		dst.SetBool(b)
	case reflect.String:
		s, ok := v.(string)
		if !ok {
			return decodeErr("expected a string, found %T", v)
		}
		dst.SetString(s)
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		u, ok := v.(uint64)
		if !ok || dst.OverflowUint(u) {
			return decodeErr("expected a %s, found %T %v", dst.Type(), v, v)
		}
		dst.SetUint(u)
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, ok := v.(int64)
		if !ok || dst.OverflowInt(n) {
			return decodeErr("expected a %s, found %T %v", dst.Type(), v, v)
		}
		dst.SetInt(n)
	default:
		return decodeErr("no WIT value fits a %s", dst.Type())
	}
	return nil
}
