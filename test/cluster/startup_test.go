//go:build unix

package cluster

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// logRecorder keeps every output line of a process (launch's logf), so a
// test can look for a line that may have come before it looked.
type logRecorder struct {
	t     testing.TB
	mu    sync.Mutex
	lines []string
}

func (r *logRecorder) logf(line string) {
	r.t.Log(line)
	_, line, _ = strings.Cut(line, ": ") // the process's name
	r.mu.Lock()
	r.lines = append(r.lines, line)
	r.mu.Unlock()
}

func (r *logRecorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lines...)
}

// find returns the first JSON line whose msg is msg, or nil.
func (r *logRecorder) find(msg string) map[string]any {
	for _, line := range r.all() {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == msg {
			return rec
		}
	}
	return nil
}

// waitFor waits up to d for a line whose msg is msg, failing the test
// (with what the process said) otherwise, or when p exits meanwhile.
func (r *logRecorder) waitFor(t testing.TB, p *testsvc.Proc, msg string, d time.Duration) map[string]any {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if rec := r.find(msg); rec != nil {
			return rec
		}
		select {
		case <-p.Exited():
			t.Fatalf("%s exited (%v) before logging %q; its output:\n%s", p.Name, p.Err(), msg, strings.Join(r.all(), "\n"))
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not log %q within %v; its output:\n%s", p.Name, msg, d, strings.Join(r.all(), "\n"))
		}
	}
}

// readyz answers GET /readyz on an admin URL: the status and the state.
func readyz(t testing.TB, admin string) (int, string) {
	t.Helper()
	resp, err := http.Get(admin + "/readyz")
	if err != nil {
		t.Fatalf("GET %s/readyz: %v", admin, err)
	}
	defer resp.Body.Close()
	var body struct {
		State string `json:"state"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("GET %s/readyz: %v", admin, err)
	}
	return resp.StatusCode, body.State
}

// TestStartBeforeRedisAndNATS starts an edge and a router before their
// Redis and NATS exist: both stay up, alive on /healthz and not ready on
// /readyz, logging which dependency they wait for and where; the edge does
// not listen for phones yet. Once Redis and NATS are started, both become
// ready and a phone's text is answered by the demo agent through the
// router.
func TestStartBeforeRedisAndNATS(t *testing.T) {
	redisBin := findBinary("redis-server", "/usr/bin/redis-server", "/usr/local/bin/redis-server")
	natsBin := findBinary("nats-server", "/usr/sbin/nats-server", "/usr/local/bin/nats-server")
	if redisBin == "" || natsBin == "" {
		unavailable(t, "redis-server and nats-server", "this test starts its own: put both on PATH (apt-get install redis-server nats-server)")
	}
	redisPort, err := testsvc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	natsPort, err := testsvc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	redisAddr := "127.0.0.1:" + strconv.Itoa(redisPort)
	natsURL := "nats://127.0.0.1:" + strconv.Itoa(natsPort)
	token := "app-" + testsvc.RandomHex(12)
	common := []string{
		"NATS_URL=" + natsURL,
		"REDIS_URL=redis://" + redisAddr,
		"MOBILE_ADMIN_LISTEN=127.0.0.1:0",
	}

	type node struct {
		name  string
		p     *testsvc.Proc
		logs  *logRecorder
		admin string
	}
	start := func(name, bin string, env ...string) *node {
		n := &node{name: name, logs: &logRecorder{t: t}}
		var err error
		n.p, n.admin, err = testsvc.Launch(name, bin, nil, append(common, env...), n.logs.logf, logMsg("admin listening"))
		if n.p != nil {
			t.Cleanup(func() { n.p.Stop(t.Logf) })
		}
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	edge := start("edge", bins.edge, "MOBILE_LISTEN=127.0.0.1:0", "MOBILE_TOKEN="+token, "MOBILE_ROUTER=off")
	router := start("router", bins.router, "MOBILE_ROUTER_LISTEN=127.0.0.1:0", "AGENT=demo")

	for _, n := range []*node{edge, router} {
		redis := n.logs.waitFor(t, n.p, "redis not reachable; retrying", 20*time.Second)
		if redis["addr"] != redisAddr || !strings.Contains(fmt.Sprint(redis["err"]), "refused") {
			t.Errorf("%s: the failed Redis attempt is logged as %v; want addr %s and the error", n.name, redis, redisAddr)
		}
		nats := n.logs.waitFor(t, n.p, "nats not reachable; retrying", 20*time.Second)
		if nats["url"] != natsURL || !strings.Contains(fmt.Sprint(nats["err"]), "refused") {
			t.Errorf("%s: the failed NATS attempt is logged as %v; want url %s and the error", n.name, nats, natsURL)
		}
		if code, state := readyz(t, n.admin); code != http.StatusServiceUnavailable || state != "starting" {
			t.Errorf("%s: /readyz before Redis and NATS = %d %q, want 503 starting", n.name, code, state)
		}
		if code := getStatus(t, n.admin+"/healthz"); code != http.StatusOK {
			t.Errorf("%s: /healthz while waiting = %d, want 200", n.name, code)
		}
		select {
		case <-n.p.Exited():
			t.Fatalf("%s exited while waiting: %v", n.name, n.p.Err())
		default:
		}
	}
	if edge.logs.find("gateway listening") != nil {
		t.Fatal("the edge listens for phones before its Redis and NATS are up")
	}

	_, _ = testsvc.StartProc(t, "redis", redisBin, []string{
		"--port", strconv.Itoa(redisPort), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
	}, nil, func(line string) (string, bool) {
		return "", strings.Contains(line, "Ready to accept connections")
	})
	_, _ = testsvc.StartProc(t, "nats", natsBin, []string{"-a", "127.0.0.1", "-p", strconv.Itoa(natsPort)}, nil, func(line string) (string, bool) {
		return "", strings.Contains(line, "Server is ready")
	})

	// The retries back off to 5 s (Redis) and 2 s (NATS).
	for _, n := range []*node{edge, router} {
		if !testsvc.Eventually(30*time.Second, func() bool {
			code, _ := readyz(t, n.admin)
			return code == http.StatusOK
		}) {
			t.Fatalf("%s: /readyz not 200 within 30 s of Redis and NATS starting; its output:\n%s", n.name, strings.Join(n.logs.all(), "\n"))
		}
	}
	url := fmt.Sprint(edge.logs.waitFor(t, edge.p, "gateway listening", 10*time.Second)["url"])
	router.logs.waitFor(t, router.p, "router listening", 10*time.Second)

	ctx := testCtx(t)
	phone, err := client.Dial(ctx, url, client.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer phone.CloseNow()
	if _, err := phone.Hello(ctx, token, device(newDevice("late")), user); err != nil {
		t.Fatal(err)
	}
	if err := phone.Text("m-1", "hello"); err != nil {
		t.Fatal(err)
	}
	if _, err := phone.Expect(ctx, protocol.TypeMessage); err != nil {
		t.Fatalf("no answer from the demo agent: %v", err)
	}
}

// getStatus answers GET url's status.
func getStatus(t testing.TB, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestStopWhileWaiting: SIGTERM to an edge and a router waiting for a Redis
// and a NATS that never come ends them at once, with exit code 0.
func TestStopWhileWaiting(t *testing.T) {
	redisPort, err := testsvc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	natsPort, err := testsvc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	common := []string{
		"NATS_URL=nats://127.0.0.1:" + strconv.Itoa(natsPort),
		"REDIS_URL=redis://127.0.0.1:" + strconv.Itoa(redisPort),
		"MOBILE_ADMIN_LISTEN=127.0.0.1:0",
	}
	for _, tc := range []struct {
		name, bin string
		env       []string
	}{
		{"edge", bins.edge, []string{"MOBILE_LISTEN=127.0.0.1:0", "MOBILE_TOKEN=tok", "MOBILE_ROUTER=off"}},
		{"router", bins.router, []string{"MOBILE_ROUTER_LISTEN=127.0.0.1:0"}},
	} {
		logs := &logRecorder{t: t}
		p, _, err := testsvc.Launch(tc.name, tc.bin, nil, append(common, tc.env...), logs.logf, logMsg("admin listening"))
		if p != nil {
			t.Cleanup(func() { p.Stop(t.Logf) })
		}
		if err != nil {
			t.Fatal(err)
		}
		logs.waitFor(t, p, "redis not reachable; retrying", 20*time.Second)
		p.Signal(t, syscall.SIGTERM)
		select {
		case <-p.Exited():
			if p.Err() != nil {
				t.Errorf("%s: SIGTERM while waiting: %v, want exit code 0", tc.name, p.Err())
			}
		case <-time.After(testsvc.Slack(5 * time.Second)):
			t.Fatalf("%s: still running 5 s after SIGTERM while waiting", tc.name)
		}
	}
}
