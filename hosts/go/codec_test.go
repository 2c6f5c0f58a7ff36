package clb

import (
	"bytes"
	"os"
	"reflect"
	"strings"
	"testing"
)

func mustType(t *testing.T, spec string) *Type {
	t.Helper()
	j, err := ParseJSON(spec)
	if err != nil {
		t.Fatal(err)
	}
	ty, err := compileType(j, "test")
	if err != nil {
		t.Fatal(err)
	}
	return ty
}

func roundTrip(t *testing.T, ty *Type, text string) string {
	t.Helper()
	j, err := ParseJSON(text)
	if err != nil {
		t.Fatalf("%s: %v", text, err)
	}
	v, derr := ty.FromJSON(j)
	if derr != nil {
		t.Fatalf("%s: %v", text, derr)
	}
	out, err := ty.Encode(v, nil)
	if err != nil {
		t.Fatalf("%s: %v", text, err)
	}
	return out
}

func TestCanonicalTextRoundTrips(t *testing.T) {
	ty := mustType(t, `{"record":[{"name":"id","type":"u64"},{"name":"name","type":"string"},{"name":"raw","type":{"list":"u8"}},
		{"name":"opt","type":{"option":"s32"}},{"name":"pair","type":{"tuple":["bool","u16"]}},{"name":"level","type":{"enum":["debug","warn"]}},
		{"name":"res","type":{"result":{"ok":null,"err":"string"}}},{"name":"v","type":{"variant":[{"name":"a","type":null},{"name":"b","type":{"list":"string"}}]}}]}`)
	for _, text := range []string{
		`{"id":"18446744073709551615","name":"a\"b\\c\n\u0001/é","raw":"AQID","opt":null,"pair":[true,65535],"level":"warn","res":{"tag":"ok"},"v":{"tag":"a"}}`,
		`{"id":"0","name":"","raw":"","opt":-2147483648,"pair":[false,0],"level":"debug","res":{"tag":"err","val":"x"},"v":{"tag":"b","val":["x","<&>"]}}`,
	} {
		if got := roundTrip(t, ty, text); got != text {
			t.Errorf("\n got %s\nwant %s", got, text)
		}
	}
	// Key order and whitespace are the canonical ones whatever the input's.
	got := roundTrip(t, mustType(t, `{"record":[{"name":"a","type":"u8"},{"name":"b","type":"u8"}]}`), ` { "b" : 2 , "a" : 1 } `)
	if got != `{"a":1,"b":2}` {
		t.Errorf("got %s", got)
	}
}

func TestDecodingIsStrict(t *testing.T) {
	rec := mustType(t, `{"record":[{"name":"a","type":"u8"}]}`)
	cases := []struct{ spec, text, want string }{
		{`"u8"`, `256`, "out of the range"},
		{`"u8"`, `1.0`, "expected a u8 number"},
		{`"s8"`, `-129`, "out of the range"},
		{`"u64"`, `1`, "string of decimal digits"},
		{`"u64"`, `"01"`, "plain decimal"},
		{`"u64"`, `"-1"`, "plain decimal"},
		{`"u64"`, `"18446744073709551616"`, "out of the range"},
		{`{"list":"u8"}`, `"AQI"`, "bad base64"},
		{`{"list":"u8"}`, `"AQJ="`, "bad base64"},
		{`{"enum":["x"]}`, `"y"`, "unknown case"},
		{`{"variant":[{"name":"x","type":null}]}`, `{"tag":"x","val":1}`, "no payload"},
		{`{"variant":[{"name":"x","type":"u8"}]}`, `{"tag":"x"}`, "lacks its `val`"},
		{`{"option":"u8"}`, `"1"`, "expected a u8 number"},
	}
	for _, c := range cases {
		j, err := ParseJSON(c.text)
		if err != nil {
			t.Fatal(err)
		}
		if _, derr := mustType(t, c.spec).FromJSON(j); derr == nil || !strings.Contains(derr.Error(), c.want) {
			t.Errorf("%s as %s: got %v, want %q", c.text, c.spec, derr, c.want)
		}
	}
	for _, text := range []string{`{}`, `{"a":1,"b":2}`} {
		j, _ := ParseJSON(text)
		if _, derr := rec.FromJSON(j); derr == nil {
			t.Errorf("%s decoded as a record of one field", text)
		}
	}
	for _, text := range []string{`{"a":1,"a":2}`, `[1,]`, `"\ud800"`, `nan`, `1 2`, "\"\x01\""} {
		if _, err := ParseJSON(text); err == nil {
			t.Errorf("%q parsed", text)
		}
	}
}

func TestCanonicalABILayout(t *testing.T) {
	cases := []struct {
		spec               string
		size, align, nflat int
	}{
		{`"bool"`, 1, 1, 1},
		{`"string"`, 8, 4, 2},
		{`{"record":[{"name":"a","type":"u8"},{"name":"b","type":"u64"},{"name":"c","type":"u16"}]}`, 24, 8, 3},
		{`{"option":"u64"}`, 16, 8, 2},
		{`{"result":{"ok":"u8","err":"string"}}`, 12, 4, 3},
		{`{"variant":[{"name":"a","type":"u32"},{"name":"b","type":"u64"}]}`, 16, 8, 2},
		{`{"enum":["a","b"]}`, 1, 1, 1},
		{`{"tuple":["u8","string"]}`, 12, 4, 3},
	}
	for _, c := range cases {
		ty := mustType(t, c.spec)
		if int(ty.size) != c.size || int(ty.align) != c.align || len(ty.flat) != c.nflat {
			t.Errorf("%s: size %d align %d flat %d, want %d %d %d", c.spec, ty.size, ty.align, len(ty.flat), c.size, c.align, c.nflat)
		}
	}
	if v := mustType(t, `{"variant":[{"name":"a","type":"u32"},{"name":"b","type":"u64"}]}`); v.flat[1] != i64 {
		t.Error("an i32 and an i64 payload join as i64")
	}
}

func TestTheEmbeddedSchemaIsTheCommittedOne(t *testing.T) {
	committed, err := os.ReadFile("../schema/clb-reconciler.json")
	if err != nil {
		t.Skip("not in a checkout")
	}
	if !bytes.Equal(committed, []byte(embeddedSchema)) {
		t.Fatal("schema.json differs from ../schema/clb-reconciler.json: run `go generate`")
	}
	if _, err := ParseSchema(embeddedSchema, "schema.json"); err != nil {
		t.Fatal(err)
	}
}

// Stats is filled from the record the schema's tracker.stats lifts, field by field, and a record
// that lacks a field of Stats (a schema of another version) is a DecodeError at its path.
func TestStatsAreTypedFromTheRecordAndAFieldTheRecordLacksIsADecodeErrorAtItsPath(t *testing.T) {
	schema, err := ParseSchema(embeddedSchema, "schema.json")
	if err != nil {
		t.Fatal(err)
	}
	ty := schema.Function("tracker.stats").Result
	text := `{"service-gateway-enabled":true,` +
		`"pending":[{"state":"deletion-pending","service-type":"outbound","count":2,"oldest-began-ms":"7"}],` +
		`"k8s-services":1,"nrp-load-balancers":2,"nrp-nat-gateways":3,"nrp-locations":4,"nrp-addresses":5,` +
		`"pending-deletions":6,"blocked-by-locations":7,"pod-finalizers-held":8,"commands-in-flight":9,` +
		`"attempts":[{"operation":"update","service-type":"inbound","success":false,"error-code":"429","orphan":true,"count":"10"}],` +
		`"durations":[{"operation":"create","service-type":"inbound","counts":["1","0"],"count":"1","sum":"90"}],` +
		`"retries":[],"parked":[{"name":"terminal_error","count":"11"}],"orphans-cleaned":"12",` +
		`"delete-substep-failures":[],"location-sync-terminal-errors":"13","initialized-after-ms":null,` +
		`"budgets":[{"bucket":"arm-pace","tokens":"-3","per-minute":1200}]}`
	j, err := ParseJSON(text)
	if err != nil {
		t.Fatal(err)
	}
	v, derr := ty.FromJSON(j)
	if derr != nil {
		t.Fatal(derr)
	}
	var got Stats
	if err := typed(v, reflect.ValueOf(&got).Elem()); err != nil {
		t.Fatal(err)
	}
	seven := uint64(7)
	want := Stats{
		ServiceGatewayEnabled:      true,
		Pending:                    []PendingOperations{{OperationStateDeletionPending, ServiceTypeOutbound, 2, &seven}},
		K8sServices:                1,
		NRPLoadBalancers:           2,
		NRPNatGateways:             3,
		NRPLocations:               4,
		NRPAddresses:               5,
		PendingDeletions:           6,
		BlockedByLocations:         7,
		PodFinalizersHeld:          8,
		CommandsInFlight:           9,
		Attempts:                   []AttemptCount{{OperationUpdate, ServiceTypeInbound, false, "429", true, 10}},
		Durations:                  []Histogram{{OperationCreate, ServiceTypeInbound, []uint64{1, 0}, 1, 90}},
		Retries:                    []Histogram{},
		Parked:                     []NamedCount{{"terminal_error", 11}},
		OrphansCleaned:             12,
		DeleteSubstepFailures:      []NamedCount{},
		LocationSyncTerminalErrors: 13,
		Budgets:                    []BudgetLevel{{"arm-pace", -3, 1200}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	delete(v.(map[string]any)["pending"].([]any)[0].(map[string]any), "count")
	err = typed(v, reflect.ValueOf(&got).Elem())
	if err == nil || err.Error() != "pending[0]: the record lacks the field `count`" {
		t.Errorf("got %v", err)
	}
}
