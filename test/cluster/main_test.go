//go:build unix

package cluster

import (
	"fmt"
	"os"
	"testing"

	"github.com/hermes-mobile/gateway/internal/testsvc"
)

// bins are the binaries TestMain built.
var bins struct{ edge, router string }

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	if err := buildBinaries(); err != nil {
		fmt.Fprintln(os.Stderr, "cluster tests:", err)
		return 1
	}
	code := m.Run()
	stopSharedServices()
	return code
}

// buildBinaries builds services/edge and services/router before the first
// test, so a build error is reported once and no test's time goes to it.
func buildBinaries() error {
	var err error
	if bins.edge, err = testsvc.BuildBinary("services/edge"); err != nil {
		return err
	}
	bins.router, err = testsvc.BuildBinary("services/router")
	return err
}
