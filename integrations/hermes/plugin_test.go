//go:build unix

// Package hermes_test runs the Hermes plugin's Python suite against a real
// gateway: a router (AGENT=link) and an edge, built from this tree and run
// as processes on the test's Redis and NATS.
package hermes_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
)

// python is the interpreter the suite runs with: Debian's, so the packages
// are python3-pytest and python3-aiohttp. MOBILE_TEST_PYTHON names another
// (a newer Python with the same packages on its path).
var python = pythonPath()

func pythonPath() string {
	if p := os.Getenv("MOBILE_TEST_PYTHON"); p != "" {
		return p
	}
	return "/usr/bin/python3"
}

// newerPython is the newest CPython 3.12 or later of pyenv on this machine
// (the image has 3.13.0; Debian's archive has nothing newer than its 3.11),
// with the environment that gives it Debian's pure-Python pytest, aiohttp and
// yaml: the suite runs with it too, unless MOBILE_TEST_PYTHON names the one
// interpreter. Hermes 0.21 and later ask for 3.14, which no registry here has.
func newerPython() (path string, env []string) {
	if os.Getenv("MOBILE_TEST_PYTHON") != "" {
		return "", nil
	}
	root := os.Getenv("PYENV_ROOT")
	if root == "" {
		home, _ := os.UserHomeDir()
		root = filepath.Join(home, ".pyenv")
	}
	best := 0
	dirs, _ := filepath.Glob(filepath.Join(root, "versions", "3.*"))
	for _, dir := range dirs {
		parts := strings.Split(filepath.Base(dir), ".")
		if len(parts) != 3 {
			continue
		}
		minor, err := strconv.Atoi(parts[1])
		if err != nil || minor < 12 || minor <= best {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "bin", "python3")); err == nil {
			best, path = minor, filepath.Join(dir, "bin", "python3")
		}
	}
	if path == "" {
		return "", nil
	}
	env = []string{"PYTHONPATH=/usr/lib/python3/dist-packages", "AIOHTTP_NO_EXTENSIONS=1",
		"MULTIDICT_NO_EXTENSIONS=1", "YARL_NO_EXTENSIONS=1", "FROZENLIST_NO_EXTENSIONS=1"}
	check := exec.Command(path, "-c", "import pytest, aiohttp, yaml")
	check.Env = append(cleanEnv(), env...)
	if check.Run() != nil {
		return "", nil
	}
	return path, env
}

func TestHermesPlugin(t *testing.T) {
	needPython(t)
	redisURL, natsURL := testsvc.RedisURL(t), testsvc.NATSURL(t)
	edgeBin, routerBin := testsvc.Build(t, "services/edge"), testsvc.Build(t, "services/router")

	agentToken, deliverToken, appToken := "agent-"+testsvc.RandomHex(12), "cron-"+testsvc.RandomHex(12), "app-"+testsvc.RandomHex(12)
	legacy := startGateway(t, redisURL, natsURL, edgeBin, routerBin, keys{agentToken, deliverToken, appToken},
		[]string{"MOBILE_AGENT_TOKENS=" + agentToken, "MOBILE_DELIVER_TOKENS=" + deliverToken},
		[]string{"MOBILE_DELIVER_TOKENS=" + deliverToken, "MOBILE_TOKEN=" + appToken})

	// Each supported Hermes line (tests/hermes_v0_18, hermes_v0_21 and
	// hermes_v0_23 stand for what the plugin meets in it), with Debian's
	// python3 and with the newest other Python here.
	type interpreter struct {
		name, path string
		env        []string
	}
	pythons := []interpreter{{"", python, nil}}
	if path, env := newerPython(); path != "" {
		pythons = append(pythons, interpreter{"-python" + filepath.Base(filepath.Dir(filepath.Dir(path))), path, env})
	}
	for _, py := range pythons {
		for _, version := range []string{"0.18", "0.21", "0.23"} {
			t.Run("hermes-"+version+py.name, func(t *testing.T) {
				runSuite(t, py.path, py.env, version, legacy)
			})
		}
	}

	// The plugin takes an owner's keys (docs/tenancy.md) as it takes the
	// tokens: the suite's messages, files, cards and sends, on the newest
	// line, against a gateway whose only credentials are one owner's of
	// its tenants file. (The whole suite passes so too, in as long as a
	// run above: 52 passed, 1 skipped.)
	t.Run("hermes-0.23-owner-keys", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "tenants.yaml")
		sec := testsvc.RandomHex(12)
		owner := "tenants:\n  - id: acme\n    keys:\n" +
			"      - {id: hermes, kind: agent, secret: agent-" + sec + "}\n" +
			"      - {id: cron, kind: deliver, secret: cron-" + sec + "}\n" +
			"      - {id: app, kind: app, secret: app-" + sec + "}\n"
		if err := os.WriteFile(file, []byte(owner), 0o600); err != nil {
			t.Fatal(err)
		}
		k := keys{"hmt_acme.hermes.agent-" + sec, "hmt_acme.cron.cron-" + sec, "hmt_acme.app.app-" + sec}
		withFile := []string{"MOBILE_TENANTS_FILE=" + file}
		gw := startGateway(t, redisURL, natsURL, edgeBin, routerBin, k, withFile, withFile)
		runSuite(t, python, nil, "0.23", gw,
			"tests/test_messages.py", "tests/test_media.py", "tests/test_cards.py", "tests/test_send.py")
	})
}

// keys are the credentials the suite uses: the agent's, cron's and the
// phones'.
type keys struct{ agent, deliver, app string }

// gateway is a router (AGENT=link) and an edge of one NATS and Redis
// prefix, and the keys the suite uses with them.
type gateway struct {
	routerURL, edgeURL string
	keys
}

// startGateway starts a router with routerEnv and an edge with edgeEnv,
// on a NATS and Redis prefix of their own.
func startGateway(t *testing.T, redisURL, natsURL, edgeBin, routerBin string, k keys, routerEnv, edgeEnv []string) gateway {
	t.Helper()
	id := testsvc.RandomHex(6)
	common := []string{
		"NATS_URL=" + natsURL,
		"NATS_PREFIX=hp" + id + ".",
		"REDIS_URL=" + redisURL,
		"REDIS_PREFIX=hermes-plugin-test:" + id + ":",
		"MOBILE_PROMPT_TTL=4",        // the expiry tests wait for it
		"MOBILE_PROMPT_MAX_TTL=7200", // a card for a wait without a limit says it
		"MOBILE_ADMIN_LISTEN=off",
	}
	gw := gateway{keys: k}
	gw.routerURL = start(t, "router", routerBin, "router listening", append(append(common,
		"AGENT=link",
		"MOBILE_ROUTER_LISTEN=127.0.0.1:0",
	), routerEnv...))
	gw.edgeURL = start(t, "edge", edgeBin, "gateway listening", append(append(common,
		"MOBILE_ROUTER=off",
		"MOBILE_LISTEN=127.0.0.1:0",
	), edgeEnv...))
	if !strings.HasSuffix(gw.edgeURL, "/ws") {
		gw.edgeURL = strings.TrimSuffix(gw.edgeURL, "/") + "/ws"
	}
	return gw
}

// runSuite runs the plugin's pytest suite (the files of tests, all of it
// without) with python (and env) against the stand-ins of Hermes version,
// on the router and edge of gw with its keys.
func runSuite(t *testing.T, python string, env []string, version string, gw gateway, tests ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if len(tests) == 0 {
		tests = []string{"tests"}
	}
	cmd := exec.CommandContext(ctx, python, append([]string{"-m", "pytest", "-q", "-p", "no:cacheprovider"}, tests...)...)
	cmd.Dir = "."
	cmd.Env = append(append(cleanEnv(), env...),
		"MOBILE_TEST_HERMES="+version,
		"MOBILE_TEST_ROUTER_URL="+strings.TrimSuffix(gw.routerURL, "/"),
		"MOBILE_TEST_AGENT_TOKEN="+gw.agent,
		"MOBILE_TEST_DELIVER_TOKEN="+gw.deliver,
		"MOBILE_TEST_EDGE_WS="+gw.edgeURL,
		"MOBILE_TEST_APP_TOKEN="+gw.app,
		"MOBILE_TEST_PROMPT_MAX_TTL=7200",
		"PYTHONDONTWRITEBYTECODE=1",
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the plugin's Python suite failed against Hermes %s with %s (%v):\n%s", version, python, err, out)
	}
	t.Logf("pytest (%s):\n%s", python, out)
}

// needPython skips the test without python3, pytest and aiohttp, or fails it
// in CI, as internal/testsvc does for services.
func needPython(t *testing.T) {
	t.Helper()
	out, err := exec.Command(python, "-c", "import pytest, aiohttp, yaml").CombinedOutput()
	if err == nil {
		return
	}
	testsvc.Missing(t, "the Hermes plugin tests need "+python+" with pytest, aiohttp and yaml "+
		"(apt-get install python3-pytest python3-aiohttp python3-yaml): "+err.Error()+" "+strings.TrimSpace(string(out)))
}

// start runs path with env and returns the url of its listening log line;
// the process is stopped (SIGTERM, then SIGKILL) when the test ends.
func start(t *testing.T, name, path, listening string, env []string) string {
	t.Helper()
	logs := testsvc.NewBuffer()
	cmd := exec.Command(path)
	cmd.Env = append(cleanEnv(), env...)
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, logs)
		}
	})
	deadline := time.After(20 * time.Second)
	for {
		if url := testsvc.ListeningURL(t, logs.String(), listening); url != "" {
			return url
		}
		select {
		case <-logs.Written():
		case <-exited:
			t.Fatalf("%s exited before %q:\n%s", name, listening, logs)
		case <-deadline:
			t.Fatalf("%s: no %q within 20 s:\n%s", name, listening, logs)
		}
	}
}

// cleanEnv is the test's environment without the variables the binaries and
// the plugin read, so a developer's shell cannot change what is tested.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "MOBILE_") || strings.HasPrefix(k, "NATS_") || strings.HasPrefix(k, "REDIS_") ||
			strings.HasPrefix(k, "OTEL_") || k == "AGENT" || k == "HERMES_HOME" {
			continue
		}
		env = append(env, kv)
	}
	return env
}
