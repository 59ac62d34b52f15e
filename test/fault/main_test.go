//go:build unix

package fault

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/hermes-mobile/gateway/internal/testsvc"
)

// bins are the binaries TestMain built.
var bins struct {
	edge, router string
}

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	// FAULT_BINARIES: a directory with edge and router built elsewhere (an
	// older commit, a release) to run the test against instead.
	if d := os.Getenv("FAULT_BINARIES"); d != "" {
		bins.edge, bins.router = filepath.Join(d, "edge"), filepath.Join(d, "router")
		return m.Run()
	}
	// Built without -race: the processes are what is tested, the race
	// detector watches the test binary.
	var err error
	if bins.edge, err = testsvc.BuildBinary("services/edge"); err == nil {
		bins.router, err = testsvc.BuildBinary("services/router")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fault test:", err)
		return 1
	}
	return m.Run()
}
