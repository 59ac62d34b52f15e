package deploy

import (
	"os"
	"os/exec"
	"regexp"
	"sort"
	"sync"
	"testing"

	"github.com/hermes-mobile/gateway/internal/testsvc"
)

// root is the repository, seen from this package's directory.
const root = ".."

// envVar finds the variable a flag's usage names: "... ($MOBILE_LISTEN)" or
// "... ($MOBILE_PROMPT_TTL, default 300)".
var envVar = regexp.MustCompile(`\(\$([A-Z][A-Z0-9_]*)[,)]`)

// otelVars are the standard OpenTelemetry variables that pkg/telemetry reads
// from the environment rather than as flags, and GOMEMLIMIT and GOMAXPROCS,
// which the Go runtime reads.
var otelVars = []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
	"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
	"OTEL_SERVICE_NAME", "GOMEMLIMIT", "GOMAXPROCS"}

var (
	buildOnce sync.Once
	builtVars map[string]map[string]bool
	buildErr  error
)

// acceptedEnv returns, for "edge" and "router", the environment variables
// the service accepts: those its -help lists, plus the OpenTelemetry ones.
// The services are built once per test binary.
func acceptedEnv(t *testing.T) map[string]map[string]bool {
	t.Helper()
	buildOnce.Do(func() {
		builtVars = map[string]map[string]bool{}
		for _, name := range []string{"edge", "router"} {
			bin, err := testsvc.BuildBinary("services/" + name)
			if err != nil {
				buildErr = err
				return
			}
			// -help prints the flags on stderr and exits 0.
			help := exec.Command(bin, "-help")
			help.Env = []string{"PATH=" + os.Getenv("PATH")}
			out, err := help.CombinedOutput()
			if err != nil {
				buildErr = &cmdError{name + " -help", err, out}
				return
			}
			vars := map[string]bool{}
			for _, m := range envVar.FindAllStringSubmatch(string(out), -1) {
				vars[m[1]] = true
			}
			for _, v := range otelVars {
				vars[v] = true
			}
			builtVars[name] = vars
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	if len(builtVars["edge"]) < 10 || !builtVars["edge"]["MOBILE_LISTEN"] || !builtVars["router"]["MOBILE_ROUTER_LISTEN"] {
		t.Fatalf("-help did not list the variables as expected: %v", builtVars)
	}
	return builtVars
}

// checkEnv fails for every name that service does not accept.
func checkEnv(t *testing.T, where, service string, names []string) {
	t.Helper()
	accepted := acceptedEnv(t)[service]
	if accepted == nil {
		t.Fatalf("%s: no service %q", where, service)
	}
	sort.Strings(names)
	for _, n := range names {
		if !accepted[n] {
			t.Errorf("%s sets %s, which hermes-%s does not accept (not in its -help)", where, n, service)
		}
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

type cmdError struct {
	cmd string
	err error
	out []byte
}

func (e *cmdError) Error() string { return e.cmd + ": " + e.err.Error() + "\n" + string(e.out) }
