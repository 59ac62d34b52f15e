package testsvc

import (
	"flag"
	"os"
	"regexp"
	"testing"
)

// envName finds the variable a pkg/config flag falls back to: its usage
// says "($NAME" .
var envName = regexp.MustCompile(`\(\$([A-Z0-9_]+)`)

// ClearEnv unsets, for the test, every variable the flags of fs fall back
// to, and extra, so the environment the tests run in does not leak into
// them. The old values come back after the test.
func ClearEnv(t *testing.T, fs *flag.FlagSet, extra ...string) {
	t.Helper()
	vars := extra
	fs.VisitAll(func(f *flag.Flag) {
		if m := envName.FindStringSubmatch(f.Usage); m != nil {
			vars = append(vars, m[1])
		}
	})
	for _, v := range vars {
		t.Setenv(v, "")    // restores the old value after the test
		_ = os.Unsetenv(v) // fails only for a name with '=' or NUL
	}
}
