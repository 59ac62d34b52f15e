//go:build unix

package cluster

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
var bins struct{ edge, router string }

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "hermes-cluster-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster tests:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := buildBinaries(dir); err != nil {
		fmt.Fprintln(os.Stderr, "cluster tests:", err)
		return 1
	}
	code := m.Run()
	stopSharedServices()
	return code
}

// buildBinaries builds services/edge and services/router into dir, without
// -race: the processes are what is tested, the race detector watches the
// test binary.
func buildBinaries(dir string) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	goBin, err := goCommand()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := func(pkg, out string) error {
		cmd := exec.CommandContext(ctx, goBin, "build", "-o", out, "./"+pkg)
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build ./%s: %w\n%s", pkg, err, b)
		}
		return nil
	}
	bins.edge = filepath.Join(dir, "edge")
	if err := build("services/edge", bins.edge); err != nil {
		return err
	}
	bins.router = filepath.Join(dir, "router")
	return build("services/router", bins.router)
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

// goCommand finds the go command: PATH, then $GOROOT/bin.
func goCommand() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	if root := os.Getenv("GOROOT"); root != "" {
		p := filepath.Join(root, "bin", "go")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("the go command is not on PATH (nor in $GOROOT/bin): it builds the binaries under test")
}
