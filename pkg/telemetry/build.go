package telemetry

import (
	"github.com/hermes-mobile/gateway/pkg/ids"

	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// Version is the release the binary was built as, stamped at build time
// (go build -ldflags "-X github.com/hermes-mobile/gateway/pkg/telemetry.Version=v1.2.3");
// "dev" when not stamped.
var Version = "dev"

// Build describes the running binary.
type Build struct {
	Version  string // Version
	Module   string // the main module and its version, e.g. github.com/hermes-mobile/gateway@(devel); "" if unknown
	Revision string // the VCS revision go build stamped, "unknown" without one
	Modified bool   // the working tree had uncommitted changes
	Go       string // the Go version it was built with
}

// ReadBuild returns what the binary knows of its build.
func ReadBuild() Build {
	b := Build{Version: Version, Revision: "unknown", Go: runtime.Version()}
	if info, ok := debug.ReadBuildInfo(); ok {
		if info.Main.Path != "" {
			b.Module = info.Main.Path + "@" + info.Main.Version
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Revision = s.Value
			case "vcs.modified":
				b.Modified = s.Value == "true"
			}
		}
	}
	return b
}

// VersionLine is what a command's -version prints: its name, Version,
// the main module's version (a tag for go install …@v1.2.3, "(devel)"
// for a build from a clone), the VCS revision and the Go version.
func VersionLine(cmd string) string {
	b := ReadBuild()
	line := fmt.Sprintf("%s %s", cmd, b.Version)
	if b.Module != "" {
		line += " " + b.Module
	}
	line += " revision " + b.Revision
	if b.Modified {
		line += " (modified)"
	}
	return line + " " + b.Go
}

// instanceID names this process among the replicas (service.instance.id).
var instanceID = ids.Hex(8)

// buildInfo is hermes_build_info: 1, labelled with the build.
func buildInfo(service string) prometheus.Collector {
	b := ReadBuild()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "hermes_build_info",
		Help: "1, labelled with the service, its version, VCS revision and Go version.",
		ConstLabels: prometheus.Labels{
			"service": service, "version": b.Version, "revision": b.Revision, "goversion": b.Go,
		},
	})
	g.Set(1)
	return g
}
