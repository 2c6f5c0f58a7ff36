package clb

import (
	"bytes"
	"os"
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
