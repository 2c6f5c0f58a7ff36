package clb

import (
	_ "embed"
	"fmt"
	"os"
	"strings"
	"sync"
)

// The schema the binary carries, so that it works from any folder. It is a copy of
// hosts/schema/clb-reconciler.json (`go generate` copies it; a test checks that they are equal).
//
//go:generate cp ../schema/clb-reconciler.json schema.json
//go:embed schema.json
var embeddedSchema string

// Param is a function's parameter.
type Param struct {
	Name string
	Type *Type
}

// Function is one function of the world: its trace name (Call), where the component exports
// it, its parameters and its result type (nil for a function without one).
type Function struct {
	Call      string
	Interface string
	Export    string
	Params    []Param
	Result    *Type
	// MethodOf is the resource this is a method of (`tracker`), or "".
	MethodOf string

	paramTuple *Type // the parameters as one tuple: their layout when passed in memory
}

func (f *Function) isRoot() bool {
	return strings.HasPrefix(f.Export, "[static]") || strings.HasPrefix(f.Export, "[constructor]")
}

// Schema is the functions of the world, by trace name.
type Schema struct {
	Package   string
	Functions map[string]*Function
	order     []*Function
	Source    string
}

// Function is the function named call, or nil.
func (s *Schema) Function(call string) *Function { return s.Functions[call] }

// ParseSchema compiles a schema text (docs/traces.md, "The schema").
func ParseSchema(text, source string) (*Schema, error) {
	j, err := ParseJSON(text)
	if err != nil {
		return nil, schemaErr("%s: not JSON: %v", source, err)
	}
	pkg, fns := j.Get("package"), j.Get("functions")
	if pkg == nil || pkg.Kind != JSONString || fns == nil || fns.Kind != JSONArray {
		return nil, schemaErr("%s: the schema is {\"package\":…,\"functions\":[…]}", source)
	}
	s := &Schema{Package: pkg.Text, Functions: map[string]*Function{}, Source: source}
	for _, fj := range fns.Items {
		f := &Function{}
		for _, key := range []string{"call", "interface", "export"} {
			v := fj.Get(key)
			if v == nil || v.Kind != JSONString {
				return nil, schemaErr("%s: a function lacks `%s`", source, key)
			}
			switch key {
			case "call":
				f.Call = v.Text
			case "interface":
				f.Interface = v.Text
			case "export":
				f.Export = v.Text
			}
		}
		params, result := fj.Get("params"), fj.Get("result")
		if params == nil || params.Kind != JSONArray || result == nil {
			return nil, schemaErr("%s: %s lacks `params` or `result`", source, f.Call)
		}
		tuple := &Type{Kind: KTuple}
		for _, pj := range params.Items {
			name, ty := pj.Get("name"), pj.Get("type")
			if name == nil || name.Kind != JSONString || ty == nil || len(pj.Keys) != 2 {
				return nil, schemaErr("%s: %s: a parameter is {\"name\":…,\"type\":…}", source, f.Call)
			}
			t, err := compileType(ty, fmt.Sprintf("%s(%s)", f.Call, name.Text))
			if err != nil {
				return nil, err
			}
			f.Params = append(f.Params, Param{name.Text, t})
			tuple.Fields = append(tuple.Fields, Field{Type: t})
		}
		f.paramTuple = finish(tuple)
		if result.Kind != JSONNull {
			if f.Result, err = compileType(result, f.Call+"->"); err != nil {
				return nil, err
			}
		}
		if len(f.Params) > 0 && f.Params[0].Name == "self" && f.Params[0].Type.Kind == KBorrow {
			f.MethodOf = f.Params[0].Type.Resource
		}
		for i, p := range f.Params {
			if p.Type.hasResource && !(i == 0 && f.MethodOf != "") {
				return nil, schemaErr("%s: %s: unsupported: a resource parameter besides `self`", source, f.Call)
			}
		}
		if _, dup := s.Functions[f.Call]; dup {
			return nil, schemaErr("%s: the call `%s` twice", source, f.Call)
		}
		s.Functions[f.Call] = f
		s.order = append(s.order, f)
	}
	return s, nil
}

// interfaces are the schema's interfaces, in order of first appearance.
func (s *Schema) interfaces() []string {
	var out []string
	for _, f := range s.order {
		found := false
		for _, i := range out {
			found = found || i == f.Interface
		}
		if !found {
			out = append(out, f.Interface)
		}
	}
	return out
}

var (
	defaultSchemaOnce sync.Once
	defaultSchema     *Schema
	defaultSchemaErr  error
)

// DefaultSchema is the schema in the file named by CLB_SCHEMA, else the one built in.
func DefaultSchema() (*Schema, error) {
	defaultSchemaOnce.Do(func() {
		if path := os.Getenv("CLB_SCHEMA"); path != "" {
			defaultSchema, defaultSchemaErr = LoadSchema(path)
			return
		}
		defaultSchema, defaultSchemaErr = ParseSchema(embeddedSchema, "the built-in schema")
	})
	return defaultSchema, defaultSchemaErr
}

// LoadSchema reads and compiles a schema file.
func LoadSchema(path string) (*Schema, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, schemaErr("%s: cannot read the schema: %v", path, err)
	}
	return ParseSchema(string(text), path)
}
