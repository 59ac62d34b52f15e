package testsvc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// ModuleRoot is the directory of go.mod, found by walking up from the
// working directory (a test runs in its package's directory).
func ModuleRoot() (string, error) {
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

// GoCommand finds the go command: PATH, then $GOROOT/bin.
func GoCommand() (string, error) {
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

var builds sync.Map // key → *built

type built struct {
	once sync.Once
	path string
	err  error
}

// Build builds the module's package pkg (such as "services/edge") with go
// build and flags (such as "-ldflags=-X main.version=v1"), once per test
// binary and set of flags, and returns the binary's path, failing t when it
// does not build. The binary is built without -race: the process is what is
// tested; the race detector watches the test binary.
func Build(t testing.TB, pkg string, flags ...string) string {
	t.Helper()
	p, err := BuildBinary(pkg, flags...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// BuildBinary is Build without a test, for TestMain. The binary lives in
// the system's temporary directory under a name made of the module root,
// pkg and flags, so runs reuse its place rather than leave copies behind;
// it is written under a temporary name and renamed, so test binaries of
// other packages building the same one at once never see half of it.
func BuildBinary(pkg string, flags ...string) (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(root + "\x00" + pkg + "\x00" + strings.Join(flags, "\x00")))
	key := hex.EncodeToString(sum[:8])
	v, _ := builds.LoadOrStore(key, &built{})
	b := v.(*built)
	b.once.Do(func() { b.path, b.err = build(root, key, pkg, flags) })
	return b.path, b.err
}

func build(root, key, pkg string, flags []string) (string, error) {
	goBin, err := GoCommand()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(os.TempDir(), "hermes-testbin-"+key)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	out := filepath.Join(dir, path.Base(pkg))
	tmp, err := os.CreateTemp(dir, path.Base(pkg)+".*.tmp")
	if err != nil {
		return "", err
	}
	_ = tmp.Close()                              // go build writes it anew
	defer func() { _ = os.Remove(tmp.Name()) }() // gone once renamed
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	args := append(append([]string{"build", "-o", tmp.Name()}, flags...), "./"+pkg)
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./%s: %w\n%s", pkg, err, b)
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return "", err
	}
	return out, nil
}
