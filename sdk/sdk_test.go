//go:build unix

// Package sdk_test runs the client SDKs' own suites against a real gateway
// (services/edge built from this tree): the TypeScript SDK's npm test, the
// browser client and avatar page in headless Chromium, a check that the
// committed browser bundle matches its sources, and the Python SDK's
// pytest. Without node and npm (or Chromium, for the browser test; or a
// python3 with pytest and websockets) they skip with a message,
// except in CI.
package sdk_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
)

const chromium = "/usr/bin/chromium"

const tsDir = "typescript"

// need stops t with msg (testsvc.Missing) when ok is false.
func need(t *testing.T, ok bool, msg string) {
	t.Helper()
	if !ok {
		testsvc.Missing(t, msg)
	}
}

func needNode(t *testing.T) {
	t.Helper()
	_, errNode := exec.LookPath("node")
	_, errNpm := exec.LookPath("npm")
	need(t, errNode == nil && errNpm == nil, "the TypeScript SDK tests need node (18 or later) and npm (apt-get install nodejs npm)")
}

// pythonWith returns the first interpreter that runs check (imports of
// what a test needs): $PYTHON when set, else the python3 on PATH, else
// Debian's /usr/bin/python3, whose packages (python3-pytest,
// python3-websockets, …) a python3 earlier on PATH, such as pyenv's, does
// not see. It skips the test (fails it in CI) naming what to install when
// none does.
func pythonWith(t *testing.T, check, install string) string {
	t.Helper()
	var tried []string
	candidates := []string{os.Getenv("PYTHON")}
	if candidates[0] == "" {
		candidates = candidates[:0]
		if p, err := exec.LookPath("python3"); err == nil {
			candidates = append(candidates, p)
		}
		candidates = append(candidates, "/usr/bin/python3")
	}
	for _, py := range candidates {
		out, err := exec.Command(py, "-c", check).CombinedOutput()
		if err == nil {
			return py
		}
		why := tail(strings.TrimSpace(string(out)), 1)
		if why == "" {
			why = err.Error()
		}
		tried = append(tried, py+": "+why)
	}
	need(t, false, "no python3 that can "+check+" ("+install+", or PYTHON=/path/to/python3): "+strings.Join(tried, "; "))
	return ""
}

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
		var err error
		if edgeBin, err = testsvc.BuildBinary("services/edge"); err != nil {
			edgeErr = err.Error()
		}
	})
	if edgeErr != "" {
		t.Fatal(edgeErr)
	}
	return edgeBin
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
	python := pythonWith(t, "import pytest, websockets", "apt-get install python3-pytest python3-websockets")
	bin := edge(t)
	res, err := run("python", []string{"MOBILE_TEST_EDGE_BIN=" + bin, "PYTHONDONTWRITEBYTECODE=1"}, 5*time.Minute,
		python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests")
	if err != nil {
		t.Fatalf("the Python SDK's pytest failed (%v):\n%s", err, res)
	}
	t.Logf("pytest:\n%s", tail(res, 5))
}

// gateway is a running edge: zero-config single node with the demo agent.
type gateway struct {
	url, token string
}

// startEdge runs the edge binary on a free loopback port until the test ends.
func startEdge(t *testing.T, bin string) gateway {
	t.Helper()
	gw := gateway{token: "app-" + testsvc.RandomHex(12)}
	cmd := exec.Command(bin)
	cmd.Env = append(cleanEnv(), "MOBILE_TOKEN="+gw.token, "MOBILE_LISTEN=127.0.0.1:0", "MOBILE_ADMIN_LISTEN=off",
		"MOBILE_DRAIN_WINDOW=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var line struct{ Msg, URL string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "gateway listening" && line.URL != "" {
				select {
				case found <- line.URL:
				default:
				}
			}
		}
		io.Copy(io.Discard, stderr) // a line too long for the scanner
	}()
	select {
	case gw.url = <-found:
	case <-time.After(20 * time.Second):
		t.Fatal("no 'gateway listening' from the edge within 20 s")
	}
	return gw
}

// readmeExample is the first fenced block of lang in a README.
func readmeExample(t *testing.T, readme, lang string) string {
	t.Helper()
	b, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\n```"+lang+"\n")
	code, _, ok2 := strings.Cut(rest, "\n```\n")
	if !ok || !ok2 {
		t.Fatalf("%s has no ```%s block", readme, lang)
	}
	return code + "\n"
}

// TestTypeScriptPackage: npm pack (which builds on prepare) installed into
// an empty project, with ws as the README says, runs the README's example
// as written against a real edge; require() and the exported types resolve.
func TestTypeScriptPackage(t *testing.T) {
	bin := setup(t)
	tmp := t.TempDir()
	for _, dir := range []string{tsDir, filepath.Join(tsDir, "node_modules", "ws")} {
		if out, err := run(dir, nil, 3*time.Minute, "npm", "pack", "--pack-destination", tmp); err != nil {
			t.Fatalf("npm pack in %s: %v\n%s", dir, err, out)
		}
	}
	tgzs, _ := filepath.Glob(filepath.Join(tmp, "*.tgz"))
	if len(tgzs) != 2 {
		t.Fatalf("npm pack wrote %v", tgzs)
	}
	app := filepath.Join(tmp, "app")
	if err := os.Mkdir(app, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(app, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("package.json", `{"name": "app", "private": true}`+"\n")
	args := append([]string{"install", "--offline", "--no-audit", "--no-fund"}, tgzs...)
	if out, err := run(app, nil, 3*time.Minute, "npm", args...); err != nil {
		t.Fatalf("npm install of the packed SDK: %v\n%s", err, out)
	}
	gw := startEdge(t, bin)
	write("example.mjs", readmeExample(t, filepath.Join(tsDir, "README.md"), "js"))
	out, err := run(app, []string{"HERMES_URL=" + gw.url, "HERMES_TOKEN=" + gw.token}, time.Minute, "node", "example.mjs")
	if err != nil || !strings.Contains(out, "done: You said: hello\n") {
		t.Fatalf("the README's example (%v):\n%s", err, out)
	}
	// A wrong token: the error once, from the handler, exit 1, no stack trace.
	out, err = run(app, []string{"HERMES_URL=" + gw.url, "HERMES_TOKEN=wrong"}, time.Minute, "node", "example.mjs")
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || out != "error: auth_failed: invalid token\n" {
		t.Fatalf("the README's example with a wrong token (%v), want exit 1 and the error once:\n%s", err, out)
	}
	write("check.cjs", `const { Client, MAX_TEXT_CHARS } = require("@hermes-mobile/client");
if (typeof Client !== "function" || MAX_TEXT_CHARS !== 12000) throw new Error("require() gave " + Object.keys(require("@hermes-mobile/client")));
const pkg = require("@hermes-mobile/client/package.json");
for (const c of Object.values(pkg.exports["."])) require("fs").accessSync(require("path").join("node_modules", pkg.name, c.types));
console.log("cjs ok");
`)
	if out, err := run(app, nil, time.Minute, "node", "check.cjs"); err != nil || !strings.Contains(out, "cjs ok") {
		t.Fatalf("require() of the packed SDK (%v):\n%s", err, out)
	}
}

// TestPythonPackage: pip install of sdk/python into a fresh venv (offline,
// Debian's setuptools and websockets through --system-site-packages) runs
// the README's example as written against a real edge, and ships py.typed.
func TestPythonPackage(t *testing.T) {
	// setuptools before 70.1 builds a wheel only with the wheel package
	// ("invalid command 'bdist_wheel'" without it).
	python := pythonWith(t, "import setuptools, websockets, venv, importlib.util as u; "+
		"assert tuple(map(int, setuptools.__version__.split('.')[:2])) >= (70, 1) or u.find_spec('wheel'), 'no wheel'",
		"apt-get install python3-setuptools python3-wheel python3-venv python3-websockets")
	bin := edge(t)
	tmp := t.TempDir()
	venv := filepath.Join(tmp, "venv")
	if out, err := run(tmp, nil, 2*time.Minute, python, "-m", "venv", "--system-site-packages", venv); err != nil {
		t.Fatalf("python3 -m venv: %v\n%s", err, out)
	}
	src, err := filepath.Abs("python")
	if err != nil {
		t.Fatal(err)
	}
	// pip builds in a copy: the checkout stays clean of build/ and egg-info.
	build := filepath.Join(tmp, "src")
	if out, err := run(tmp, nil, time.Minute, "cp", "-r", src, build); err != nil {
		t.Fatalf("copying sdk/python: %v\n%s", err, out)
	}
	py := filepath.Join(venv, "bin", "python")
	if out, err := run(tmp, []string{"PIP_DISABLE_PIP_VERSION_CHECK=1"}, 3*time.Minute, py, "-m", "pip", "install", "--no-index",
		"--no-build-isolation", build); err != nil {
		t.Fatalf("pip install sdk/python: %v\n%s", err, out)
	}
	check := "import hermes_client, importlib.metadata as m, pathlib\n" +
		"assert m.version('hermes-client') == hermes_client.__version__, hermes_client.__version__\n" +
		"assert (pathlib.Path(hermes_client.__file__).parent / 'py.typed').exists()\n" +
		"assert 'site-packages' in hermes_client.__file__, hermes_client.__file__\n"
	if out, err := run(tmp, nil, time.Minute, py, "-c", check); err != nil {
		t.Fatalf("the installed package: %v\n%s", err, out)
	}
	gw := startEdge(t, bin)
	example := filepath.Join(tmp, "example.py")
	if err := os.WriteFile(example, []byte(readmeExample(t, filepath.Join("python", "README.md"), "python")), 0o644); err != nil {
		t.Fatal(err)
	}
	out2, err := run(tmp, []string{"HERMES_URL=" + gw.url, "HERMES_TOKEN=" + gw.token, "PYTHONDONTWRITEBYTECODE=1"}, time.Minute, py, example)
	if err != nil || !strings.Contains(out2, "You said: hello\n") {
		t.Fatalf("the README's example (%v):\n%s", err, out2)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
