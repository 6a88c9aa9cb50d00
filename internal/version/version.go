// Package version says which build of tpsched a binary is, for -version.
// The Makefile sets Version with -ldflags "-X tpsched/internal/version.Version=...";
// a plain go build falls back to what the Go toolchain stamped into the
// binary (the module's version, else the VCS revision).
package version

import (
	"runtime"
	"runtime/debug"
)

// Version is set at link time by the Makefile; empty in a plain go build.
var Version string

// String is the version: Version if set, else from the build information.
func String() string {
	if Version != "" {
		return Version
	}
	return fromBuildInfo(debug.ReadBuildInfo())
}

func fromBuildInfo(bi *debug.BuildInfo, ok bool) string {
	if !ok {
		return "unknown"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if rev == "" {
		return "devel"
	}
	return "devel-" + rev[:min(12, len(rev))] + dirty
}

// Line is what -version prints: "scdd v1.2.3 (go1.26.0 linux/amd64)".
func Line(program string) string {
	return program + " " + String() + " (" + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + ")"
}
