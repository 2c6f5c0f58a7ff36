package clb

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// The canonical ABI's bounds on flat values (CanonicalABI.md, "Flattening").
const (
	maxFlatParams  = 16
	maxFlatResults = 1
)

// Trap is a call into the guest that did not return: Kind is `deadline` (the call ran past
// its deadline), `panic` (the guest reported a panic through diagnostics.panicked; Message is
// its text), `trap` (any other trap, including an allocation failure at the memory cap),
// `poisoned` (an earlier call trapped and left the instance unusable) or `instantiate`.
type Trap struct {
	Call    string
	Kind    string
	Message string
}

var trapText = map[string]string{
	"deadline":    "ran past its deadline",
	"panic":       "panicked",
	"trap":        "trapped",
	"poisoned":    "was refused",
	"instantiate": "failed to instantiate",
}

func (t *Trap) Error() string { return fmt.Sprintf("`%s` %s: %s", t.Call, trapText[t.Kind], t.Message) }

// Session is one instance of a component (one tracker, one pool queue, or the pure
// functions). Any trap poisons it.
type Session struct {
	component *Component
	module    api.Module
	memory    api.Memory
	realloc   api.Function
	funcs     map[string]api.Function
	// The canonical handle table of the instance's own resources (resource-new/rep/drop).
	handles    map[uint32]uint32
	nextHandle uint32
	panic      string
	poisoned   bool
}

type sessionKey struct{}

func sessionOf(ctx context.Context) *Session {
	s, _ := ctx.Value(sessionKey{}).(*Session)
	return s
}

// Poisoned is true once a call trapped: the instance is unusable.
func (s *Session) Poisoned() bool { return s.poisoned }

// Session is a fresh instance of the component.
func (c *Component) Session() (*Session, error) {
	s := &Session{component: c, funcs: map[string]api.Function{}, handles: map[uint32]uint32{}}
	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), sessionKey{}, s), c.Limits.Deadline)
	defer cancel()
	// An anonymous module: the name of a wazero module must be unique, an instance's need not.
	mod, err := c.runtime.InstantiateModule(ctx, c.module, wazero.NewModuleConfig().WithName("").WithStartFunctions())
	if err != nil {
		s.poisoned = true
		kind, msg := s.classify(ctx, err)
		if kind == "trap" {
			kind = "instantiate"
		}
		return nil, &Trap{"instantiate", kind, msg}
	}
	s.module = mod
	s.memory = mod.ExportedMemory("memory")
	s.realloc = mod.ExportedFunction("cabi_realloc")
	return s, nil
}

// Close releases the instance.
func (s *Session) Close() error {
	if s.module == nil {
		return nil
	}
	return s.module.Close(context.Background())
}

func (s *Session) classify(ctx context.Context, err error) (string, string) {
	if ctx.Err() != nil {
		return "deadline", "the call ran past its deadline of " + s.component.Limits.Deadline.String()
	}
	if s.panic != "" {
		return "panic", s.panic
	}
	text := err.Error()
	if i := strings.Index(text, "\nwasm stack trace:"); i >= 0 {
		text = text[:i]
	}
	return "trap", text
}

// guestFault is an error inside the lowering or lifting that the guest caused (a bad pointer,
// a string that is not UTF-8): a trap, as in the canonical ABI.
type guestFault struct{ msg string }

func (e guestFault) Error() string { return e.msg }

// Call calls fn with API values (a method's `self` first, as the Resource its constructor
// returned) and returns its API result. An argument that does not fit its type is a
// *DecodeError (the guest is not called); a trap is a *Trap and poisons the session.
func (s *Session) Call(fn *Function, args []any) (result any, err error) {
	if len(args) != len(fn.Params) {
		return nil, decodeErr("%s takes %d arguments, given %d", fn.Call, len(fn.Params), len(args))
	}
	for i, p := range fn.Params {
		if err := p.Type.check(args[i]); err != nil {
			return nil, err.prepend(p.Name)
		}
	}
	if s.poisoned {
		return nil, &Trap{fn.Call, "poisoned", "an earlier call trapped and left this instance unusable"}
	}
	f := s.funcs[fn.Call]
	if f == nil {
		name := s.component.exports[fn.Call]
		if f = s.module.ExportedFunction(name); f == nil {
			return nil, fmt.Errorf("the instance has no function for `%s`", fn.Call)
		}
		s.funcs[fn.Call] = f
	}
	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), sessionKey{}, s), s.component.Limits.Deadline)
	defer cancel()
	s.panic = ""
	defer func() {
		if r := recover(); r != nil {
			fault, ok := r.(guestFault)
			if !ok {
				panic(r)
			}
			s.poisoned = true
			kind, msg := s.classify(ctx, fault)
			result, err = nil, &Trap{fn.Call, kind, msg}
		}
	}()
	c := &cx{s: s, ctx: ctx}
	var flat []uint64
	if len(fn.paramTuple.flat) > maxFlatParams {
		ptr := c.alloc(fn.paramTuple.align, fn.paramTuple.size)
		c.store(fn.paramTuple, args, ptr)
		flat = []uint64{uint64(ptr)}
	} else {
		for i, p := range fn.Params {
			flat = c.lowerFlat(p.Type, args[i], flat)
		}
	}
	out, callErr := f.Call(ctx, flat...)
	if callErr != nil {
		s.poisoned = true
		kind, msg := s.classify(ctx, callErr)
		return nil, &Trap{fn.Call, kind, msg}
	}
	if fn.Result == nil {
		return nil, nil
	}
	if len(fn.Result.flat) > maxFlatResults {
		result = c.load(fn.Result, uint32(out[0]))
	} else {
		result = c.liftFlat(fn.Result, out)
	}
	if post := s.module.ExportedFunction("cabi_post_" + s.component.exports[fn.Call]); post != nil {
		if _, err := post.Call(ctx, out...); err != nil {
			s.poisoned = true
			kind, msg := s.classify(ctx, err)
			return nil, &Trap{fn.Call, kind, msg}
		}
	}
	return result, nil
}

// check validates an API value against its type before anything is written into the guest.
func (t *Type) check(v any) *DecodeError {
	switch t.Kind {
	case KBool:
		if _, ok := v.(bool); !ok {
			return decodeErr("expected a bool, found %T", v)
		}
	case KU8, KU16, KU32, KU64, KS8, KS16, KS32, KS64:
		if _, err := t.checkInt(v); err != nil {
			var de *DecodeError
			errors.As(err, &de)
			return de
		}
	case KString:
		s, ok := v.(string)
		if !ok {
			return decodeErr("expected a string, found %T", v)
		}
		if !utf8.ValidString(s) {
			return decodeErr("a string that is not UTF-8")
		}
	case KBytes:
		if _, ok := v.([]byte); !ok {
			return decodeErr("expected []byte (list<u8>), found %T", v)
		}
	case KList:
		xs, ok := v.([]any)
		if !ok {
			return decodeErr("expected []any (a list), found %T", v)
		}
		for i, x := range xs {
			if err := t.Elem.check(x); err != nil {
				return err.prepend(fmt.Sprintf("[%d]", i))
			}
		}
	case KTuple:
		xs, ok := v.([]any)
		if !ok || len(xs) != len(t.Fields) {
			return decodeErr("expected []any of %d elements (a tuple), found %T", len(t.Fields), v)
		}
		for i, x := range xs {
			if err := t.Fields[i].Type.check(x); err != nil {
				return err.prepend(fmt.Sprintf("[%d]", i))
			}
		}
	case KRecord:
		m, ok := v.(map[string]any)
		if !ok {
			return decodeErr("expected map[string]any (a record), found %T", v)
		}
		for _, f := range t.Fields {
			x, ok := m[f.Name]
			if !ok {
				return decodeErr("the record lacks the field `%s`", f.Name)
			}
			if err := f.Type.check(x); err != nil {
				return err.prepend("." + f.Name)
			}
		}
		if len(m) != len(t.Fields) {
			for k := range m {
				found := false
				for _, f := range t.Fields {
					found = found || f.Name == k
				}
				if !found {
					return decodeErr("the record has an unknown field `%s`", k)
				}
			}
		}
	case KOption:
		if v != nil {
			return t.Cases[1].Type.check(v)
		}
	case KVariant, KResult:
		x, ok := v.(Variant)
		if !ok {
			return decodeErr("expected a Variant, found %T", v)
		}
		i, ok := t.caseIndex[x.Tag]
		if !ok {
			return decodeErr("unknown case %s", quote(x.Tag))
		}
		if c := t.Cases[i]; c.Type == nil {
			if x.Val != nil {
				return decodeErr("the case `%s` has no payload", x.Tag)
			}
		} else if err := c.Type.check(x.Val); err != nil {
			return err.prepend(".val")
		}
	case KEnum:
		s, ok := v.(string)
		if _, known := t.caseIndex[s]; !ok || !known {
			return decodeErr("unknown case %v", v)
		}
	case KBorrow:
		r, ok := v.(Resource)
		if !ok || r.Type != t.Resource {
			return decodeErr("expected a %s Resource, found %T", t.Resource, v)
		}
	case KOwn:
		return decodeErr("unsupported: an own<%s> argument", t.Resource)
	}
	return nil
}

// cx is one call's lowering and lifting context.
type cx struct {
	s   *Session
	ctx context.Context
}

func (c *cx) fault(format string, a ...any) { panic(guestFault{fmt.Sprintf(format, a...)}) }

func (c *cx) alloc(align, size uint32) uint32 {
	if size == 0 {
		return align // any aligned pointer will do for nothing
	}
	out, err := c.s.realloc.Call(c.ctx, 0, 0, uint64(align), uint64(size))
	if err != nil {
		panic(guestFault{"cabi_realloc: " + err.Error()})
	}
	ptr := uint32(out[0])
	if ptr%align != 0 || uint64(ptr)+uint64(size) > uint64(c.s.memory.Size()) {
		c.fault("cabi_realloc returned a bad pointer")
	}
	return ptr
}

func (c *cx) write(ptr uint32, b []byte) {
	if !c.s.memory.Write(ptr, b) {
		c.fault("out of bounds")
	}
}

func (c *cx) read(ptr, n uint32) []byte {
	b, ok := c.s.memory.Read(ptr, n)
	if !ok {
		c.fault("out of bounds")
	}
	return b
}

func (c *cx) storeBytes(b []byte) (uint32, uint32) {
	ptr := c.alloc(1, uint32(len(b)))
	c.write(ptr, b)
	return ptr, uint32(len(b))
}

func (c *cx) storeList(t *Type, xs []any) (uint32, uint32) {
	e := t.Elem
	ptr := c.alloc(e.align, e.size*uint32(len(xs)))
	for i, x := range xs {
		c.store(e, x, ptr+uint32(i)*e.size)
	}
	return ptr, uint32(len(xs))
}

func (t *Type) intBits(v any) uint64 {
	n, _ := t.checkInt(v) // checked before the call
	return n
}

// store writes v at ptr (CanonicalABI.md, "store").
func (c *cx) store(t *Type, v any, ptr uint32) {
	var buf [8]byte
	switch t.Kind {
	case KBool:
		if v.(bool) {
			buf[0] = 1
		}
		c.write(ptr, buf[:1])
	case KU8, KS8:
		c.write(ptr, []byte{byte(t.intBits(v))})
	case KU16, KS16:
		binary.LittleEndian.PutUint16(buf[:], uint16(t.intBits(v)))
		c.write(ptr, buf[:2])
	case KU32, KS32:
		binary.LittleEndian.PutUint32(buf[:], uint32(t.intBits(v)))
		c.write(ptr, buf[:4])
	case KU64, KS64:
		binary.LittleEndian.PutUint64(buf[:], t.intBits(v))
		c.write(ptr, buf[:8])
	case KString, KBytes, KList:
		var p, n uint32
		switch t.Kind {
		case KString:
			p, n = c.storeBytes([]byte(v.(string)))
		case KBytes:
			p, n = c.storeBytes(v.([]byte))
		default:
			p, n = c.storeList(t, v.([]any))
		}
		binary.LittleEndian.PutUint32(buf[:], p)
		binary.LittleEndian.PutUint32(buf[4:], n)
		c.write(ptr, buf[:8])
	case KRecord:
		m := v.(map[string]any)
		for _, f := range t.Fields {
			c.store(f.Type, m[f.Name], ptr+f.offset)
		}
	case KTuple:
		xs := v.([]any)
		for i, f := range t.Fields {
			c.store(f.Type, xs[i], ptr+f.offset)
		}
	case KVariant, KOption, KResult, KEnum:
		disc, payload, pt := t.caseOf(v)
		binary.LittleEndian.PutUint32(buf[:], disc)
		c.write(ptr, buf[:t.discSize])
		if pt != nil {
			c.store(pt, payload, ptr+t.payloadOff)
		}
	case KBorrow, KOwn:
		binary.LittleEndian.PutUint32(buf[:], v.(Resource).rep)
		c.write(ptr, buf[:4])
	}
}

// caseOf is a variant-like value's case index, payload and payload type.
func (t *Type) caseOf(v any) (uint32, any, *Type) {
	switch t.Kind {
	case KOption:
		if v == nil {
			return 0, nil, nil
		}
		return 1, v, t.Cases[1].Type
	case KEnum:
		return uint32(t.caseIndex[v.(string)]), nil, nil
	default:
		x := v.(Variant)
		i := t.caseIndex[x.Tag]
		return uint32(i), x.Val, t.Cases[i].Type
	}
}

// lowerFlat appends v's flat values (CanonicalABI.md, "lower_flat"); an i32 is zero-extended.
func (c *cx) lowerFlat(t *Type, v any, out []uint64) []uint64 {
	switch t.Kind {
	case KBool:
		if v.(bool) {
			return append(out, 1)
		}
		return append(out, 0)
	case KU8, KU16, KU32, KS8, KS16, KS32:
		return append(out, uint64(uint32(t.intBits(v))))
	case KU64, KS64:
		return append(out, t.intBits(v))
	case KString:
		p, n := c.storeBytes([]byte(v.(string)))
		return append(out, uint64(p), uint64(n))
	case KBytes:
		p, n := c.storeBytes(v.([]byte))
		return append(out, uint64(p), uint64(n))
	case KList:
		p, n := c.storeList(t, v.([]any))
		return append(out, uint64(p), uint64(n))
	case KRecord:
		m := v.(map[string]any)
		for _, f := range t.Fields {
			out = c.lowerFlat(f.Type, m[f.Name], out)
		}
		return out
	case KTuple:
		xs := v.([]any)
		for i, f := range t.Fields {
			out = c.lowerFlat(f.Type, xs[i], out)
		}
		return out
	case KVariant, KOption, KResult, KEnum:
		disc, payload, pt := t.caseOf(v)
		out = append(out, uint64(disc))
		start := len(out)
		if pt != nil {
			out = c.lowerFlat(pt, payload, out)
		}
		// The joined payload: the case's values (an i32 in an i64 slot is zero-extended, as
		// they already are), then zeros.
		for len(out) < start+len(t.flat)-1 {
			out = append(out, 0)
		}
		return out
	default: // a borrow of the instance's own resource is its representation
		return append(out, uint64(v.(Resource).rep))
	}
}

func (c *cx) loadString(ptr uint32) (string, []byte) {
	b := c.read(ptr, 8)
	p, n := binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:])
	data := c.read(p, n)
	return string(data), data
}

// load reads a value of type t at ptr (CanonicalABI.md, "load").
func (c *cx) load(t *Type, ptr uint32) any {
	if ptr%t.align != 0 {
		c.fault("a misaligned pointer")
	}
	switch t.Kind {
	case KBool:
		return c.read(ptr, 1)[0] != 0
	case KU8:
		return uint64(c.read(ptr, 1)[0])
	case KS8:
		return int64(int8(c.read(ptr, 1)[0]))
	case KU16:
		return uint64(binary.LittleEndian.Uint16(c.read(ptr, 2)))
	case KS16:
		return int64(int16(binary.LittleEndian.Uint16(c.read(ptr, 2))))
	case KU32:
		return uint64(binary.LittleEndian.Uint32(c.read(ptr, 4)))
	case KS32:
		return int64(int32(binary.LittleEndian.Uint32(c.read(ptr, 4))))
	case KU64:
		return binary.LittleEndian.Uint64(c.read(ptr, 8))
	case KS64:
		return int64(binary.LittleEndian.Uint64(c.read(ptr, 8)))
	case KString:
		s, _ := c.loadString(ptr)
		if !utf8.ValidString(s) {
			c.fault("a string that is not UTF-8")
		}
		return s
	case KBytes:
		_, data := c.loadString(ptr)
		return append([]byte(nil), data...)
	case KList:
		b := c.read(ptr, 8)
		p, n := binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:])
		if uint64(p)+uint64(n)*uint64(t.Elem.size) > uint64(c.s.memory.Size()) {
			c.fault("a list out of bounds")
		}
		out := make([]any, n)
		for i := range out {
			out[i] = c.load(t.Elem, p+uint32(i)*t.Elem.size)
		}
		return out
	case KRecord:
		m := make(map[string]any, len(t.Fields))
		for _, f := range t.Fields {
			m[f.Name] = c.load(f.Type, ptr+f.offset)
		}
		return m
	case KTuple:
		out := make([]any, len(t.Fields))
		for i, f := range t.Fields {
			out[i] = c.load(f.Type, ptr+f.offset)
		}
		return out
	case KVariant, KOption, KResult, KEnum:
		var buf [4]byte
		copy(buf[:], c.read(ptr, t.discSize))
		disc := binary.LittleEndian.Uint32(buf[:])
		var payload any
		if int(disc) < len(t.Cases) {
			if pt := t.Cases[disc].Type; pt != nil {
				payload = c.load(pt, ptr+t.payloadOff)
			}
		}
		return c.variantValue(t, disc, payload)
	default:
		return c.liftHandle(t, binary.LittleEndian.Uint32(c.read(ptr, 4)))
	}
}

func (c *cx) variantValue(t *Type, disc uint32, payload any) any {
	if int(disc) >= len(t.Cases) {
		c.fault("a discriminant out of range")
	}
	switch t.Kind {
	case KOption:
		return payload // nil for none
	case KEnum:
		return t.Cases[disc].Name
	}
	return Variant{Tag: t.Cases[disc].Name, Val: payload}
}

// liftHandle takes an own handle out of the instance's table (the caller owns it now).
func (c *cx) liftHandle(t *Type, h uint32) any {
	rep, ok := c.s.handles[h]
	if !ok {
		c.fault("unknown handle %d", h)
	}
	if t.Kind == KOwn {
		delete(c.s.handles, h)
	}
	return Resource{Type: t.Resource, rep: rep}
}

// liftFlat lifts a value of at most one flat value (a result returned in a register).
func (c *cx) liftFlat(t *Type, flat []uint64) any {
	v := flat[0]
	switch t.Kind {
	case KBool:
		return uint32(v) != 0
	case KU8:
		return uint64(uint8(v))
	case KU16:
		return uint64(uint16(v))
	case KU32:
		return uint64(uint32(v))
	case KS8:
		return int64(int8(v))
	case KS16:
		return int64(int16(v))
	case KS32:
		return int64(int32(v))
	case KU64:
		return v
	case KS64:
		return int64(v)
	case KEnum, KVariant, KOption, KResult: // only payload-free cases fit one flat value
		return c.variantValue(t, uint32(v), nil)
	case KOwn, KBorrow:
		return c.liftHandle(t, uint32(v))
	}
	c.fault("cannot lift a %v from one flat value", t.Kind)
	return nil
}
