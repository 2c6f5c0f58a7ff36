package clb

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// JSONKind is the kind of a parsed JSON value.
type JSONKind uint8

// The kinds of JSON values.
const (
	JSONNull JSONKind = iota
	JSONBool
	JSONNumber
	JSONString
	JSONArray
	JSONObject
)

// JSON is a parsed JSON value that keeps what the canonical encoding needs and Go's
// encoding/json loses: the order of an object's keys, the exact text of numbers (a u64 is past
// float64) and the text span of each value (a trace's args and result are compared as written).
type JSON struct {
	Kind  JSONKind
	Bool  bool
	Text  string  // a string's value, or a number's text
	Items []*JSON // an array's elements
	Keys  []string
	Vals  []*JSON // an object's members, in order
	start int
	end   int
}

// Get is the member named key of an object, or nil.
func (j *JSON) Get(key string) *JSON {
	if j == nil || j.Kind != JSONObject {
		return nil
	}
	for i, k := range j.Keys {
		if k == key {
			return j.Vals[i]
		}
	}
	return nil
}

// Uint is the value of a number that is a whole number from 0 below 2^64.
func (j *JSON) Uint() (uint64, bool) {
	if j == nil || j.Kind != JSONNumber || !isInteger(j.Text) || strings.HasPrefix(j.Text, "-") {
		return 0, false
	}
	v, err := strconv.ParseUint(j.Text, 10, 64)
	return v, err == nil
}

// ParseJSON parses text strictly: one value, no duplicate keys, valid UTF-8 and escapes.
func ParseJSON(text string) (*JSON, error) {
	p := parser{s: text}
	p.ws()
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.ws()
	if p.i != len(p.s) {
		return nil, fmt.Errorf("trailing characters at column %d", p.i+1)
	}
	return v, nil
}

// Raw is the text the value was parsed from (within the text given to ParseJSON).
func (j *JSON) raw(text string) string { return text[j.start:j.end] }

type parser struct {
	s string
	i int
}

const maxDepth = 512

func (p *parser) ws() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *parser) fail(what string) error {
	if p.i >= len(p.s) {
		return fmt.Errorf("%s at the end of the text", what)
	}
	return fmt.Errorf("%s at column %d", what, p.i+1)
}

func (p *parser) value(depth int) (*JSON, error) {
	if depth > maxDepth {
		return nil, errors.New("nested too deeply")
	}
	if p.i >= len(p.s) {
		return nil, p.fail("expected a value")
	}
	start := p.i
	var v *JSON
	switch c := p.s[p.i]; {
	case c == '{':
		p.i++
		v = &JSON{Kind: JSONObject}
		p.ws()
		if p.i < len(p.s) && p.s[p.i] == '}' {
			p.i++
			break
		}
		seen := map[string]bool{}
		for {
			p.ws()
			if p.i >= len(p.s) || p.s[p.i] != '"' {
				return nil, p.fail("expected a key")
			}
			k, err := p.str()
			if err != nil {
				return nil, err
			}
			if seen[k] {
				return nil, fmt.Errorf("duplicate key %s", quote(k))
			}
			seen[k] = true
			p.ws()
			if p.i >= len(p.s) || p.s[p.i] != ':' {
				return nil, p.fail("expected `:`")
			}
			p.i++
			p.ws()
			x, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			v.Keys = append(v.Keys, k)
			v.Vals = append(v.Vals, x)
			p.ws()
			if p.i < len(p.s) && p.s[p.i] == ',' {
				p.i++
				continue
			}
			if p.i < len(p.s) && p.s[p.i] == '}' {
				p.i++
				break
			}
			return nil, p.fail("expected `,` or `}`")
		}
	case c == '[':
		p.i++
		v = &JSON{Kind: JSONArray, Items: []*JSON{}}
		p.ws()
		if p.i < len(p.s) && p.s[p.i] == ']' {
			p.i++
			break
		}
		for {
			p.ws()
			x, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			v.Items = append(v.Items, x)
			p.ws()
			if p.i < len(p.s) && p.s[p.i] == ',' {
				p.i++
				continue
			}
			if p.i < len(p.s) && p.s[p.i] == ']' {
				p.i++
				break
			}
			return nil, p.fail("expected `,` or `]`")
		}
	case c == '"':
		s, err := p.str()
		if err != nil {
			return nil, err
		}
		v = &JSON{Kind: JSONString, Text: s}
	case c == 't' && strings.HasPrefix(p.s[p.i:], "true"):
		p.i += 4
		v = &JSON{Kind: JSONBool, Bool: true}
	case c == 'f' && strings.HasPrefix(p.s[p.i:], "false"):
		p.i += 5
		v = &JSON{Kind: JSONBool}
	case c == 'n' && strings.HasPrefix(p.s[p.i:], "null"):
		p.i += 4
		v = &JSON{Kind: JSONNull}
	case c == '-' || (c >= '0' && c <= '9'):
		n, err := p.number()
		if err != nil {
			return nil, err
		}
		v = &JSON{Kind: JSONNumber, Text: n}
	default:
		return nil, p.fail("expected a value")
	}
	v.start, v.end = start, p.i
	return v, nil
}

func (p *parser) number() (string, error) {
	start := p.i
	digits := func() int {
		n := 0
		for p.i < len(p.s) && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
			p.i++
			n++
		}
		return n
	}
	if p.s[p.i] == '-' {
		p.i++
	}
	if p.i < len(p.s) && p.s[p.i] == '0' {
		p.i++
	} else if digits() == 0 {
		return "", p.fail("bad number")
	}
	if p.i < len(p.s) && p.s[p.i] == '.' {
		p.i++
		if digits() == 0 {
			return "", p.fail("bad number")
		}
	}
	if p.i < len(p.s) && (p.s[p.i] == 'e' || p.s[p.i] == 'E') {
		p.i++
		if p.i < len(p.s) && (p.s[p.i] == '+' || p.s[p.i] == '-') {
			p.i++
		}
		if digits() == 0 {
			return "", p.fail("bad number")
		}
	}
	return p.s[start:p.i], nil
}

func isInteger(n string) bool {
	return !strings.ContainsAny(n, ".eE")
}

func (p *parser) str() (string, error) {
	p.i++ // the opening quote
	var b strings.Builder
	for {
		if p.i >= len(p.s) {
			return "", p.fail("unterminated string")
		}
		c := p.s[p.i]
		switch {
		case c == '"':
			p.i++
			return b.String(), nil
		case c < 0x20:
			return "", p.fail("a control character in a string")
		case c == '\\':
			if p.i+1 >= len(p.s) {
				return "", p.fail("unterminated string")
			}
			e := p.s[p.i+1]
			p.i += 2
			switch e {
			case '"', '\\', '/':
				b.WriteByte(e)
			case 'b':
				b.WriteByte('\b')
			case 'f':
				b.WriteByte('\f')
			case 'n':
				b.WriteByte('\n')
			case 'r':
				b.WriteByte('\r')
			case 't':
				b.WriteByte('\t')
			case 'u':
				r, err := p.hex4()
				if err != nil {
					return "", err
				}
				if utf16.IsSurrogate(r) {
					if r >= 0xdc00 || !strings.HasPrefix(p.s[p.i:], `\u`) {
						return "", p.fail("a lone surrogate is not valid Unicode")
					}
					p.i += 2
					r2, err := p.hex4()
					if err != nil {
						return "", err
					}
					r = utf16.DecodeRune(r, r2)
					if r == utf8.RuneError {
						return "", p.fail("a lone surrogate is not valid Unicode")
					}
				}
				b.WriteRune(r)
			default:
				return "", p.fail("bad escape")
			}
		default:
			r, size := utf8.DecodeRuneInString(p.s[p.i:])
			if r == utf8.RuneError && size <= 1 {
				return "", p.fail("not UTF-8")
			}
			b.WriteString(p.s[p.i : p.i+size])
			p.i += size
		}
	}
}

func (p *parser) hex4() (rune, error) {
	if p.i+4 > len(p.s) {
		return 0, p.fail("bad \\u escape")
	}
	v, err := strconv.ParseUint(p.s[p.i:p.i+4], 16, 32)
	if err != nil {
		return 0, p.fail("bad \\u escape")
	}
	p.i += 4
	return rune(v), nil
}

// appendString writes s as the canonical encoding writes a string (docs/traces.md): `"` and `\`
// escaped, control characters as \b \f \n \r \t or \u00xx, everything else as itself. Not
// encoding/json's, which also escapes <, >, & and U+2028.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"':
			b = append(b, '\\', '"')
		case '\\':
			b = append(b, '\\', '\\')
		case '\b':
			b = append(b, '\\', 'b')
		case '\f':
			b = append(b, '\\', 'f')
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

func quote(s string) string { return string(appendString(nil, s)) }

// Canonical is the canonical text of a parsed JSON value (keys in their order).
func (j *JSON) Canonical() string { return string(j.appendTo(nil)) }

func (j *JSON) appendTo(b []byte) []byte {
	switch j.Kind {
	case JSONNull:
		return append(b, "null"...)
	case JSONBool:
		return strconv.AppendBool(b, j.Bool)
	case JSONNumber:
		return append(b, j.Text...)
	case JSONString:
		return appendString(b, j.Text)
	case JSONArray:
		b = append(b, '[')
		for i, x := range j.Items {
			if i > 0 {
				b = append(b, ',')
			}
			b = x.appendTo(b)
		}
		return append(b, ']')
	default:
		b = append(b, '{')
		for i, k := range j.Keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k)
			b = append(b, ':')
			b = j.Vals[i].appendTo(b)
		}
		return append(b, '}')
	}
}

func jsonTypeName(j *JSON) string {
	switch j.Kind {
	case JSONNull:
		return "null"
	case JSONBool:
		return "a boolean"
	case JSONNumber:
		if isInteger(j.Text) {
			return "a number"
		}
		return "a fractional number"
	case JSONString:
		return "a string"
	case JSONArray:
		return "an array"
	default:
		return "an object"
	}
}
