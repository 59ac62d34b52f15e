//go:build linux

// Package docs runs the commands a newcomer copies from the documentation,
// on a fresh clone, and checks that they get what the documentation
// promises: the quick start's single node answers a text (README.md), the
// installed SDKs' examples print the demo agent's answer
// (sdk/python/README.md, sdk/typescript/README.md), and the README's
// cluster of two edges and a router delivers cron's message to a phone and
// stops with the documented command. The commands are the markdown's own
// blocks, marked `<!-- docs-test: NAME -->` (blocks_test.go), typed into
// bash (terminal_test.go); the test holds no copy of them.
package docs

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/client"
)

// ports are the fixed ports of the documented commands: the edge's 8787
// and admin 8789 (quick start, cluster), the router's API 8788 and admin
// 8790, the second edge's 8791 and admin 8792 (cluster).
var ports = []int{8787, 8788, 8789, 8790, 8791, 8792}

// The cluster's Redis and NATS, as README.md gives them.
const (
	redisAddr = "127.0.0.1:6379"
	natsAddr  = "127.0.0.1:4222"
)

// docs is the fresh clone, its marked blocks and the newcomer's
// environment.
type docs struct {
	tmp, clone  string
	env         []string
	redisPrefix string
	blocks      map[string]*block
	used        map[string]bool
}

func TestNewcomer(t *testing.T) {
	if testing.Short() {
		t.Skip("clones the repository, builds it, installs both SDKs and runs a cluster")
	}
	d := setup(t)
	steps, passed := 0, 0
	step := func(name string, f func(t *testing.T)) bool {
		steps++
		return t.Run(name, func(t *testing.T) { f(t); passed++ })
	}

	qs := d.terminal(t, "quick start")
	var token string // the quick start's edge's, for the SDKs' examples
	if !step("quick start answers", func(t *testing.T) { token = d.quickStart(t, qs) }) {
		return
	}
	step("Python SDK example", func(t *testing.T) { d.pythonSDK(t, token) })
	step("TypeScript SDK example", func(t *testing.T) { d.typeScriptSDK(t, token) })
	step("quick start stops on Ctrl-C", func(t *testing.T) {
		qs.interrupt(t)
		waitClosed(t, qs, 8787, 8789)
	})
	step("cluster delivers", d.cluster)

	// Only when every step ran (no -run filter, no skip) does an untaken
	// block mean one that no step runs.
	if passed == steps {
		if names := unused(d.blocks, d.used); len(names) > 0 {
			t.Errorf("marked for the test, but no step of TestNewcomer runs them: %s", strings.Join(names, ", "))
		}
	}
}

// quickStart: README's quick start in the foreground; the hello frame the
// edge prints is README's, and pasted into a WebSocket client with README's
// text after it, it gets the demo agent's answer. It returns the token.
func (d *docs) quickStart(t *testing.T, qs *terminal) string {
	from := qs.start(t, d.block(t, "quickstart"))
	// "prints it once, with a hello frame ready to paste"
	m := qs.waitMatch(t, 8*time.Minute, "the edge to print where to connect and the hello frame (the first build takes minutes)", from,
		regexp.MustCompile(`Connect to (ws://\S+)[^\n]*\n\s*(\{"t":"hello"[^\n]*\})\n`))
	url, hello := m[1], m[2]
	var h struct{ Token string }
	if err := json.Unmarshal([]byte(hello), &h); err != nil || h.Token == "" {
		t.Fatalf("the edge printed a hello frame without a token (%v): %s", err, hello)
	}
	if doc := d.block(t, "hello"); doc.with("<token>", h.Token).line() != hello {
		t.Errorf("%s's hello frame is not the one the edge prints:\n%s\n%s", doc.where, doc.line(), hello)
	}
	phone := d.dial(t, url)
	paste(t, phone, hello, "ready")
	text := d.block(t, "text")
	paste(t, phone, text.line(), "")
	var sent struct{ Text string }
	if err := json.Unmarshal([]byte(text.line()), &sent); err != nil {
		t.Fatalf("%s: %v", text.where, err)
	}
	if got := finalMessage(t, phone); got != "You said: "+sent.Text { // the demo agent's answer (docs/agents.md)
		t.Errorf("the demo agent answered %q to %s", got, text.line())
	}
	return h.Token
}

// pythonSDK: sdk/python/README.md's install, example and run, against the
// quick start's edge.
func (d *docs) pythonSDK(t *testing.T, token string) {
	if token == "" {
		t.Skip("the example runs against the quick start's edge: run the whole TestNewcomer")
	}
	install := d.block(t, "python-install")
	d.needDebianPackages(t, install)
	py := d.terminal(t, "Python SDK")
	py.run(t, install, 5*time.Minute)
	py.save(t, d.block(t, "python-example"))
	out := py.run(t, d.block(t, "python-run").with("<token>", token), 2*time.Minute)
	if !strings.Contains(out, "\nYou said: hello\n") { // the example says hello
		t.Errorf("the Python example did not print the demo agent's answer:\n%s", out)
	}
}

// typeScriptSDK: sdk/typescript/README.md's install, example and run,
// against the quick start's edge.
func (d *docs) typeScriptSDK(t *testing.T, token string) {
	if token == "" {
		t.Skip("the example runs against the quick start's edge: run the whole TestNewcomer")
	}
	_, errNode := exec.LookPath("node")
	_, errNpm := exec.LookPath("npm")
	need(t, errNode == nil && errNpm == nil, "the TypeScript SDK's README needs node and npm (apt-get install nodejs npm)")
	ts := d.terminal(t, "TypeScript SDK")
	ts.run(t, d.block(t, "ts-install"), 8*time.Minute)
	ts.save(t, d.block(t, "ts-example"))
	out := ts.run(t, d.block(t, "ts-run").with("<token>", token), 2*time.Minute)
	if !strings.Contains(out, "\ndone: You said: hello\n") { // the example says hello
		t.Errorf("the TypeScript example did not print the demo agent's answer:\n%s", out)
	}
}

// cluster: README's two edges and a router on Redis and NATS; a phone on
// the second edge says hello with README's frame and token and gets the
// demo agent's answer from the router, then README's curl delivers to it
// through the router's API; README's kill stops all three.
func (d *docs) cluster(t *testing.T) {
	need(t, testsvc.RedisPing(redisAddr) == nil && testsvc.NATSInfo(natsAddr) == nil,
		"README's cluster runs on a Redis at "+redisAddr+" and a NATS at "+natsAddr+" (.ci/run starts them)")
	_, err := exec.LookPath("curl")
	need(t, err == nil, "README's delivery is a curl command (apt-get install curl)")
	t.Cleanup(func() { d.dropRedisKeys(t) })
	cl := d.terminal(t, "cluster")
	start := d.block(t, "cluster-start")
	cl.run(t, start, 5*time.Minute)
	for _, port := range []int{8789, 8792, 8790} { // the edges' and the router's admin ports
		waitReady(t, cl, fmt.Sprintf("http://127.0.0.1:%d/readyz", port))
	}
	token := regexp.MustCompile(`MOBILE_TOKEN=(\S+)`).FindStringSubmatch(start.body)
	if token == nil {
		t.Fatalf("%s: no MOBILE_TOKEN in the cluster's commands", start.where)
	}
	phone := d.dial(t, "ws://127.0.0.1:8791/ws") // "say to the second edge"
	paste(t, phone, d.block(t, "hello").with("<token>", token[1]).line(), "ready")
	paste(t, phone, d.block(t, "text").line(), "")
	if got := finalMessage(t, phone); !strings.HasPrefix(got, "You said: ") {
		t.Errorf("the router's demo agent answered %q", got)
	}

	deliver := d.block(t, "cluster-deliver")
	want := regexp.MustCompile(`"text":"([^"]*)"`).FindStringSubmatch(deliver.body)
	if want == nil {
		t.Fatalf("%s: no text in the delivery", deliver.where)
	}
	if out := cl.run(t, deliver, time.Minute); !strings.Contains(out, `{"ok":true,`) {
		t.Errorf("the router did not take the delivery:\n%s", out)
	}
	if got := finalMessage(t, phone); got != want[1] {
		t.Errorf("the phone got %q, want the delivery's %q", got, want[1])
	}
	_ = phone.Close() // the edges drain at once

	cl.run(t, d.block(t, "cluster-stop"), time.Minute)
	waitClosed(t, cl, ports...)
}

// setup checks that the documented ports are free, clones the repository
// and reads the marked blocks.
func setup(t *testing.T) *docs {
	for _, port := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			t.Fatalf("port %d is taken (%v): the documented commands use the fixed ports %v; stop what holds it (a gateway left running?) and run again",
				port, err, ports)
		}
		_ = ln.Close() // only a probe
	}
	d := &docs{tmp: t.TempDir(), used: map[string]bool{}}
	d.clone = filepath.Join(d.tmp, "clone")
	root := strings.TrimSpace(git(t, ".", "rev-parse", "--show-toplevel"))
	git(t, d.tmp, "clone", "-q", root, d.clone)
	// What is changed but not committed in tracked files is tested too, so
	// a fix of the docs is tried before its commit; nothing untracked is.
	if diff := git(t, root, "diff", "HEAD", "--binary"); diff != "" {
		cmd := exec.Command("git", "apply", "--binary", "-")
		cmd.Dir, cmd.Stdin = d.clone, strings.NewReader(diff)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git apply of the uncommitted changes: %v\n%s", err, out)
		}
		t.Log("the clone has the working tree's uncommitted changes to tracked files")
	}
	d.blocks = readBlocks(t, d.clone)
	d.env = d.newcomerEnv(t)
	return d
}

// newcomerEnv is the test's environment as a newcomer's shell would have
// it: none of the gateway's variables (CI may export NATS_URL), a HOME of
// its own (the TypeScript README makes ~/my-app), this machine's Go, npm
// caches and settings, and key and subject prefixes of the test's own, so
// that its runs on the shared Redis and NATS meet no other's (the README:
// "and prefixes, if the services are shared").
func (d *docs) newcomerEnv(t *testing.T) []string {
	realHome, err := os.UserHomeDir()
	if err != nil {
		t.Fatal(err)
	}
	goBin, err := testsvc.GoCommand()
	if err != nil {
		t.Fatal(err)
	}
	goEnv := map[string]string{}
	out, err := exec.Command(goBin, "env", "-json", "GOCACHE", "GOMODCACHE", "GOENV").Output()
	if err != nil || json.Unmarshal(out, &goEnv) != nil {
		t.Fatalf("go env: %v %s", err, out)
	}
	home := filepath.Join(d.tmp, "home")
	bin := filepath.Join(d.tmp, "bin")
	for _, dir := range []string{home, bin} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The docs' apt-get install needs root and a network: the test checks
	// that the packages are installed instead (needDebianPackages).
	shim := "#!/bin/sh\necho \"docs-test: apt-get $*: not run; the test found these installed\"\n"
	if err := os.WriteFile(filepath.Join(bin, "apt-get"), []byte(shim), 0o755); err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "MOBILE_"), strings.HasPrefix(k, "NATS_"), strings.HasPrefix(k, "REDIS_"),
			strings.HasPrefix(k, "OTEL_"), strings.HasPrefix(k, "HERMES_"), strings.HasPrefix(k, "OPENAI_"),
			strings.HasPrefix(strings.ToLower(k), "npm_config_"):
		case k == "AGENT", k == "HOME", k == "PATH", k == "PWD", k == "OLDPWD", k == "CDPATH", k == "BASH_ENV", k == "ENV",
			k == "GOCACHE", k == "GOMODCACHE", k == "GOENV", k == "GOPATH":
		default:
			env = append(env, kv)
		}
	}
	npmCache := os.Getenv("npm_config_cache")
	if npmCache == "" {
		npmCache = filepath.Join(realHome, ".npm")
	}
	d.redisPrefix = "docs-test-" + testsvc.RandomHex(6) + ":"
	env = append(env, "HOME="+home, "PATH="+bin+":"+filepath.Dir(goBin)+":"+os.Getenv("PATH"),
		"GOCACHE="+goEnv["GOCACHE"], "GOMODCACHE="+goEnv["GOMODCACHE"], "GOENV="+goEnv["GOENV"],
		"npm_config_cache="+npmCache, "npm_config_update_notifier=false", "npm_config_fund=false", "npm_config_audit=false",
		"REDIS_PREFIX="+d.redisPrefix, "NATS_PREFIX=docstest"+testsvc.RandomHex(6)+".")
	if rc := filepath.Join(realHome, ".npmrc"); fileExists(rc) {
		env = append(env, "npm_config_userconfig="+rc) // the registry this machine reaches
	}
	return env
}

// block takes the block marked name, failing t when there is none.
func (d *docs) block(t *testing.T, name string) *block {
	t.Helper()
	b, ok := d.blocks[name]
	if !ok {
		t.Fatalf("no markdown file has a block marked <!-- docs-test: %s -->", name)
	}
	d.used[name] = true
	return b
}

// needDebianPackages: the packages of b's apt-get install lines are
// installed (dpkg), else the test is skipped (fails in CI).
func (d *docs) needDebianPackages(t *testing.T, b *block) {
	t.Helper()
	for _, line := range strings.Split(b.body, "\n") {
		line, _, _ = strings.Cut(line, "#")
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "apt-get install ")
		if !ok {
			continue
		}
		for _, pkg := range strings.Fields(rest) {
			out, err := exec.Command("dpkg-query", "-W", "-f=${db:Status-Status}", pkg).Output()
			need(t, err == nil && string(out) == "installed", fmt.Sprintf("%s installs %s with apt-get, and it is not installed here (%v %s)", b.where, pkg, err, out))
		}
	}
}

// dropRedisKeys deletes the cluster's keys, all under the test's prefix.
func (d *docs) dropRedisKeys(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	keys, err := rdb.Keys(ctx, d.redisPrefix+"*").Result()
	if err == nil && len(keys) > 0 {
		err = rdb.Del(ctx, keys...).Err()
	}
	if err != nil {
		t.Logf("deleting the cluster's keys %s*: %v", d.redisPrefix, err)
	}
}

// dial connects a phone to url once its port accepts, as the reader's
// WebSocket client would.
func (d *docs) dial(t *testing.T, url string) *client.Conn {
	t.Helper()
	host := strings.TrimPrefix(strings.TrimPrefix(url, "ws://"), "wss://")
	host, _, _ = strings.Cut(host, "/")
	testsvc.WaitFor(t, time.Minute, host+" to accept connections", func() bool {
		c, err := net.DialTimeout("tcp", host, time.Second)
		if err == nil {
			_ = c.Close() // only a probe
		}
		return err == nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), testsvc.Slack(10*time.Second))
	defer cancel()
	c, err := client.Dial(ctx, url, client.Options{Timeout: testsvc.Slack(10 * time.Second), AutoAck: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.CloseNow() }) // closed before, mostly
	return c
}

// paste sends frame as it is; with want, it waits for the answer of that
// type. An error frame fails t.
func paste(t *testing.T, c *client.Conn, frame, want string) {
	t.Helper()
	if err := c.SendRaw([]byte(frame)); err != nil {
		t.Fatal(err)
	}
	if want == "" {
		return
	}
	f := next(t, c, want)
	if f.T() != want {
		t.Fatalf("sent %s, got %s", frame, f)
	}
}

// finalMessage is the text of the next message frame that is final.
func finalMessage(t *testing.T, c *client.Conn) string {
	t.Helper()
	for {
		if f := next(t, c, "message"); f.Bool("final") {
			return f.Str("text")
		}
	}
}

// next is the next frame of type want, or the next error frame, which fails t.
func next(t *testing.T, c *client.Conn, want string) client.Frame {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testsvc.Slack(20*time.Second))
	defer cancel()
	for {
		f, err := c.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for a %s frame: %v", want, err)
		}
		switch f.T() {
		case want:
			return f
		case "error":
			t.Fatalf("waiting for a %s frame, got %s", want, f)
		}
	}
}

// waitReady waits for url to answer 200.
func waitReady(t *testing.T, tm *terminal, url string) {
	t.Helper()
	tm.wait(t, time.Minute, url+" to answer 200", 0, func(string) bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		_ = resp.Body.Close() // only the status counts
		return resp.StatusCode == http.StatusOK
	})
}

// waitClosed waits until nothing listens on ports any more: the documented
// way to stop what the terminal started did stop it.
func waitClosed(t *testing.T, tm *terminal, ports ...int) {
	t.Helper()
	var open []int
	if !testsvc.Eventually(30*time.Second, func() bool {
		open = open[:0]
		for _, port := range ports {
			if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second); err == nil {
				_ = c.Close() // only a probe
				open = append(open, port)
			}
		}
		return len(open) == 0
	}) {
		t.Fatalf("ports %v still open 30 s after the documented stop, held by the %s terminal's %s; its output:\n%s",
			open, tm.name, tm.started(), tm.tail(0))
	}
}

// need stops t with msg (testsvc.Missing) when ok is false.
func need(t *testing.T, ok bool, msg string) {
	t.Helper()
	if !ok {
		testsvc.Missing(t, msg)
	}
}

// newCommand is a terminal's bash: in dir, with env, output to out, fd 3
// from ctl, a process group of its own, killed if the test dies.
func newCommand(dir string, env []string, out, ctl *os.File, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Env = dir, env
	cmd.Stdout, cmd.Stderr = out, out
	cmd.ExtraFiles = []*os.File{ctl}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return cmd
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return string(out)
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
