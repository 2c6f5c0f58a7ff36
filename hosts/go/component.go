package clb

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// Defaults of clb-host (`impl Default for Limits` in crates/sandbox/src/lib.rs), but for fuel:
// wazero does not meter instructions, so the deadline is this host's only bound on a call's time.
const (
	DefaultDeadline  = 10 * time.Second
	DefaultMemoryMiB = 512
)

// Limits bound each call into the guest.
type Limits struct {
	// Deadline is a call's wall-clock bound (a context deadline; wazero then stops the guest).
	Deadline time.Duration
	// MemoryMiB caps an instance's linear memory.
	MemoryMiB uint32
}

// Options for Load. The zero value is the defaults.
type Options struct {
	Limits Limits
	// Schema overrides DefaultSchema.
	Schema *Schema
	// Logger receives the guest's diagnostics (default: warnings and errors to stderr).
	Logger *slog.Logger
}

// LoadError is a component that cannot be loaded: unreadable, not a component, or one this host
// refuses (an import it does not grant, a function that differs from the schema).
type LoadError struct{ Message string }

func (e *LoadError) Error() string { return e.Message }

func loadErr(format string, a ...any) error { return &LoadError{fmt.Sprintf(format, a...)} }

// The package this host speaks, and the interfaces a component may import.
const (
	packageName = "clb:reconciler"
	hostMajor   = 0
	hostMinor   = 14
)

var grantedInterfaces = []string{"diagnostics", "types"}

// Component is a loaded version of the logic: its core module compiled once, checked against
// the schema and the import allow-list, instantiated per tracker, pool queue or run of pure
// calls (a Session).
type Component struct {
	Path    string
	SHA256  string
	Package string
	Limits  Limits
	Schema  *Schema

	runtime wazero.Runtime
	module  wazero.CompiledModule
	exports map[string]string // call -> the core export's name
	logger  *slog.Logger
	pure    *Session
}

// LoadFile reads and loads the component at path.
func LoadFile(path string, opts Options) (*Component, error) {
	wasm, err := os.ReadFile(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, loadErr("%s: cannot read the component: %v", path, err)
	}
	return Load(path, wasm, opts)
}

// compilationCache shares compiled code between the components of one process that have the
// same core module (wazero keys it by the module's bytes).
var compilationCache = wazero.NewCompilationCache()

// Load loads a component from its bytes; where names it in messages.
func Load(where string, wasm []byte, opts Options) (*Component, error) {
	limits := opts.Limits
	if limits.Deadline == 0 {
		limits.Deadline = DefaultDeadline
	}
	if limits.MemoryMiB == 0 {
		limits.MemoryMiB = DefaultMemoryMiB
	}
	schema := opts.Schema
	if schema == nil {
		var err error
		if schema, err = DefaultSchema(); err != nil {
			return nil, &LoadError{err.Error()}
		}
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	sum := sha256.Sum256(wasm)
	c := &Component{Path: where, SHA256: hex.EncodeToString(sum[:]), Limits: limits, Schema: schema, logger: logger}
	core, err := CoreModule(wasm)
	if err != nil {
		return nil, loadErr("%s: %v", where, err)
	}
	ctx := context.Background()
	cfg := wazero.NewRuntimeConfig().
		WithCloseOnContextDone(true).
		WithMemoryLimitPages(limits.MemoryMiB * 16). // 64 KiB pages
		WithCompilationCache(compilationCache)
	c.runtime = wazero.NewRuntimeWithConfig(ctx, cfg)
	c.module, err = c.runtime.CompileModule(ctx, core)
	if err != nil {
		c.runtime.Close(ctx)
		return nil, loadErr("%s: the component's core module does not compile: %v", where, err)
	}
	if err := c.check(where); err != nil {
		c.runtime.Close(ctx)
		return nil, err
	}
	if err := c.provideImports(ctx, where); err != nil {
		c.runtime.Close(ctx)
		return nil, err
	}
	return c, nil
}

// Close releases the compiled code and every instance of the component.
func (c *Component) Close() error { return c.runtime.Close(context.Background()) }

// CoreModule is the core module of a component binary that holds the logic: of the core
// modules at the top level of the component (section id 1), the one that exports
// `cabi_realloc`. wit-component puts it beside small shim modules that only forward the lowered
// imports, which this host provides directly instead.
func CoreModule(wasm []byte) ([]byte, error) {
	if len(wasm) < 8 || !bytes.Equal(wasm[:4], []byte("\x00asm")) {
		return nil, errors.New("not a WebAssembly binary")
	}
	if !bytes.Equal(wasm[4:8], []byte{0x0d, 0x00, 0x01, 0x00}) {
		if bytes.Equal(wasm[4:8], []byte{1, 0, 0, 0}) {
			return nil, errors.New("a core module, not a component")
		}
		return nil, errors.New("not a WebAssembly component (unknown version or layer)")
	}
	var best []byte
	for i := 8; i < len(wasm); {
		id := wasm[i]
		size, n := uleb(wasm[i+1:])
		if n == 0 || uint64(len(wasm)-i-1-n) < size {
			return nil, fmt.Errorf("a malformed section at byte %d", i)
		}
		body := wasm[i+1+n : i+1+n+int(size)]
		i += 1 + n + int(size)
		if id == 1 && exportsFunction(body, "cabi_realloc") && len(body) > len(best) {
			best = body
		}
	}
	if best == nil {
		return nil, errors.New("no core module exporting cabi_realloc in the component")
	}
	return best, nil
}

func uleb(b []byte) (uint64, int) {
	var v uint64
	for i := 0; i < len(b) && i < 10; i++ {
		v |= uint64(b[i]&0x7f) << (7 * i)
		if b[i] < 0x80 {
			return v, i + 1
		}
	}
	return 0, 0
}

// exportsFunction reads a core module's export section (id 7) for a function named name.
func exportsFunction(mod []byte, name string) bool {
	if len(mod) < 8 {
		return false
	}
	for i := 8; i < len(mod); {
		id := mod[i]
		size, n := uleb(mod[i+1:])
		if n == 0 || uint64(len(mod)-i-1-n) < size {
			return false
		}
		body := mod[i+1+n : i+1+n+int(size)]
		i += 1 + n + int(size)
		if id != 7 {
			continue
		}
		count, k := uleb(body)
		p := k
		for e := uint64(0); e < count && p < len(body); e++ {
			l, k := uleb(body[p:])
			if k == 0 || p+k+int(l)+1 > len(body) {
				return false
			}
			s := string(body[p+k : p+k+int(l)])
			kind := body[p+k+int(l)]
			_, k2 := uleb(body[p+k+int(l)+1:])
			p += k + int(l) + 1 + k2
			if s == name && kind == 0 {
				return true
			}
		}
		return false
	}
	return false
}

var interfaceName = regexp.MustCompile(`^([^/@]+)/([^/@#]+)@(\d+)\.(\d+)\.(\d+)(?:[-+][^#]*)?$`)

// compatible: the same package at a semver-compatible version (for 0.x, the same minor), as
// clb-host's `compatible`.
func compatible(a, b string) bool {
	ma, mb := interfaceName.FindStringSubmatch(a), interfaceName.FindStringSubmatch(b)
	if ma == nil || mb == nil || ma[1] != mb[1] || ma[2] != mb[2] || ma[3] != mb[3] {
		return false
	}
	return ma[3] != "0" || ma[4] == mb[4]
}

func flatSignature(f *Function) (params, results []api.ValueType) {
	var flat []flatType
	for _, p := range f.Params {
		flat = append(flat, p.Type.flat...)
	}
	if len(flat) > maxFlatParams {
		flat = []flatType{i32}
	}
	for _, t := range flat {
		params = append(params, valueType(t))
	}
	if f.Result != nil {
		if len(f.Result.flat) > maxFlatResults {
			results = []api.ValueType{api.ValueTypeI32}
		} else {
			results = []api.ValueType{valueType(f.Result.flat[0])}
		}
	}
	return params, results
}

func valueType(t flatType) api.ValueType {
	if t == i64 {
		return api.ValueTypeI64
	}
	return api.ValueTypeI32
}

// check finds every function of the schema among the core module's exports, with the core
// signature its WIT types flatten to (the canonical ABI), and the package version.
func (c *Component) check(where string) error {
	exported := c.module.ExportedFunctions()
	ifaces := map[string]string{} // schema interface -> the component's
	for name := range exported {
		iface, _, ok := strings.Cut(name, "#")
		if !ok || strings.HasPrefix(name, "cabi_") {
			continue
		}
		for _, want := range c.Schema.interfaces() {
			if compatible(iface, want) {
				ifaces[want] = iface
			}
		}
	}
	c.exports = map[string]string{}
	for _, want := range c.Schema.interfaces() {
		got, ok := ifaces[want]
		if !ok {
			return loadErr("%s: the component does not export `%s` or a compatible version", where, want)
		}
		if c.Package == "" {
			m := interfaceName.FindStringSubmatch(got)
			c.Package = m[1] + "@" + m[3] + "." + m[4] + "." + m[5]
		}
	}
	for _, f := range c.Schema.order {
		name := ifaces[f.Interface] + "#" + f.Export
		def, ok := exported[name]
		if !ok {
			return loadErr("%s: the component does not export `%s` (the schema's `%s`)", where, name, f.Call)
		}
		params, results := flatSignature(f)
		if !slices.Equal(def.ParamTypes(), params) || !slices.Equal(def.ResultTypes(), results) {
			return loadErr("%s: `%s` differs from the schema (%s): core signature %v -> %v, the schema's types flatten to %v -> %v",
				where, f.Call, c.Schema.Source, def.ParamTypes(), def.ResultTypes(), params, results)
		}
		c.exports[f.Call] = name
	}
	if _, ok := exported["cabi_realloc"]; !ok {
		return loadErr("%s: the core module lacks cabi_realloc", where)
	}
	if _, ok := c.module.ExportedMemories()["memory"]; !ok {
		return loadErr("%s: the core module exports no memory", where)
	}
	return nil
}

// provideImports grants the guest diagnostics (log, panicked) and the canonical built-ins of
// its own resources; any other import refuses the component.
func (c *Component) provideImports(ctx context.Context, where string) error {
	byModule := map[string][]api.FunctionDefinition{}
	var order []string
	for _, f := range c.module.ImportedFunctions() {
		mod, _, _ := f.Import()
		if _, seen := byModule[mod]; !seen {
			order = append(order, mod)
		}
		byModule[mod] = append(byModule[mod], f)
	}
	for _, m := range c.module.ImportedMemories() {
		mod, name, _ := m.Import()
		return loadErr("%s: the component imports the memory `%s.%s`, which this host does not grant", where, mod, name)
	}
	for _, mod := range order {
		builder := c.runtime.NewHostModuleBuilder(mod)
		exportIface, isExport := strings.CutPrefix(mod, "[export]")
		m := interfaceName.FindStringSubmatch(exportIface)
		granted := m != nil && m[1] == packageName && m[3] == strconv.Itoa(hostMajor) && m[4] == strconv.Itoa(hostMinor)
		if !isExport {
			granted = granted && slices.Contains(grantedInterfaces, m[2])
		}
		for _, f := range byModule[mod] {
			_, name, _ := f.Import()
			var fn api.GoModuleFunc
			var params, results []api.ValueType
			I32 := api.ValueTypeI32
			switch {
			case !granted:
			case !isExport && m[2] == "diagnostics" && name == "log":
				fn, params = c.diagLog, []api.ValueType{I32, I32, I32}
			case !isExport && m[2] == "diagnostics" && name == "panicked":
				fn, params = diagPanicked(c.logger), []api.ValueType{I32, I32}
			case isExport && strings.HasPrefix(name, "[resource-new]"):
				fn, params, results = resourceNew, []api.ValueType{I32}, []api.ValueType{I32}
			case isExport && strings.HasPrefix(name, "[resource-rep]"):
				fn, params, results = resourceRep, []api.ValueType{I32}, []api.ValueType{I32}
			case isExport && strings.HasPrefix(name, "[resource-drop]"):
				fn, params = resourceDrop, []api.ValueType{I32}
			}
			if fn == nil {
				return loadErr("%s: the component imports `%s`#`%s`, which this host does not grant (it grants only %s/{%s}@%d.%d.x)",
					where, mod, name, packageName, strings.Join(grantedInterfaces, ","), hostMajor, hostMinor)
			}
			if !slices.Equal(f.ParamTypes(), params) || !slices.Equal(f.ResultTypes(), results) {
				return loadErr("%s: the component imports `%s`#`%s` with an unexpected signature", where, mod, name)
			}
			builder.NewFunctionBuilder().WithGoModuleFunction(fn, params, results).Export(name)
		}
		if _, err := builder.Instantiate(ctx); err != nil {
			return loadErr("%s: %v", where, err)
		}
	}
	return nil
}

var levels = []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError}

func (c *Component) diagLog(ctx context.Context, mod api.Module, stack []uint64) {
	level, ptr, n := uint32(stack[0]), uint32(stack[1]), uint32(stack[2])
	msg, ok := mod.Memory().Read(ptr, n)
	if !ok || level >= uint32(len(levels)) || !validUTF8(string(msg)) {
		panic(errors.New("diagnostics.log: an argument out of bounds"))
	}
	c.logger.Log(ctx, levels[level], string(msg), "source", "guest")
}

func diagPanicked(logger *slog.Logger) api.GoModuleFunc {
	return func(ctx context.Context, mod api.Module, stack []uint64) {
		msg, ok := mod.Memory().Read(uint32(stack[0]), uint32(stack[1]))
		if !ok {
			panic(errors.New("diagnostics.panicked: an argument out of bounds"))
		}
		text := strings.ToValidUTF8(string(msg), "\uFFFD")
		logger.Error("guest panic: "+text, "source", "guest")
		if s := sessionOf(ctx); s != nil {
			s.panic = text
		}
	}
}

// The canonical built-ins of a resource the guest exports: its handle table lives in the
// Session of the calling instance.
func resourceNew(ctx context.Context, _ api.Module, stack []uint64) {
	s := sessionOf(ctx)
	s.nextHandle++
	s.handles[s.nextHandle] = uint32(stack[0])
	stack[0] = uint64(s.nextHandle)
}

func resourceRep(ctx context.Context, _ api.Module, stack []uint64) {
	s := sessionOf(ctx)
	rep, ok := s.handles[uint32(stack[0])]
	if !ok {
		panic(errors.New("resource-rep: unknown handle"))
	}
	stack[0] = uint64(rep)
}

func resourceDrop(ctx context.Context, _ api.Module, stack []uint64) {
	s := sessionOf(ctx)
	if _, ok := s.handles[uint32(stack[0])]; !ok {
		panic(errors.New("resource-drop: unknown handle"))
	}
	delete(s.handles, uint32(stack[0]))
}
