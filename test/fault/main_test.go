//go:build unix

package fault

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
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
	dir, err := os.MkdirTemp("", "hermes-fault-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "fault test:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := buildBinaries(dir); err != nil {
		fmt.Fprintln(os.Stderr, "fault test:", err)
		return 1
	}
	return m.Run()
}

// buildBinaries builds services/edge and services/router into dir, without
// -race: the processes are what is tested, the race detector watches the
// test binary.
func buildBinaries(dir string) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		if r := os.Getenv("GOROOT"); r != "" {
			goBin = filepath.Join(r, "bin", "go")
		} else {
			return errors.New("the go command is not on PATH: it builds the binaries under test")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, b := range []struct{ pkg, out string }{
		{"services/edge", filepath.Join(dir, "edge")},
		{"services/router", filepath.Join(dir, "router")},
	} {
		cmd := exec.CommandContext(ctx, goBin, "build", "-o", b.out, "./"+b.pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build ./%s: %w\n%s", b.pkg, err, out)
		}
	}
	bins.edge, bins.router = filepath.Join(dir, "edge"), filepath.Join(dir, "router")
	return nil
}

// moduleRoot walks up from the working directory to go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}
