//go:build unix

// Package sdk_test runs the client SDKs' own suites against a real gateway
// (services/edge built from this tree): the TypeScript SDK's npm test, the
// browser client and avatar page in headless Chromium, a check that the
// committed browser bundle matches its sources, and the Python SDK's
// pytest. Without node and npm (or Chromium, for the browser test; or
// Debian's python3 with pytest and websockets) they skip with a message,
// except in CI.
package sdk_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

const chromium = "/usr/bin/chromium"

const tsDir = "typescript"

// need skips the test (fails it in CI) with msg when ok is false.
func need(t *testing.T, ok bool, msg string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

func needNode(t *testing.T) {
	t.Helper()
	_, errNode := exec.LookPath("node")
	_, errNpm := exec.LookPath("npm")
	need(t, errNode == nil && errNpm == nil, "the TypeScript SDK tests need node (20 or later) and npm (apt-get install nodejs npm)")
}

// python is Debian's interpreter: the packages are python3-pytest and
// python3-websockets.
const python = "/usr/bin/python3"

var (
	edgeOnce sync.Once
	edgeErr  string

	setupOnce sync.Once
	edgeBin   string
	setupErr  string
)

// setup installs the npm packages (npm ci, when node_modules is older than
// package-lock.json) and builds services/edge.
func setup(t *testing.T) string {
	t.Helper()
	needNode(t)
	setupOnce.Do(func() {
		lock, err := os.Stat(filepath.Join(tsDir, "package-lock.json"))
		if err != nil {
			setupErr = err.Error()
			return
		}
		if inst, err := os.Stat(filepath.Join(tsDir, "node_modules", ".package-lock.json")); err != nil || inst.ModTime().Before(lock.ModTime()) {
			if out, err := run(tsDir, nil, 5*time.Minute, "npm", "ci", "--no-audit", "--no-fund"); err != nil {
				setupErr = "npm ci: " + err.Error() + "\n" + out
				return
			}
		}
	})
	if setupErr != "" {
		t.Fatal(setupErr)
	}
	return edge(t)
}

// edge builds services/edge once for every test here.
func edge(t *testing.T) string {
	t.Helper()
	edgeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "hermes-sdk-edge-")
		if err != nil {
			edgeErr = err.Error()
			return
		}
		edgeBin = filepath.Join(dir, "edge")
		if out, err := run("..", nil, 5*time.Minute, "go", "build", "-o", edgeBin, "./services/edge"); err != nil {
			edgeErr = "go build ./services/edge: " + err.Error() + "\n" + out
		}
	})
	if edgeErr != "" {
		t.Fatal(edgeErr)
	}
	return edgeBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if edgeBin != "" {
		os.RemoveAll(filepath.Dir(edgeBin))
	}
	os.Exit(code)
}

// run runs name args in dir with the test's environment (less the
// gateway's variables) plus env, and returns the combined output.
func run(dir string, env []string, timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(cleanEnv(), env...)
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "MOBILE_") || strings.HasPrefix(k, "NATS_") || strings.HasPrefix(k, "REDIS_") ||
			strings.HasPrefix(k, "OTEL_") || k == "AGENT" {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// TestTypeScriptSDK: npm test (type checks, then node:test against a real edge).
func TestTypeScriptSDK(t *testing.T) {
	bin := setup(t)
	out, err := run(tsDir, []string{"MOBILE_TEST_EDGE_BIN=" + bin}, 5*time.Minute, "npm", "test")
	if err != nil {
		t.Fatalf("npm test in sdk/typescript failed (%v):\n%s", err, out)
	}
	t.Logf("npm test:\n%s", tail(out, 12))
}

// TestWebBundleUpToDate: pkg/web/static/client/app.js is what esbuild makes
// of the client and the SDK now (go generate ./pkg/web rebuilds it).
func TestWebBundleUpToDate(t *testing.T) {
	setup(t)
	tmp := filepath.Join(t.TempDir(), "app.js")
	if out, err := run(tsDir, nil, 2*time.Minute, "npm", "run", "--silent", "bundle", "--", "--outfile="+tmp); err != nil {
		t.Fatalf("bundling the browser client: %v\n%s", err, out)
	}
	want, err := os.ReadFile(tmp)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join("..", "pkg", "web", "static", "client", "app.js"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("pkg/web/static/client/app.js is stale: run go generate ./pkg/web and commit it")
	}
}

// TestBrowser: the browser client and the avatar page in headless Chromium;
// screenshots in test-artifacts/browser/ at the repository root.
func TestBrowser(t *testing.T) {
	bin := setup(t)
	_, err := os.Stat(chromium)
	need(t, err == nil, "the browser tests need "+chromium+" (apt-get install chromium)")
	artifacts, err := filepath.Abs(filepath.Join("..", "test-artifacts", "browser"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := run(tsDir, []string{"MOBILE_TEST_EDGE_BIN=" + bin, "HERMES_ARTIFACTS=" + artifacts, "CHROMIUM_PATH=" + chromium},
		5*time.Minute, "npm", "run", "test:browser")
	if err != nil {
		t.Fatalf("the browser tests failed (%v):\n%s", err, out)
	}
	shots, _ := filepath.Glob(filepath.Join(artifacts, "*.png"))
	for _, want := range []string{"chat.png", "avatar-idle.png", "avatar-thinking.png", "avatar-speaking.png"} {
		if _, err := os.Stat(filepath.Join(artifacts, want)); err != nil {
			t.Errorf("screenshot %s missing: %v", want, err)
		}
	}
	t.Logf("screenshots: %s\n%s", strings.Join(shots, " "), tail(out, 12))
}

// TestPythonSDK: sdk/python's pytest suite against a real edge.
func TestPythonSDK(t *testing.T) {
	out, err := exec.Command(python, "-c", "import pytest, websockets").CombinedOutput()
	need(t, err == nil, "the Python SDK tests need "+python+" with pytest and websockets "+
		"(apt-get install python3-pytest python3-websockets): "+strings.TrimSpace(string(out)))
	bin := edge(t)
	res, err := run("python", []string{"MOBILE_TEST_EDGE_BIN=" + bin, "PYTHONDONTWRITEBYTECODE=1"}, 5*time.Minute,
		python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests")
	if err != nil {
		t.Fatalf("the Python SDK's pytest failed (%v):\n%s", err, res)
	}
	t.Logf("pytest:\n%s", tail(res, 5))
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
