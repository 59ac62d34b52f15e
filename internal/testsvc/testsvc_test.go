package testsvc

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
)

// TestScrapeKeysAsWritten: every sample is keyed `name{labels}` exactly as
// the exposition writes it (label values with spaces and commas, a
// histogram's buckets, a timestamp dropped); a sample without a number, or
// written twice, fails the scrape.
func TestScrapeKeysAsWritten(t *testing.T) {
	const text = `# HELP hermes_closes_total Connections closed.
# TYPE hermes_closes_total counter
hermes_closes_total{by="server",code="1000"} 3
hermes_closes_total{by="client",code="1001"} 0
# TYPE up gauge
up 1 1700000000000
msg_total{text="a b, c=\"d\"}"} 2.5
lat_bucket{le="+Inf"} 7
lat_sum 1e-3
`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, text) }))
	defer srv.Close()
	got := Scrape(t, srv.URL)
	want := map[string]float64{
		`hermes_closes_total{by="server",code="1000"}`: 3,
		`hermes_closes_total{by="client",code="1001"}`: 0,
		`up`:                              1,
		`msg_total{text="a b, c=\"d\"}"}`: 2.5,
		`lat_bucket{le="+Inf"}`:           7,
		`lat_sum`:                         0.001,
	}
	if len(got) != len(want) {
		t.Errorf("%d samples, want %d: %v", len(got), len(want), got)
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	if s := Samples(t, srv.Config.Handler); len(s) != len(want) {
		t.Errorf("in process: %d samples, want %d", len(s), len(want))
	}
	for _, bad := range []string{"x{a=\"1\"} NaNa\n", "x 1\nx 2\n", "x{a=\"1\" 1\n", "x\n"} {
		if m, err := ParseSamples(bad); err == nil {
			t.Errorf("ParseSamples(%q) = %v, want an error", bad, m)
		}
	}
}

// recorder is a testing.TB whose Fatalf records the message and ends the
// goroutine, as testing's does.
type recorder struct {
	testing.TB
	msg string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// fails runs f with a recorder and returns what it failed with ("" if it
// did not fail).
func fails(t *testing.T, f func(tb testing.TB)) string {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r.msg
}

// TestWaitForSaysWhat: a condition that never holds fails the test with
// what was waited for and for how long; one that comes true in time does
// not fail; Eventually reports both; WaitChan and WaitMetric say what they
// waited for too.
func TestWaitForSaysWhat(t *testing.T) {
	msg := fails(t, func(tb testing.TB) {
		WaitFor(tb, 50*time.Millisecond, "the outbox of dev-1 to be empty", func() bool { return false })
	})
	if !strings.Contains(msg, "the outbox of dev-1 to be empty") || !strings.Contains(msg, Slack(50*time.Millisecond).String()) {
		t.Errorf("WaitFor failed with %q, want the condition and the limit", msg)
	}
	var mu sync.Mutex
	n := 0
	msg = fails(t, func(tb testing.TB) {
		WaitFor(tb, 10*time.Second, "three polls", func() bool {
			mu.Lock()
			defer mu.Unlock()
			n++
			return n == 3
		})
	})
	if msg != "" || n != 3 {
		t.Errorf("a condition true at the third poll: failed with %q after %d polls", msg, n)
	}
	if Eventually(30*time.Millisecond, func() bool { return false }) {
		t.Error("Eventually of a false condition is true")
	}
	if !Eventually(time.Second, func() bool { return true }) {
		t.Error("Eventually of a true condition is false")
	}
	msg = fails(t, func(tb testing.TB) { WaitChan(tb, 30*time.Millisecond, "the ack", make(chan int)) })
	if !strings.Contains(msg, "the ack") {
		t.Errorf("WaitChan failed with %q", msg)
	}
	ch := make(chan int, 1)
	ch <- 7
	if v := WaitChan(t, time.Second, "a value", ch); v != 7 {
		t.Errorf("WaitChan = %d, want 7", v)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "g 2\n") }))
	defer srv.Close()
	if m := WaitMetric(t, time.Second, srv.URL, "g", Equals(2)); m["g"] != 2 {
		t.Errorf("WaitMetric returned %v", m)
	}
	msg = fails(t, func(tb testing.TB) { WaitMetric(tb, 50*time.Millisecond, srv.URL, "g", AtLeast(3)) })
	if !strings.Contains(msg, "g ≥ 3: it is 2") {
		t.Errorf("WaitMetric failed with %q", msg)
	}
}

// The child of TestProcLifecycle: it says "ready", answers SIGUSR1 with
// "usr1", and exits with code 3 on SIGTERM.
func init() {
	if os.Getenv("TESTSVC_CHILD") != "1" {
		return
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGTERM)
	fmt.Println("ready")
	for s := range sigs {
		if s == syscall.SIGTERM {
			fmt.Println("bye")
			os.Exit(3)
		}
		fmt.Println("usr1")
	}
}

func procState(t *testing.T, pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	i := strings.LastIndexByte(string(b), ')')
	return b[i+2]
}

// TestProcLifecycle: a process started with StartProc is ready once it
// says so; frozen (SIGSTOP) it is stopped and answers nothing, thawed
// (SIGCONT) it answers again; SIGTERM ends it with its own exit code; a
// SIGKILLed one reports exit code -1 and an error; its output is kept.
func TestProcLifecycle(t *testing.T) {
	env := []string{"TESTSVC_CHILD=1"}
	p, v := StartProc(t, "child", os.Args[0], []string{"-test.run=^$"}, env, func(l string) (string, bool) {
		return "up", l == "ready"
	})
	if v != "up" {
		t.Fatalf("ready returned %q", v)
	}
	if p.ExitCode() != -1 || p.Err() != nil {
		t.Errorf("running: exit code %d, err %v", p.ExitCode(), p.Err())
	}
	p.Freeze(t)
	if s := procState(t, p.Pid()); s != 'T' {
		t.Errorf("frozen: state %c, want T", s)
	}
	usr1 := p.Watch(func(l string) (string, bool) { return l, l == "usr1" })
	p.Signal(t, syscall.SIGUSR1)
	select {
	case <-usr1:
		t.Error("a frozen process answered SIGUSR1")
	case <-time.After(100 * time.Millisecond): // a frozen process answers nothing: no event to wait for
	}
	p.Thaw(t)
	WaitChan(t, 10*time.Second, "the thawed process to answer SIGUSR1", usr1)
	p.Signal(t, syscall.SIGTERM)
	p.WaitExit(t, 10*time.Second)
	if p.ExitCode() != 3 || p.Err() == nil {
		t.Errorf("after SIGTERM: exit code %d, err %v; want 3", p.ExitCode(), p.Err())
	}
	if l := p.LastLines(); !strings.Contains(l, "usr1\nbye") {
		t.Errorf("last lines %q", l)
	}

	k, _, err := Launch("victim", os.Args[0], []string{"-test.run=^$"}, env, nil, func(l string) (string, bool) { return "", l == "ready" })
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop(t.Logf)
	k.Kill(t)
	if k.ExitCode() != -1 || k.Err() == nil || !strings.Contains(k.Err().Error(), "killed") {
		t.Errorf("after SIGKILL: exit code %d, err %v", k.ExitCode(), k.Err())
	}
	k.Stop(t.Logf) // idempotent on an exited process

	if _, _, err := Launch("early", "/bin/sh", []string{"-c", "echo oops; exit 2"}, nil, nil, func(l string) (string, bool) { return "", l == "ready" }); err == nil ||
		!strings.Contains(err.Error(), "exited before it was ready") || !strings.Contains(err.Error(), "oops") {
		t.Errorf("a process that exits before it is ready: %v", err)
	}
}

// TestRedisRestartsOnItsPort: a private redis-server keeps its port
// through a kill and a restart, a client's next command after the restart
// reaches the new process (which kept nothing), a frozen one answers
// nothing until thawed.
func TestRedisRestartsOnItsPort(t *testing.T) {
	srv := StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: 3})
	defer rdb.Close()
	ctx := t.Context()
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	port, pid := srv.Port(), srv.Proc().Pid()
	srv.Kill()
	if err := RedisPing(srv.Addr()); err == nil {
		t.Fatal("a killed redis-server answers PING")
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	if srv.Port() != port || srv.Proc().Pid() == pid {
		t.Errorf("after the restart: port %d pid %d, was %d %d", srv.Port(), srv.Proc().Pid(), port, pid)
	}
	if err := rdb.Get(ctx, "k").Err(); err != redis.Nil {
		t.Errorf("GET k on the restarted server without persistence: %v, want nil reply", err)
	}
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	if err := RedisPing(srv.Addr()); err == nil { // waits 1 s for the answer
		t.Error("a frozen redis-server answered PING")
	}
	if err := srv.Thaw(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Errorf("PING after thaw: %v", err)
	}
	if err := srv.Start(); err == nil {
		t.Error("Start of a running server succeeded")
	}

	durable := StartRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	d := redis.NewClient(&redis.Options{Addr: durable.Addr()})
	defer d.Close()
	if err := d.Set(ctx, "k", "kept", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := durable.Restart(); err != nil {
		t.Fatal(err)
	}
	if v, err := d.Get(ctx, "k").Result(); v != "kept" {
		t.Errorf("GET k after restarting with AOF: %q, %v", v, err)
	}
}

// TestNATSRestartsOnItsPort: a private nats-server keeps its port and its
// JetStream store through a kill and a restart, and a client reconnects to
// it by itself.
func TestNATSRestartsOnItsPort(t *testing.T) {
	srv := StartNATS(t)
	reconnected := make(chan struct{}, 1)
	nc, err := nats.Connect(srv.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
		nats.ReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "s.1", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	port := srv.Port()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if srv.Port() != port {
		t.Errorf("port %d after the restart, was %d", srv.Port(), port)
	}
	WaitChan(t, 10*time.Second, "the client to reconnect to the restarted nats-server", reconnected)
	var msg jetstream.RawStreamMsg
	WaitFor(t, 10*time.Second, "the stream to be back with its message", func() bool {
		s, err := js.Stream(ctx, "S")
		if err != nil {
			return false
		}
		m, err := s.GetMsg(ctx, 1)
		if err != nil {
			return false
		}
		msg = *m
		return true
	})
	if string(msg.Data) != "kept" {
		t.Errorf("message 1 after the restart: %q", msg.Data)
	}
}

// TestFreePortNeverRepeats: FreePort never returns a port twice in one
// process, though the kernel, asked for a free port a thousand times,
// offers some again (a thousand of its ~14,000 repeat dozens of times).
func TestFreePortNeverRepeats(t *testing.T) {
	seen := map[int]bool{}
	for range 1000 {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("FreePort returned %d twice (after %d ports)", p, len(seen))
		}
		seen[p] = true
	}
}
