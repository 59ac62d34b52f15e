//go:build unix

package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// bins are the binaries TestMain built; routerMissing says why there is no
// router binary (services/router has no Go files yet), routerErr why it did
// not build.
var bins struct {
	edge, router  string
	routerMissing string
	routerErr     error
}

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
	if !hasGoFiles(filepath.Join(root, "services", "router")) {
		bins.routerMissing = "services/router has no Go files yet"
		return nil
	}
	bins.router = filepath.Join(dir, "router")
	if err := build("services/router", bins.router); err != nil {
		bins.router, bins.routerErr = "", err
	}
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

func hasGoFiles(dir string) bool {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".go") && !strings.HasSuffix(e.Name(), "_test.go") {
			return true
		}
	}
	return false
}

// needRouter skips the test while services/router does not exist, and fails
// it when the router does not build.
func needRouter(t *testing.T) {
	t.Helper()
	if bins.routerErr != nil {
		t.Fatalf("the router does not build: %v", bins.routerErr)
	}
	if bins.router == "" {
		t.Skip("needs the router process: " + bins.routerMissing)
	}
}
