// Command replay replays traces (docs/traces.md) through a component and compares every result
// with the recorded one, as `clb-host replay` does:
//
//	replay TRACE... --component FILE [--swap-component NAME=FILE]... [--json] [--all-divergences]
//
// Exit 0: every result is identical; 1: a result differs; 2: a trace cannot be read or replayed
// (`error: FILE:LINE: why` on stderr), or a component cannot be loaded.
package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	clb "clb-reconciler/hosts/go"
)

const usage = "usage: replay TRACE... --component FILE [--swap-component NAME=FILE]... [--json] [--all-divergences]"

type options struct {
	traces    []string
	component string
	swaps     [][2]string
	json, all bool
}

func parseArgs(argv []string) (*options, error) {
	o := &options{}
	for i := 0; i < len(argv); i++ {
		a := argv[i]
		var val *string
		if strings.HasPrefix(a, "--") {
			if k, v, ok := strings.Cut(a, "="); ok {
				a, val = k, &v
			}
		}
		value := func() (string, error) {
			if val != nil {
				return *val, nil
			}
			if i+1 >= len(argv) {
				return "", fmt.Errorf("%s needs a value", a)
			}
			i++
			return argv[i], nil
		}
		switch a {
		case "--component":
			v, err := value()
			if err != nil {
				return nil, err
			}
			o.component = v
		case "--swap-component":
			v, err := value()
			if err != nil {
				return nil, err
			}
			name, file, ok := strings.Cut(v, "=")
			if !ok || name == "" || file == "" {
				return nil, fmt.Errorf("--swap-component %q: expected NAME=FILE", v)
			}
			o.swaps = append(o.swaps, [2]string{name, file})
		case "--json":
			o.json = true
		case "--all-divergences":
			o.all = true
		case "--help", "-h":
			fmt.Println(usage)
			os.Exit(0)
		case "--":
			o.traces = append(o.traces, argv[i+1:]...)
			i = len(argv)
		default:
			if strings.HasPrefix(a, "-") && a != "-" {
				return nil, fmt.Errorf("unknown option %s", a)
			}
			o.traces = append(o.traces, argv[i])
		}
	}
	if len(o.traces) == 0 {
		return nil, errors.New("no trace given")
	}
	return o, nil
}

func fail(format string, a ...any) int {
	fmt.Fprintf(os.Stderr, "error: "+format+"\n", a...)
	return clb.ExitUnreadable
}

func run() int {
	o, err := parseArgs(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, usage)
		return fail("%v", err)
	}
	if o.component == "" {
		return fail("--component FILE is required (the Go host has no built-in component)")
	}
	primary, err := clb.LoadFile(o.component, clb.Options{})
	if err != nil {
		return fail("%v", err)
	}
	real := func(p string) string {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		a, _ := filepath.Abs(p)
		return a
	}
	loaded := map[string]*clb.Component{real(o.component): primary}
	named := map[string]*clb.Component{}
	for _, s := range o.swaps {
		key := real(s[1])
		c := loaded[key]
		if c == nil {
			if c, err = clb.LoadFile(s[1], clb.Options{}); err != nil {
				return fail("%v", err)
			}
			loaded[key] = c
		}
		named[s[0]] = c
	}
	var reports []*clb.TraceReport
	identical := true
	for _, path := range o.traces {
		r, err := clb.ReplayFile(path, primary, named, o.all)
		if err != nil {
			var te *clb.TraceError
			if errors.As(err, &te) {
				return fail("%s:%d: %s", path, te.Line, te.Message)
			}
			return fail("%s: %v", path, err)
		}
		reports = append(reports, r)
		identical = identical && len(r.Divergences) == 0
	}
	if o.json {
		os.Stdout.WriteString(clb.JSONReport(reports, o.all) + "\n")
	} else {
		os.Stdout.WriteString(clb.TextReport(reports, o.all))
	}
	if identical {
		return clb.ExitIdentical
	}
	return clb.ExitDiverged
}

func main() { os.Exit(run()) }
