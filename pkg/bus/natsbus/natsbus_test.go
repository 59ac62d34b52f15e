package natsbus_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/bus/bustest"
	"github.com/hermes-mobile/gateway/pkg/bus/natsbus"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
)

// TestEmbedded runs the suite on an embedded server per test; the second and
// later Buses reach it with ConnectInProcess.
func TestEmbedded(t *testing.T) {
	bustest.Run(t, func(t *testing.T) func() bus.Bus {
		log := testsvc.Logger(t)
		owner := embedded(t, natsbus.Options{Logger: log, Name: "owner"})
		return func() bus.Bus {
			b, err := natsbus.ConnectInProcess(owner.Server(), natsbus.Options{Logger: log})
			if err != nil {
				t.Fatalf("ConnectInProcess: %v", err)
			}
			return b
		}
	})
}

// TestExternal runs the suite on an external server: NATS_URL, else
// nats://127.0.0.1:4222 if it answers, else a nats-server started from PATH.
func TestExternal(t *testing.T) {
	url := externalURL(t)
	t.Logf("external server: %s", url)
	bustest.Run(t, func(t *testing.T) func() bus.Bus {
		log := testsvc.Logger(t)
		return func() bus.Bus {
			b, err := natsbus.Connect(url, natsbus.Options{Logger: log, Name: "bustest"})
			if err != nil {
				t.Fatalf("Connect %s: %v", url, err)
			}
			return b
		}
	})
}

// TestServerRestart stops and restarts a private nats-server under a
// connected Bus: while it is down calls fail fast with ErrUnavailable, and
// afterwards subscriptions made before (and during) the outage deliver again.
// The Bus counts the loss and the reconnect, and not its own close.
func TestServerRestart(t *testing.T) {
	srv := testsvc.StartNATS(t)
	url := srv.URL()
	log := testsvc.Logger(t)
	tel, err := telemetry.New(context.Background(), telemetry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	sub := connect(t, url, natsbus.Options{Logger: log, Name: "sub", Telemetry: tel})
	wantCounts(t, tel, 0, 0)
	pub := connect(t, url, natsbus.Options{Logger: log, Name: "pub"})

	var before, during, silent atomic.Int32
	mustSubscribe(t, sub, "restart.before", func(m *bus.Msg) {
		before.Add(1)
		_ = m.Respond([]byte("pong"))
	})
	mustSubscribe(t, sub, "restart.silent", func(*bus.Msg) { silent.Add(1) })
	testsvc.WaitFor(t, 10*time.Second, "a reply before the restart", func() bool {
		resp, err := pub.Request(ctxFor(t, time.Second), "restart.before", nil, nil)
		return err == nil && string(resp) == "pong"
	})

	// A request in flight when the server goes away ends by its ctx, as
	// unavailable.
	const inFlight = 1500 * time.Millisecond
	reqErr := make(chan error, 1)
	go func() {
		_, err := pub.Request(ctxFor(t, inFlight), "restart.silent", nil, nil)
		reqErr <- err
	}()
	testsvc.WaitFor(t, 10*time.Second, "the silent handler to get the request", func() bool { return silent.Load() == 1 })
	srv.Kill()
	select {
	case err := <-reqErr:
		if !errors.Is(err, bus.ErrUnavailable) {
			t.Errorf("Request in flight across the outage: %v, want ErrUnavailable", err)
		}
	case <-time.After(inFlight + 2*time.Second):
		t.Fatalf("Request in flight across the outage still waiting %s past its ctx", 2*time.Second)
	}

	// Publish fails fast once the client has seen the disconnect.
	testsvc.WaitFor(t, 10*time.Second, "Publish to fail with ErrUnavailable", func() bool {
		err := pub.Publish(t.Context(), "restart.before", nil, nil)
		return errors.Is(err, bus.ErrUnavailable)
	})
	// Even a Request without a deadline returns at once.
	start := time.Now()
	_, err = pub.Request(t.Context(), "restart.before", nil, nil)
	if !errors.Is(err, bus.ErrUnavailable) && !errors.Is(err, bus.ErrNoResponders) {
		t.Errorf("Request while down: %v, want ErrUnavailable", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Request while down took %s", took)
	}
	mustSubscribe(t, sub, "restart.during", func(*bus.Msg) { during.Add(1) })

	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	n := before.Load()
	testsvc.WaitFor(t, 10*time.Second, "subscriptions to deliver after the restart", func() bool {
		_ = pub.Publish(t.Context(), "restart.before", nil, nil)
		_ = pub.Publish(t.Context(), "restart.during", nil, nil) // the next poll sees them arrive
		return before.Load() > n && during.Load() > 0
	})
	resp, err := pub.Request(ctxFor(t, 5*time.Second), "restart.before", nil, nil)
	if err != nil || string(resp) != "pong" {
		t.Errorf("Request after the restart = %q, %v; want pong", resp, err)
	}
	wantCounts(t, tel, 1, 1)
	sub.Close()
	wantCounts(t, tel, 1, 1)
}

// wantCounts checks hermes_nats_disconnects_total and
// hermes_nats_reconnects_total.
func wantCounts(t *testing.T, tel *telemetry.Telemetry, disconnects, reconnects int) {
	t.Helper()
	rec := httptest.NewRecorder()
	tel.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for name, want := range map[string]int{"hermes_nats_disconnects_total": disconnects, "hermes_nats_reconnects_total": reconnects} {
		if line := name + " " + strconv.Itoa(want); !strings.Contains(body, line+"\n") {
			t.Errorf("/metrics lacks %q", line)
		}
	}
}

// slowConsumers is the value tel serves for hermes_nats_slow_consumers_total
// ("" when it serves none).
func slowConsumers(tel *telemetry.Telemetry) string {
	rec := httptest.NewRecorder()
	tel.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for line := range strings.Lines(rec.Body.String()) {
		if v, ok := strings.CutPrefix(line, "hermes_nats_slow_consumers_total "); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func TestClosedBus(t *testing.T) {
	b, err := natsbus.Embedded(natsbus.Options{Logger: testsvc.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	srv := b.Server()
	other := connectInProcess(t, b)
	s := mustSubscribe(t, b, "closed.x", func(*bus.Msg) {})
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if srv.Running() {
		t.Error("embedded server still running after Close")
	}
	if err := s.Unsubscribe(); err != nil {
		t.Errorf("Unsubscribe after Close: %v", err)
	}
	ctx := ctxFor(t, 5*time.Second)
	if err := b.Publish(ctx, "closed.x", nil, nil); !errors.Is(err, bus.ErrUnavailable) {
		t.Errorf("Publish after Close: %v, want ErrUnavailable", err)
	}
	if _, err := b.Request(ctx, "closed.x", nil, nil); !errors.Is(err, bus.ErrUnavailable) {
		t.Errorf("Request after Close: %v, want ErrUnavailable", err)
	}
	if _, err := b.Subscribe("closed.y", func(*bus.Msg) {}); !errors.Is(err, bus.ErrUnavailable) {
		t.Errorf("Subscribe after Close: %v, want ErrUnavailable", err)
	}
	// A Bus connected to the server that went away is unavailable too.
	testsvc.WaitFor(t, 10*time.Second, "the in-process Bus to see its server gone", func() bool {
		return errors.Is(other.Publish(ctx, "closed.x", nil, nil), bus.ErrUnavailable)
	})
	if _, err := natsbus.ConnectInProcess(srv, natsbus.Options{}); err == nil {
		t.Error("ConnectInProcess to a shut-down server succeeded")
	}
}

func TestConnectUnreachable(t *testing.T) {
	url := fmt.Sprintf("nats://127.0.0.1:%d", freePort(t))
	start := time.Now()
	_, err := natsbus.Connect(url, natsbus.Options{Logger: testsvc.Logger(t)})
	if !errors.Is(err, bus.ErrUnavailable) {
		t.Errorf("Connect to a closed port: %v, want ErrUnavailable", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Connect to a closed port took %s", took)
	}
}

// TestRetryConnect: with RetryConnect, Connect to a server that is not up
// yet returns at once; calls fail with ErrUnavailable and WaitConnected
// waits, the failed attempts are logged with the URL (without its
// password), and once the server is up the Bus connects and works.
func TestRetryConnect(t *testing.T) {
	// The server's port, with nothing listening on it until the server
	// starts again below.
	srv := testsvc.StartNATS(t, "--user", "user", "--pass", "secret-pw")
	srv.Kill()
	port := srv.Port()
	url := fmt.Sprintf("nats://user:secret-pw@127.0.0.1:%d", port)
	logs := testsvc.NewBuffer()
	log := slog.New(slog.NewJSONHandler(logs, nil))
	b, err := natsbus.Connect(url, natsbus.Options{Logger: log, RetryConnect: true})
	if err != nil {
		t.Fatalf("Connect with RetryConnect to a closed port: %v", err)
	}
	defer b.Close()
	if err := b.Publish(t.Context(), "retry.x", nil, nil); !errors.Is(err, bus.ErrUnavailable) {
		t.Errorf("Publish before the server is up: %v, want ErrUnavailable", err)
	}
	if err := b.WaitConnected(ctxFor(t, 100*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitConnected before the server is up: %v, want its ctx's deadline", err)
	}
	testsvc.WaitFor(t, 10*time.Second, "a failed attempt to be logged", func() bool {
		return strings.Contains(logs.String(), `"msg":"nats not reachable; retrying"`)
	})
	if strings.Contains(logs.String(), "secret-pw") {
		t.Errorf("the log shows the URL's password:\n%s", logs)
	}
	if want := fmt.Sprintf(`"url":"nats://user:xxxxx@127.0.0.1:%d"`, port); !strings.Contains(logs.String(), want) {
		t.Errorf("the log lacks %s:\n%s", want, logs)
	}

	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	if err := b.WaitConnected(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatalf("WaitConnected after the server came up: %v", err)
	}
	got := make(chan string, 1)
	mustSubscribe(t, b, "retry.x", func(m *bus.Msg) { got <- string(m.Data) })
	if err := b.Publish(t.Context(), "retry.x", []byte("hi"), nil); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-got:
		if s != "hi" {
			t.Errorf("got %q, want hi", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a message published after the connection was not delivered")
	}
}

// TestHeaderFirstValue: a header with several values arrives with the first.
func TestHeaderFirstValue(t *testing.T) {
	b := embedded(t, natsbus.Options{Logger: testsvc.Logger(t)})
	got := make(chan *bus.Msg, 1)
	mustSubscribe(t, b, "hdr", func(m *bus.Msg) { got <- m })
	nc, err := nats.Connect("", nats.InProcessServer(b.Server()))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	m := &nats.Msg{Subject: "hdr", Header: nats.Header{"K": {"first", "second"}, "One": {"1"}}, Data: []byte("d")}
	if err := nc.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		if m.Header["K"] != "first" || m.Header["One"] != "1" || len(m.Header) != 2 {
			t.Errorf("Header = %v, want K=first One=1", m.Header)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no message")
	}
}

// TestSlowConsumer: a blocked Handler fills its dispatcher's channel; the
// overflow is dropped, logged and counted in
// hermes_nats_slow_consumers_total, and the Bus goes on afterwards.
func TestSlowConsumer(t *testing.T) {
	var logs testsvc.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "natsbus-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	b := embedded(t, natsbus.Options{Logger: log, Dispatchers: 1, Pending: 1, Telemetry: tel})
	if c := slowConsumers(tel); c != "0" {
		t.Errorf("hermes_nats_slow_consumers_total is %q before any drop, want 0", c)
	}
	gate := make(chan struct{})
	var calls atomic.Int32
	mustSubscribe(t, b, "slow", func(*bus.Msg) {
		if calls.Add(1) == 1 {
			<-gate
		}
	})
	ctx := ctxFor(t, 10*time.Second)
	const n = 3000 // more than the 1024 a dispatcher buffers at least
	for range n {
		if err := b.Publish(ctx, "slow", nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	testsvc.WaitFor(t, 10*time.Second, "the slow consumer to be logged", func() bool { return strings.Contains(logs.String(), "slow consumer") })
	if c := slowConsumers(tel); c == "0" || c == "" {
		t.Errorf("hermes_nats_slow_consumers_total is %q after drops, want at least 1", c)
	}
	close(gate)
	// The Bus goes on: requests are answered again once the queue has room
	// (a request that arrives while it is full is dropped like the rest).
	// The one dispatcher works in order, so once a request is answered
	// every message kept before it has been handled.
	resp := mustSubscribe(t, b, "slow.after", func(m *bus.Msg) { _ = m.Respond([]byte("ok")) })
	defer resp.Unsubscribe()
	testsvc.WaitFor(t, 10*time.Second, "a request after the slow consumer to be answered", func() bool {
		r, err := b.Request(ctxFor(t, 500*time.Millisecond), "slow.after", nil, nil)
		return err == nil && string(r) == "ok"
	})
	if c := calls.Load(); c >= n {
		t.Errorf("blocked handler got all %d messages; want drops", c)
	}
}

// TestHandlerPanic: a panicking Handler is logged and its dispatcher goes on.
func TestHandlerPanic(t *testing.T) {
	var logs testsvc.Buffer
	b := embedded(t, natsbus.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Dispatchers: 1})
	var calls atomic.Int32
	mustSubscribe(t, b, "panic", func(*bus.Msg) {
		if calls.Add(1) == 1 {
			panic("boom")
		}
	})
	ctx := ctxFor(t, 5*time.Second)
	for range 2 {
		if err := b.Publish(ctx, "panic", nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	testsvc.WaitFor(t, 10*time.Second, "the message after the panic", func() bool { return calls.Load() == 2 })
	if !strings.Contains(logs.String(), "boom") {
		t.Errorf("panic not logged: %s", logs.String())
	}
}

// TestUnsubscribeHandlesQueued: messages routed to a subscription before
// its Unsubscribe, queued behind a running Handler, are still handled,
// marked Late (a request among them is answered, not left to time out).
// Unsubscribe does not wait for the running Handler.
func TestUnsubscribeHandlesQueued(t *testing.T) {
	b := embedded(t, natsbus.Options{Logger: testsvc.Logger(t), Dispatchers: 1})
	gate := make(chan struct{})
	var a, late, other atomic.Int32
	sa := mustSubscribe(t, b, "q", func(m *bus.Msg) {
		if a.Add(1) == 1 {
			<-gate
		}
		if m.Late {
			late.Add(1)
		}
		_ = m.Respond([]byte("answered"))
	})
	mustSubscribe(t, b, "q", func(*bus.Msg) { other.Add(1) })
	ctx := ctxFor(t, 5*time.Second)
	for range 9 {
		if err := b.Publish(ctx, "q", nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	testsvc.WaitFor(t, 10*time.Second, "the first message to block", func() bool { return a.Load() == 1 })
	// The tenth is a request from another connection, routed before the
	// unsubscribe: its Flush returns once the server has routed it.
	nc, err := nats.Connect("", nats.InProcessServer(b.Server()))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	inbox := nats.NewInbox()
	replies, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest("q", inbox, nil); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sa.Unsubscribe() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Unsubscribe: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Unsubscribe waited for the running handler")
	}
	close(gate)
	if m, err := replies.NextMsg(5 * time.Second); err != nil || string(m.Data) != "answered" {
		t.Errorf("the request routed before the unsubscribe: %v %v, want its answer", m, err)
	}
	testsvc.WaitFor(t, 10*time.Second, "the other subscription to get all 10", func() bool { return other.Load() == 10 })
	if got, l := a.Load(), late.Load(); got != 10 || l != 9 {
		t.Errorf("unsubscribed handler ran %d times (%d late), want 10 (9 late: all but the one running)", got, l)
	}
	if err := sa.Unsubscribe(); err != nil {
		t.Errorf("second Unsubscribe: %v", err)
	}
}

func TestCanceledContext(t *testing.T) {
	b := embedded(t, natsbus.Options{Logger: testsvc.Logger(t)})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := b.Publish(ctx, "x", nil, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("Publish with a canceled ctx: %v", err)
	}
	if _, err := b.QueueSubscribe("x", "", func(*bus.Msg) {}); err == nil {
		t.Error("QueueSubscribe with an empty queue: nil error")
	}
	if _, err := b.Subscribe("x", nil); err == nil {
		t.Error("Subscribe with a nil handler: nil error")
	}
}

// The embedded server opens no port: its "nats connected" says so
// instead of naming a URL nothing listens on.
func TestEmbeddedLogsInProcess(t *testing.T) {
	logs := testsvc.NewBuffer()
	embedded(t, natsbus.Options{Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	var line string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, `"msg":"nats connected"`) {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("no \"nats connected\" in the log:\n%s", logs)
	}
	if strings.Contains(line, "nats://") || !strings.Contains(line, `"url":"in-process"`) {
		t.Errorf("the embedded server's connect line: %s, want \"url\":\"in-process\" and no nats:// URL", line)
	}
}

// helpers

func embedded(t *testing.T, opts natsbus.Options) *natsbus.Bus {
	t.Helper()
	b, err := natsbus.Embedded(opts)
	if err != nil {
		t.Fatalf("Embedded: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func connectInProcess(t *testing.T, b *natsbus.Bus) *natsbus.Bus {
	t.Helper()
	o, err := natsbus.ConnectInProcess(b.Server(), natsbus.Options{Logger: testsvc.Logger(t)})
	if err != nil {
		t.Fatalf("ConnectInProcess: %v", err)
	}
	t.Cleanup(func() { _ = o.Close() })
	return o
}

func connect(t *testing.T, url string, opts natsbus.Options) *natsbus.Bus {
	t.Helper()
	b, err := natsbus.Connect(url, opts)
	if err != nil {
		t.Fatalf("Connect %s: %v", url, err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func mustSubscribe(t *testing.T, b bus.Bus, subject string, h bus.Handler) bus.Subscription {
	t.Helper()
	s, err := b.Subscribe(subject, h)
	if err != nil {
		t.Fatalf("Subscribe %s: %v", subject, err)
	}
	return s
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// external servers

func externalURL(t *testing.T) string {
	if url := os.Getenv("NATS_URL"); url != "" {
		return url
	}
	if c, err := net.DialTimeout("tcp", "127.0.0.1:4222", 300*time.Millisecond); err == nil {
		c.Close()
		return "nats://127.0.0.1:4222"
	}
	return testsvc.StartNATS(t).URL()
}

func freePort(t *testing.T) int {
	port, err := testsvc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// TestSubjectBound: a subject of exactly MaxSubjectBytes (prefix included)
// makes the round trip through a real server; one byte more is refused with
// ErrSubjectTooLong before it is sent, and the connection stays usable.
func TestSubjectBound(t *testing.T) {
	url := externalURL(t)
	const prefix = "bound."
	b := connect(t, url, natsbus.Options{Logger: testsvc.Logger(t), Name: "bound", SubjectPrefix: prefix})
	at := strings.Repeat("s", natsbus.MaxSubjectBytes-len(prefix))
	mustSubscribe(t, b, at, func(m *bus.Msg) { _ = m.Respond([]byte("pong")) })
	resp, err := b.Request(ctxFor(t, 5*time.Second), at, nil, nil)
	if err != nil || string(resp) != "pong" {
		t.Fatalf("request on a %d-byte subject: %q, %v", natsbus.MaxSubjectBytes, resp, err)
	}
	over := at + "s"
	ctx := ctxFor(t, 5*time.Second)
	if err := b.Publish(ctx, over, nil, nil); !errors.Is(err, natsbus.ErrSubjectTooLong) {
		t.Errorf("Publish one byte over: %v, want ErrSubjectTooLong", err)
	}
	if _, err := b.Request(ctx, over, nil, nil); !errors.Is(err, natsbus.ErrSubjectTooLong) {
		t.Errorf("Request one byte over: %v, want ErrSubjectTooLong", err)
	}
	if _, err := b.Subscribe(over, func(*bus.Msg) {}); !errors.Is(err, natsbus.ErrSubjectTooLong) {
		t.Errorf("Subscribe one byte over: %v, want ErrSubjectTooLong", err)
	}
	if _, err := b.Request(ctx, at, nil, nil); err != nil {
		t.Fatalf("request after the refusals: %v", err)
	}
	if err := b.Err(); err != nil {
		t.Errorf("Err on a live connection: %v", err)
	}
}

// TestErrWhenClosedForGood: a server that closes the connection over a
// protocol error (a control line past its maximum) leaves nats.go closed
// for good; Err reports it, so a liveness probe can fail.
func TestErrWhenClosedForGood(t *testing.T) {
	srv, err := server.NewServer(&server.Options{DontListen: true, MaxControlLine: 256})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(5 * time.Second) {
		t.Fatal("server not ready")
	}
	b, err := natsbus.ConnectInProcess(srv, natsbus.Options{Logger: testsvc.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if err := b.Err(); err != nil {
		t.Fatalf("Err before: %v", err)
	}
	_ = b.Publish(ctxFor(t, time.Second), strings.Repeat("x", 300), nil, nil)
	testsvc.WaitFor(t, 10*time.Second, "Err to report the closed connection", func() bool { return b.Err() != nil })
}

// TestUserOfItsPrefixOnly runs the suite as a NATS user allowed to publish
// and subscribe under the subject prefix alone ("gw1.>"), as an operator
// sharing one NATS between gateways grants it: a Bus's replies come on
// inboxes under its prefix (InboxPrefix), so the global _INBOX. is not
// needed. A client of that user on the default inbox gets no reply: the
// permission is what the suite ran under.
func TestUserOfItsPrefixOnly(t *testing.T) {
	const prefix = "gw1."
	perm := &server.SubjectPermission{Allow: []string{prefix + ">"}}
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		Users: []*server.User{{Username: "gw", Password: "pw", Permissions: &server.Permissions{Publish: perm, Subscribe: perm}}}})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	url := fmt.Sprintf("nats://gw:pw@%s", srv.Addr())
	if got := natsbus.InboxPrefix(prefix); got != "gw1._INBOX" {
		t.Fatalf("InboxPrefix(%q) = %q", prefix, got)
	}
	bustest.Run(t, func(t *testing.T) func() bus.Bus {
		log := testsvc.Logger(t)
		return func() bus.Bus {
			b, err := natsbus.Connect(url, natsbus.Options{Logger: log, Name: "prefixed", SubjectPrefix: prefix})
			if err != nil {
				t.Fatalf("Connect: %v", err)
			}
			return b
		}
	})

	responder, err := natsbus.Connect(url, natsbus.Options{Logger: testsvc.Logger(t), SubjectPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer responder.Close()
	sub, err := responder.Subscribe("echo", func(m *bus.Msg) { _ = m.Respond(m.Data) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got, err := responder.Request(ctx, "echo", []byte("y"), nil); err != nil || string(got) != "y" {
		t.Fatalf("the bus's own request: %q, %v", got, err) // the echo listens: its subscription is in place
	}
	nc, err := nats.Connect(url) // the default inbox, _INBOX.
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_, err = nc.Request(prefix+"echo", []byte("x"), 2*time.Second)
	if err == nil || errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("a request on the default inbox: %v; want no answer (the user may not subscribe to _INBOX.)", err)
	}
}
