package clb

import (
	"encoding/base64"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Values of WIT types in Go (the API shape; docs/traces.md has the JSON shape):
//
//	bool                     bool
//	u8 u16 u32 u64           uint64 (any Go integer is taken when it is in range)
//	s8 s16 s32 s64           int64 (likewise)
//	string                   string
//	list<u8>                 []byte
//	list<T>, tuple<…>        []any
//	option<T>                nil, or the T
//	record                   map[string]any with every field, kebab-case
//	variant, result          Variant{Tag, Val} (Val nil for a case without payload)
//	enum                     string: the case name
//	own<R>, borrow<R>        Resource
type Variant struct {
	Tag string
	Val any
}

// Resource is a resource the guest made (a tracker or a pool queue), as its representation
// in the instance that owns it: only meaningful with that instance.
type Resource struct {
	Type string
	rep  uint32
}

// DecodeError is a value that does not fit its type. Path locates it (`batch[0].val.uid`).
type DecodeError struct {
	Message string
	Path    string
}

func (e *DecodeError) Error() string {
	where := strings.TrimPrefix(e.Path, ".")
	if where != "" {
		return where + ": " + e.Message
	}
	return e.Message
}

func (e *DecodeError) prepend(segment string) *DecodeError {
	e.Path = segment + e.Path
	return e
}

func decodeErr(format string, a ...any) *DecodeError {
	return &DecodeError{Message: fmt.Sprintf(format, a...)}
}

// Kind is the kind of a WIT type.
type Kind uint8

// The kinds of WIT types the world uses.
const (
	KBool Kind = iota
	KU8
	KU16
	KU32
	KU64
	KS8
	KS16
	KS32
	KS64
	KString
	KBytes
	KList
	KTuple
	KRecord
	KVariant
	KOption
	KResult
	KEnum
	KOwn
	KBorrow
)

// Field is a record's field or a tuple's element (no name).
type Field struct {
	Name   string
	Type   *Type
	offset uint32
}

// Case is a variant's case; Type is nil for a case without payload.
type Case struct {
	Name string
	Type *Type
}

// Type is one WIT type of the schema, with its canonical ABI layout.
type Type struct {
	Kind     Kind
	Elem     *Type   // list
	Fields   []Field // record, tuple
	Cases    []Case  // variant; option: none, some; result: ok, err
	Names    []string
	Resource string // own, borrow

	size, align uint32
	discSize    uint32
	payloadOff  uint32
	flat        []flatType
	hasResource bool
	caseIndex   map[string]int
}

type flatType uint8

const (
	i32 flatType = iota
	i64
)

var intKinds = map[string]Kind{"u8": KU8, "u16": KU16, "u32": KU32, "u64": KU64, "s8": KS8, "s16": KS16, "s32": KS32, "s64": KS64}

// SchemaError is a schema that is malformed or describes what this host does not support.
type SchemaError struct{ Message string }

func (e *SchemaError) Error() string { return e.Message }

func schemaErr(format string, a ...any) error { return &SchemaError{fmt.Sprintf(format, a...)} }

// compileType is the Type of a schema type (docs/traces.md, "The schema").
func compileType(spec *JSON, where string) (*Type, error) {
	if spec.Kind == JSONString {
		switch s := spec.Text; {
		case s == "bool":
			return finish(&Type{Kind: KBool}), nil
		case intKinds[s] != 0 || s == "u8":
			return finish(&Type{Kind: intKinds[s]}), nil
		case s == "string":
			return finish(&Type{Kind: KString}), nil
		}
		return nil, schemaErr("%s: unsupported type %s (the world uses no floats, char or flags)", where, spec.Canonical())
	}
	if spec.Kind != JSONObject || len(spec.Keys) != 1 {
		return nil, schemaErr("%s: a type is a name or an object of one key, found %s", where, spec.Canonical())
	}
	kind, arg := spec.Keys[0], spec.Vals[0]
	named := func(j *JSON, what string) (string, *JSON, error) {
		if j.Kind != JSONObject || len(j.Keys) != 2 || j.Get("name") == nil || j.Get("type") == nil || j.Get("name").Kind != JSONString {
			return "", nil, schemaErr("%s: a %s is {\"name\":…,\"type\":…}, found %s", where, what, j.Canonical())
		}
		return j.Get("name").Text, j.Get("type"), nil
	}
	switch kind {
	case "list":
		if arg.Kind == JSONString && arg.Text == "u8" {
			return finish(&Type{Kind: KBytes}), nil
		}
		e, err := compileType(arg, where)
		if err != nil {
			return nil, err
		}
		return finish(&Type{Kind: KList, Elem: e}), nil
	case "option":
		p, err := compileType(arg, where)
		if err != nil {
			return nil, err
		}
		if p.Kind == KOption {
			return nil, schemaErr("%s: unsupported: nested option<option<…>>", where)
		}
		return finish(&Type{Kind: KOption, Cases: []Case{{"none", nil}, {"some", p}}}), nil
	case "tuple":
		if arg.Kind != JSONArray {
			return nil, schemaErr("%s: a tuple's elements are an array", where)
		}
		t := &Type{Kind: KTuple}
		for _, x := range arg.Items {
			e, err := compileType(x, where)
			if err != nil {
				return nil, err
			}
			t.Fields = append(t.Fields, Field{Type: e})
		}
		return finish(t), nil
	case "record":
		if arg.Kind != JSONArray {
			return nil, schemaErr("%s: a record's fields are an array", where)
		}
		t := &Type{Kind: KRecord}
		seen := map[string]bool{}
		for _, x := range arg.Items {
			name, ft, err := named(x, "record field")
			if err != nil {
				return nil, err
			}
			if seen[name] {
				return nil, schemaErr("%s: a record with two fields named %s", where, name)
			}
			seen[name] = true
			e, err := compileType(ft, where+"."+name)
			if err != nil {
				return nil, err
			}
			if e.Kind == KOwn || e.Kind == KBorrow {
				return nil, schemaErr("%s: unsupported: a resource inside a record", where)
			}
			t.Fields = append(t.Fields, Field{Name: name, Type: e})
		}
		return finish(t), nil
	case "variant":
		if arg.Kind != JSONArray {
			return nil, schemaErr("%s: a variant's cases are an array", where)
		}
		t := &Type{Kind: KVariant}
		for _, x := range arg.Items {
			name, ct, err := named(x, "variant case")
			if err != nil {
				return nil, err
			}
			var e *Type
			if ct.Kind != JSONNull {
				if e, err = compileType(ct, where+"."+name); err != nil {
					return nil, err
				}
			}
			t.Cases = append(t.Cases, Case{name, e})
		}
		return finishCases(t, where)
	case "enum":
		if arg.Kind != JSONArray {
			return nil, schemaErr("%s: an enum's cases are an array of names", where)
		}
		t := &Type{Kind: KEnum}
		for _, x := range arg.Items {
			if x.Kind != JSONString {
				return nil, schemaErr("%s: an enum's cases are an array of names", where)
			}
			t.Names = append(t.Names, x.Text)
			t.Cases = append(t.Cases, Case{Name: x.Text})
		}
		return finishCases(t, where)
	case "result":
		if arg.Kind != JSONObject || len(arg.Keys) != 2 || arg.Get("ok") == nil || arg.Get("err") == nil {
			return nil, schemaErr("%s: a result is {\"ok\":…,\"err\":…}, found %s", where, arg.Canonical())
		}
		t := &Type{Kind: KResult}
		for _, side := range []string{"ok", "err"} {
			var e *Type
			if s := arg.Get(side); s.Kind != JSONNull {
				var err error
				if e, err = compileType(s, where+"."+side); err != nil {
					return nil, err
				}
			}
			t.Cases = append(t.Cases, Case{side, e})
		}
		return finishCases(t, where)
	case "own", "borrow":
		if arg.Kind != JSONString {
			return nil, schemaErr("%s: a resource is named by a string", where)
		}
		k := KOwn
		if kind == "borrow" {
			k = KBorrow
		}
		return finish(&Type{Kind: k, Resource: arg.Text}), nil
	}
	return nil, schemaErr("%s: unsupported type %s", where, spec.Canonical())
}

func finishCases(t *Type, where string) (*Type, error) {
	t.caseIndex = map[string]int{}
	for i, c := range t.Cases {
		if _, dup := t.caseIndex[c.Name]; dup {
			return nil, schemaErr("%s: two cases named %s", where, c.Name)
		}
		t.caseIndex[c.Name] = i
	}
	return finish(t), nil
}

func alignTo(n, a uint32) uint32 { return (n + a - 1) / a * a }

// finish computes the canonical ABI layout (CanonicalABI.md: size, alignment, flattening).
func finish(t *Type) *Type {
	switch t.Kind {
	case KBool, KU8, KS8:
		t.size, t.align, t.flat = 1, 1, []flatType{i32}
	case KU16, KS16:
		t.size, t.align, t.flat = 2, 2, []flatType{i32}
	case KU32, KS32:
		t.size, t.align, t.flat = 4, 4, []flatType{i32}
	case KU64, KS64:
		t.size, t.align, t.flat = 8, 8, []flatType{i64}
	case KString, KBytes, KList:
		t.size, t.align, t.flat = 8, 4, []flatType{i32, i32}
		t.hasResource = t.Elem != nil && t.Elem.hasResource
	case KOwn, KBorrow:
		t.size, t.align, t.flat = 4, 4, []flatType{i32}
		t.hasResource = true
	case KRecord, KTuple:
		t.align = 1
		var off uint32
		for i := range t.Fields {
			f := t.Fields[i].Type
			off = alignTo(off, f.align)
			t.Fields[i].offset = off
			off += f.size
			t.align = max(t.align, f.align)
			t.flat = append(t.flat, f.flat...)
			t.hasResource = t.hasResource || f.hasResource
		}
		t.size = alignTo(off, t.align)
	case KVariant, KOption, KResult, KEnum:
		n := len(t.Cases)
		switch {
		case n <= 1<<8:
			t.discSize = 1
		case n <= 1<<16:
			t.discSize = 2
		default:
			t.discSize = 4
		}
		var maxSize, maxAlign uint32 = 0, 1
		var joined []flatType
		for _, c := range t.Cases {
			if c.Type == nil {
				continue
			}
			maxSize = max(maxSize, c.Type.size)
			maxAlign = max(maxAlign, c.Type.align)
			t.hasResource = t.hasResource || c.Type.hasResource
			for i, ft := range c.Type.flat {
				if i < len(joined) {
					if joined[i] != ft {
						joined[i] = i64 // only i32 and i64 occur: they join as i64
					}
				} else {
					joined = append(joined, ft)
				}
			}
		}
		t.align = max(t.discSize, maxAlign)
		t.payloadOff = alignTo(t.discSize, maxAlign)
		t.size = alignTo(t.payloadOff+maxSize, t.align)
		t.flat = append([]flatType{i32}, joined...)
	}
	return t
}

func (t *Type) isSigned() bool { return t.Kind >= KS8 && t.Kind <= KS64 }

func (t *Type) bits() uint {
	switch t.Kind {
	case KU8, KS8:
		return 8
	case KU16, KS16:
		return 16
	case KU32, KS32:
		return 32
	}
	return 64
}

func (t *Type) name() string {
	switch t.Kind {
	case KBool:
		return "bool"
	case KString:
		return "string"
	}
	if t.Kind >= KU8 && t.Kind <= KS64 {
		if t.isSigned() {
			return "s" + strconv.Itoa(int(t.bits()))
		}
		return "u" + strconv.Itoa(int(t.bits()))
	}
	return "value"
}

// FromJSON decodes the JSON shape of a value strictly (docs/traces.md, "Values").
func (t *Type) FromJSON(j *JSON) (any, *DecodeError) {
	switch t.Kind {
	case KBool:
		if j.Kind != JSONBool {
			return nil, decodeErr("expected a boolean, found %s", jsonTypeName(j))
		}
		return j.Bool, nil
	case KU8, KU16, KU32, KU64, KS8, KS16, KS32, KS64:
		text := j.Text
		if t.bits() == 64 {
			if j.Kind != JSONString {
				return nil, decodeErr("expected a %s as a string of decimal digits, found %s", t.name(), jsonTypeName(j))
			}
			if !plainDecimal(text, t.isSigned()) {
				return nil, decodeErr("expected a %s as a plain decimal string, found %s", t.name(), quote(text))
			}
		} else if j.Kind != JSONNumber || !isInteger(text) {
			return nil, decodeErr("expected a %s number, found %s", t.name(), jsonTypeName(j))
		}
		if t.isSigned() {
			v, err := strconv.ParseInt(text, 10, int(t.bits()))
			if err != nil {
				return nil, decodeErr("%s is out of the range of %s", text, t.name())
			}
			return v, nil
		}
		v, err := strconv.ParseUint(text, 10, int(t.bits()))
		if err != nil {
			return nil, decodeErr("%s is out of the range of %s", text, t.name())
		}
		return v, nil
	case KString:
		if j.Kind != JSONString {
			return nil, decodeErr("expected a string, found %s", jsonTypeName(j))
		}
		return j.Text, nil
	case KBytes:
		if j.Kind != JSONString {
			return nil, decodeErr("expected a base64 string (list<u8>), found %s", jsonTypeName(j))
		}
		v, err := base64.StdEncoding.Strict().DecodeString(j.Text)
		if err != nil {
			return nil, decodeErr("bad base64: %v", err)
		}
		if base64.StdEncoding.EncodeToString(v) != j.Text {
			return nil, decodeErr("bad base64: not in canonical form")
		}
		return v, nil
	case KList:
		if j.Kind != JSONArray {
			return nil, decodeErr("expected an array, found %s", jsonTypeName(j))
		}
		out := make([]any, len(j.Items))
		for i, x := range j.Items {
			v, err := t.Elem.FromJSON(x)
			if err != nil {
				return nil, err.prepend(fmt.Sprintf("[%d]", i))
			}
			out[i] = v
		}
		return out, nil
	case KTuple:
		if j.Kind != JSONArray {
			return nil, decodeErr("expected an array (a tuple of %d), found %s", len(t.Fields), jsonTypeName(j))
		}
		if len(j.Items) != len(t.Fields) {
			return nil, decodeErr("expected a tuple of %d elements, found %d", len(t.Fields), len(j.Items))
		}
		out := make([]any, len(j.Items))
		for i, x := range j.Items {
			v, err := t.Fields[i].Type.FromJSON(x)
			if err != nil {
				return nil, err.prepend(fmt.Sprintf("[%d]", i))
			}
			out[i] = v
		}
		return out, nil
	case KRecord:
		if j.Kind != JSONObject {
			return nil, decodeErr("expected an object (a record), found %s", jsonTypeName(j))
		}
		out := make(map[string]any, len(t.Fields))
		for _, f := range t.Fields {
			x := j.Get(f.Name)
			if x == nil {
				return nil, decodeErr("the record lacks the field `%s`", f.Name)
			}
			v, err := f.Type.FromJSON(x)
			if err != nil {
				return nil, err.prepend("." + f.Name)
			}
			out[f.Name] = v
		}
		if len(j.Keys) != len(t.Fields) {
			for _, k := range j.Keys {
				if _, ok := out[k]; !ok {
					return nil, decodeErr("the record has an unknown field `%s`", k)
				}
			}
		}
		return out, nil
	case KOption:
		if j.Kind == JSONNull {
			return nil, nil
		}
		return t.Cases[1].Type.FromJSON(j)
	case KVariant, KResult:
		if j.Kind != JSONObject {
			return nil, decodeErr("expected an object with a `tag`, found %s", jsonTypeName(j))
		}
		tag := j.Get("tag")
		if tag == nil || tag.Kind != JSONString {
			return nil, decodeErr("expected an object with a string `tag`")
		}
		i, ok := t.caseIndex[tag.Text]
		if !ok {
			return nil, decodeErr("unknown case %s", quote(tag.Text))
		}
		c := t.Cases[i]
		if c.Type == nil {
			if len(j.Keys) != 1 {
				return nil, decodeErr("the case `%s` has no payload, but the object has more than its `tag`", c.Name)
			}
			return Variant{Tag: c.Name}, nil
		}
		val := j.Get("val")
		if val == nil {
			return nil, decodeErr("the case `%s` lacks its `val`", c.Name)
		}
		if len(j.Keys) != 2 {
			return nil, decodeErr("an unknown field beside `tag` and `val`")
		}
		v, err := c.Type.FromJSON(val)
		if err != nil {
			return nil, err.prepend(".val")
		}
		return Variant{Tag: c.Name, Val: v}, nil
	case KEnum:
		if j.Kind != JSONString {
			return nil, decodeErr("expected an enum case name (a string), found %s", jsonTypeName(j))
		}
		if _, ok := t.caseIndex[j.Text]; !ok {
			return nil, decodeErr("unknown case %s", quote(j.Text))
		}
		return j.Text, nil
	default: // own, borrow: a trace's handle number
		v, ok := j.Uint()
		if !ok {
			return nil, decodeErr("expected a handle (a number from 0), found %s", jsonTypeName(j))
		}
		return v, nil
	}
}

func plainDecimal(s string, signed bool) bool {
	if signed && strings.HasPrefix(s, "-") && s != "-0" {
		s = s[1:]
	}
	if s == "" || (len(s) > 1 && s[0] == '0') {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// Encode is the canonical text of an API value. A resource in it is written as the number
// handle(resource) gives (nil: the value must hold handle numbers, as a decoded trace does).
func (t *Type) Encode(v any, handle func(any) uint64) (string, error) {
	b, err := t.appendJSON(nil, v, handle)
	return string(b), err
}

func (t *Type) appendJSON(b []byte, v any, handle func(any) uint64) ([]byte, error) {
	switch t.Kind {
	case KBool:
		x, ok := v.(bool)
		if !ok {
			return nil, fmt.Errorf("expected a bool, found %T", v)
		}
		return strconv.AppendBool(b, x), nil
	case KU8, KU16, KU32, KU64, KS8, KS16, KS32, KS64:
		n, err := t.checkInt(v)
		if err != nil {
			return nil, err
		}
		var s string
		if t.isSigned() {
			s = strconv.FormatInt(int64(n), 10)
		} else {
			s = strconv.FormatUint(n, 10)
		}
		if t.bits() == 64 {
			return appendString(b, s), nil
		}
		return append(b, s...), nil
	case KString:
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("expected a string, found %T", v)
		}
		return appendString(b, s), nil
	case KBytes:
		x, ok := v.([]byte)
		if !ok {
			return nil, fmt.Errorf("expected []byte, found %T", v)
		}
		b = append(b, '"')
		b = base64.StdEncoding.AppendEncode(b, x)
		return append(b, '"'), nil
	case KList, KTuple:
		xs, ok := v.([]any)
		if !ok {
			return nil, fmt.Errorf("expected []any, found %T", v)
		}
		if t.Kind == KTuple && len(xs) != len(t.Fields) {
			return nil, fmt.Errorf("expected a tuple of %d elements, found %d", len(t.Fields), len(xs))
		}
		b = append(b, '[')
		for i, x := range xs {
			if i > 0 {
				b = append(b, ',')
			}
			et := t.Elem
			if t.Kind == KTuple {
				et = t.Fields[i].Type
			}
			var err error
			if b, err = et.appendJSON(b, x, handle); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case KRecord:
		m, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("expected map[string]any (a record), found %T", v)
		}
		b = append(b, '{')
		for i, f := range t.Fields {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, f.Name)
			b = append(b, ':')
			x, ok := m[f.Name]
			if !ok {
				return nil, fmt.Errorf("the record lacks the field `%s`", f.Name)
			}
			var err error
			if b, err = f.Type.appendJSON(b, x, handle); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	case KOption:
		if v == nil {
			return append(b, "null"...), nil
		}
		return t.Cases[1].Type.appendJSON(b, v, handle)
	case KVariant, KResult:
		x, ok := v.(Variant)
		if !ok {
			return nil, fmt.Errorf("expected a Variant, found %T", v)
		}
		i, ok := t.caseIndex[x.Tag]
		if !ok {
			return nil, fmt.Errorf("unknown case %q", x.Tag)
		}
		b = append(b, `{"tag":`...)
		b = appendString(b, x.Tag)
		if c := t.Cases[i]; c.Type != nil {
			b = append(b, `,"val":`...)
			var err error
			if b, err = c.Type.appendJSON(b, x.Val, handle); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	case KEnum:
		s, ok := v.(string)
		if _, known := t.caseIndex[s]; !ok || !known {
			return nil, fmt.Errorf("unknown enum case %v", v)
		}
		return appendString(b, s), nil
	default:
		if handle != nil {
			return strconv.AppendUint(b, handle(v), 10), nil
		}
		n, ok := v.(uint64)
		if !ok {
			return nil, fmt.Errorf("a %s must be a handle number to encode, found %T", t.Resource, v)
		}
		return strconv.AppendUint(b, n, 10), nil
	}
}

// checkInt is an integer API value as 64 bits (two's complement for signed types), refused
// when it is not an integer or out of the type's range.
func (t *Type) checkInt(v any) (uint64, error) {
	var neg bool
	var mag uint64
	switch x := v.(type) {
	case int:
		neg, mag = x < 0, absInt(int64(x))
	case int8:
		neg, mag = x < 0, absInt(int64(x))
	case int16:
		neg, mag = x < 0, absInt(int64(x))
	case int32:
		neg, mag = x < 0, absInt(int64(x))
	case int64:
		neg, mag = x < 0, absInt(x)
	case uint:
		mag = uint64(x)
	case uint8:
		mag = uint64(x)
	case uint16:
		mag = uint64(x)
	case uint32:
		mag = uint64(x)
	case uint64:
		mag = x
	default:
		return 0, decodeErr("expected an integer (%s), found %T", t.name(), v)
	}
	bits := t.bits()
	if t.isSigned() {
		limit := uint64(1) << (bits - 1)
		if (!neg && mag >= limit) || (neg && mag > limit) {
			return 0, t.rangeErr(neg, mag)
		}
		if neg {
			return -mag, nil
		}
		return mag, nil
	}
	if neg || (bits < 64 && mag >= uint64(1)<<bits) {
		return 0, t.rangeErr(neg, mag)
	}
	return mag, nil
}

func (t *Type) rangeErr(neg bool, mag uint64) *DecodeError {
	s := strconv.FormatUint(mag, 10)
	if neg {
		s = "-" + s
	}
	return decodeErr("%s is out of the range of %s", s, t.name())
}

func absInt(x int64) uint64 {
	if x == math.MinInt64 {
		return 1 << 63
	}
	if x < 0 {
		return uint64(-x)
	}
	return uint64(x)
}

// mapResources is a copy of v with every resource r replaced by fn(r).
func (t *Type) mapResources(v any, fn func(any) any) any {
	if !t.hasResource {
		return v
	}
	switch t.Kind {
	case KOwn, KBorrow:
		return fn(v)
	case KList:
		xs := v.([]any)
		out := make([]any, len(xs))
		for i, x := range xs {
			out[i] = t.Elem.mapResources(x, fn)
		}
		return out
	case KTuple:
		xs := v.([]any)
		out := make([]any, len(xs))
		for i, x := range xs {
			out[i] = t.Fields[i].Type.mapResources(x, fn)
		}
		return out
	case KRecord:
		m := v.(map[string]any)
		out := make(map[string]any, len(m))
		for _, f := range t.Fields {
			out[f.Name] = f.Type.mapResources(m[f.Name], fn)
		}
		return out
	case KOption:
		if v == nil {
			return nil
		}
		return t.Cases[1].Type.mapResources(v, fn)
	case KVariant, KResult:
		x := v.(Variant)
		if c := t.Cases[t.caseIndex[x.Tag]]; c.Type != nil {
			return Variant{Tag: x.Tag, Val: c.Type.mapResources(x.Val, fn)}
		}
	}
	return v
}

// resourceIn is the first resource in v (a constructor's own, or ok(own)), or nil.
func (t *Type) resourceIn(v any) any {
	var found any
	t.mapResources(v, func(r any) any {
		if found == nil {
			found = r
		}
		return r
	})
	return found
}

func validUTF8(s string) bool { return utf8.ValidString(s) }
