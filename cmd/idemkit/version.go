package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// versionInfo is what `idemkit version` prints.
type versionInfo struct {
	Module   string `json:"module"`
	Version  string `json:"version"` // "(devel)" when built from a checkout without a version
	Go       string `json:"go"`
	Revision string `json:"revision,omitempty"`
	Time     string `json:"revision_time,omitempty"`
	Modified bool   `json:"modified,omitempty"` // built from a work tree with changes
}

// versionCmd runs `idemkit version`: the module version from the build
// information (runtime/debug.ReadBuildInfo), the commit it was built from
// when known, and the Go version.
func versionCmd(_ context.Context, cmd *command, args []string, out io.Writer) error {
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("version takes no arguments, got %q", pos)
	}
	v := versionInfo{Module: "github.com/idemkit/idemkit", Version: "(unknown)", Go: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		v.Module, v.Version = bi.Main.Path, bi.Main.Version
		if bi.GoVersion != "" {
			v.Go = bi.GoVersion
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				v.Revision = s.Value
			case "vcs.time":
				v.Time = s.Value
			case "vcs.modified":
				v.Modified = s.Value == "true"
			}
		}
	}
	if *asJSON {
		return writeJSON(out, v)
	}
	fmt.Fprintf(out, "idemkit %s (%s), %s", v.Version, v.Module, v.Go)
	if v.Revision != "" {
		fmt.Fprintf(out, ", commit %s", v.Revision)
		if v.Time != "" {
			fmt.Fprintf(out, " of %s", v.Time)
		}
		if v.Modified {
			fmt.Fprint(out, " with local changes")
		}
	}
	fmt.Fprintln(out)
	return nil
}
