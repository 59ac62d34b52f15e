package gateway_test

import (
	"flag"
	"os"
	"runtime"
	"strconv"
	"testing"
)

// TestMain runs more of this package's parallel tests at once than the
// machine has cores when -parallel is not given: they mostly wait (on
// real timeouts, slow readers, servers killed and restarted), not
// compute, so this shortens the package without starving them. Five runs
// under -race then fit go test's default 10-minute timeout on 2 cores.
func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		flag.Set("test.parallel", strconv.Itoa(max(4, 2*runtime.GOMAXPROCS(0))))
	}
	os.Exit(m.Run())
}
