// Package bustest is the conformance suite of bus.Bus: every implementation
// runs Run against each kind of server it supports.
//
// Tests run in parallel and may share one server with other runs, so every
// test works under a subject prefix of its own.
package bustest

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/bus"
)

// Factory is called once per test, with that test's t, and returns newBus.
// Every Bus newBus returns is new and connected to the same server as the
// others returned for that test. The suite closes each Bus it gets; the
// factory releases anything else (a server it started) with t.Cleanup.
type Factory func(t *testing.T) (newBus func() bus.Bus)

// Timeouts of the suite.
const (
	// waitTime bounds every wait for a delivery.
	waitTime = 15 * time.Second
	// quiet is how long the suite watches for a message that must not come.
	quiet = 100 * time.Millisecond
)

// Run runs the conformance suite against the buses f makes.
func Run(t *testing.T, f Factory) {
	// Counts goroutines process-wide, so it runs before the parallel tests.
	t.Run("ManySubscriptions", func(t *testing.T) { testManySubscriptions(t, newEnv(t, f)) })

	tests := []struct {
		name string
		fn   func(t *testing.T, e *env)
	}{
		{"PublishSubscribe", testPublishSubscribe},
		{"TwoBuses", testTwoBuses},
		{"RequestReply", testRequestReply},
		{"NoResponders", testNoResponders},
		{"RequestTimeout", testRequestTimeout},
		{"QueueGroup", testQueueGroup},
		{"Order", testOrder},
		{"Unsubscribe", testUnsubscribe},
		{"Close", testClose},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newEnv(t, f))
		})
	}
}

// env is one test's view of the buses under test.
type env struct {
	t      *testing.T
	raw    func() bus.Bus
	prefix string
}

func newEnv(t *testing.T, f Factory) *env {
	var r [6]byte
	if _, err := rand.Read(r[:]); err != nil {
		t.Fatal(err)
	}
	return &env{t: t, raw: f(t), prefix: "bustest." + hex.EncodeToString(r[:]) + "." + bus.EscapeToken(t.Name())}
}

// bus returns a new Bus that is closed, and must close cleanly, when the
// test ends.
func (e *env) bus() bus.Bus {
	e.t.Helper()
	b := e.raw()
	if b == nil {
		e.t.Fatal("factory returned a nil Bus")
	}
	e.t.Cleanup(func() {
		if err := b.Close(); err != nil {
			e.t.Errorf("Close: %v", err)
		}
	})
	return b
}

// subject returns a subject under the test's prefix.
func (e *env) subject(tokens ...any) string {
	s := e.prefix
	for _, tok := range tokens {
		s += "." + bus.EscapeToken(fmt.Sprint(tok))
	}
	return s
}

func (e *env) ctx(d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(e.t.Context(), d)
	e.t.Cleanup(cancel)
	return ctx
}

func subscribe(t *testing.T, b bus.Bus, subject string, h bus.Handler) bus.Subscription {
	t.Helper()
	s, err := b.Subscribe(subject, h)
	if err != nil {
		t.Fatalf("Subscribe %s: %v", subject, err)
	}
	return s
}

func queueSubscribe(t *testing.T, b bus.Bus, subject, queue string, h bus.Handler) bus.Subscription {
	t.Helper()
	s, err := b.QueueSubscribe(subject, queue, h)
	if err != nil {
		t.Fatalf("QueueSubscribe %s %s: %v", subject, queue, err)
	}
	return s
}

func publish(t *testing.T, ctx context.Context, b bus.Bus, subject string, data []byte, header map[string]string) {
	t.Helper()
	if err := b.Publish(ctx, subject, data, header); err != nil {
		t.Fatalf("Publish %s: %v", subject, err)
	}
}

// ready returns once subscriptions made on to before the call receive what
// from publishes: a bus processes one connection's operations in order, so
// once a probe subscribed after them answers a request from from, they are
// in place too.
func (e *env) ready(from, to bus.Bus) {
	e.t.Helper()
	subj := e.subject("ready", rand.Text())
	s := subscribe(e.t, to, subj, func(m *bus.Msg) { _ = m.Respond([]byte("ok")) })
	defer func() { _ = s.Unsubscribe() }()
	deadline := time.Now().Add(waitTime)
	for {
		ctx, cancel := context.WithTimeout(e.t.Context(), time.Second)
		resp, err := from.Request(ctx, subj, nil, nil)
		cancel()
		if err == nil {
			if string(resp) != "ok" {
				e.t.Fatalf("ready probe: reply %q, want ok", resp)
			}
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("ready probe: no reply within %s: %v", waitTime, err)
		}
		time.Sleep(10 * time.Millisecond) // the probe's pace: each try is itself a wait for the reply
	}
}

// waitFor polls cond until it holds, or fails the test after waitTime.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testsvc.WaitFor(t, waitTime, what, cond)
}

func recv(t *testing.T, ch <-chan *bus.Msg) *bus.Msg {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(waitTime):
		t.Fatalf("no message within %s", waitTime)
		return nil
	}
}

// collect returns a Handler that sends each message to the returned channel.
func collect(n int) (bus.Handler, <-chan *bus.Msg) {
	ch := make(chan *bus.Msg, n)
	return func(m *bus.Msg) { ch <- m }, ch
}

func testPublishSubscribe(t *testing.T, e *env) {
	pub, sub := e.bus(), e.bus()
	ctx := e.ctx(waitTime)
	subj := e.subject("pubsub")
	h, got := collect(8)
	subscribe(t, sub, subj, h)
	e.ready(pub, sub)

	hdr := map[string]string{"Content-Type": "text/plain", "x-lower": "v1", "X-Id": "42"}
	data := []byte("hello")
	publish(t, ctx, pub, subj, data, hdr)
	copy(data, "XXXXX") // the caller may reuse its buffer once Publish returns
	m := recv(t, got)
	if m.Subject != subj {
		t.Errorf("Subject = %q, want %q", m.Subject, subj)
	}
	if string(m.Data) != "hello" {
		t.Errorf("Data = %q, want hello", m.Data)
	}
	if !maps.Equal(m.Header, hdr) {
		t.Errorf("Header = %v, want %v", m.Header, hdr)
	}
	if m.Respond == nil {
		t.Fatal("Respond is nil")
	}
	if err := m.Respond([]byte("nobody asked")); err != nil {
		t.Errorf("Respond to a published message: %v, want nil (no-op)", err)
	}

	publish(t, ctx, pub, subj, nil, nil)
	m = recv(t, got)
	if len(m.Data) != 0 || len(m.Header) != 0 {
		t.Errorf("empty message arrived as data %q header %v", m.Data, m.Header)
	}

	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	publish(t, ctx, pub, subj, big, nil)
	if m = recv(t, got); string(m.Data) != string(big) {
		t.Errorf("1 MiB message arrived as %d different bytes", len(m.Data))
	}
}

func testTwoBuses(t *testing.T, e *env) {
	a, b := e.bus(), e.bus()
	ctx := e.ctx(waitTime)
	toA, toB, both := e.subject("a"), e.subject("b"), e.subject("both")
	ha, gotA := collect(8)
	hb, gotB := collect(8)
	hab, gotBothA := collect(8)
	hbb, gotBothB := collect(8)
	subscribe(t, a, toA, ha)
	subscribe(t, b, toB, hb)
	subscribe(t, a, both, hab)
	subscribe(t, b, both, hbb)
	e.ready(a, b)
	e.ready(b, a)

	publish(t, ctx, a, toB, []byte("from a"), nil)
	publish(t, ctx, b, toA, []byte("from b"), nil)
	if m := recv(t, gotB); string(m.Data) != "from a" {
		t.Errorf("b got %q, want %q", m.Data, "from a")
	}
	if m := recv(t, gotA); string(m.Data) != "from b" {
		t.Errorf("a got %q, want %q", m.Data, "from b")
	}

	// A Bus also delivers its own messages to its own subscriptions.
	publish(t, ctx, a, both, []byte("1"), nil)
	publish(t, ctx, b, both, []byte("2"), nil)
	for name, ch := range map[string]<-chan *bus.Msg{"a": gotBothA, "b": gotBothB} {
		seen := map[string]bool{}
		for range 2 {
			seen[string(recv(t, ch).Data)] = true
		}
		if !seen["1"] || !seen["2"] {
			t.Errorf("%s got %v on %s, want 1 and 2", name, seen, both)
		}
	}
}

func testRequestReply(t *testing.T, e *env) {
	client, server := e.bus(), e.bus()
	subj, later := e.subject("echo"), e.subject("later")
	subscribe(t, server, subj, func(m *bus.Msg) {
		if err := m.Respond([]byte("re:" + string(m.Data) + "/" + m.Header["k"])); err != nil {
			t.Errorf("Respond: %v", err)
		}
	})
	// A handler may keep Respond and answer after it returned.
	pending := make(chan func([]byte) error, 1)
	subscribe(t, server, later, func(m *bus.Msg) { pending <- m.Respond })
	go func() {
		if respond, ok := <-pending; ok {
			time.Sleep(20 * time.Millisecond) // the answer comes after the handler returned: that is what is tested
			_ = respond([]byte("late"))
		}
	}()
	e.ready(client, server)

	resp, err := client.Request(e.ctx(waitTime), subj, []byte("ping"), map[string]string{"k": "v"})
	if err != nil || string(resp) != "re:ping/v" {
		t.Fatalf("Request = %q, %v; want re:ping/v", resp, err)
	}
	resp, err = client.Request(e.ctx(waitTime), later, nil, nil)
	if err != nil || string(resp) != "late" {
		t.Fatalf("Request answered after the handler returned = %q, %v; want late", resp, err)
	}

	// Concurrent requests each get their own reply.
	ctx := e.ctx(waitTime)
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 25 {
				req := strconv.Itoa(g) + "-" + strconv.Itoa(i)
				resp, err := client.Request(ctx, subj, []byte(req), nil)
				if want := "re:" + req + "/"; err != nil || string(resp) != want {
					t.Errorf("Request %s = %q, %v; want %q", req, resp, err, want)
					return
				}
			}
		})
	}
	wg.Wait()
}

func testNoResponders(t *testing.T, e *env) {
	b := e.bus()
	start := time.Now()
	_, err := b.Request(e.ctx(10*time.Second), e.subject("nobody"), []byte("x"), nil)
	if took := time.Since(start); took > time.Second {
		t.Errorf("Request with no subscriber took %s, want < 1s", took)
	}
	if !errors.Is(err, bus.ErrNoResponders) {
		t.Fatalf("Request with no subscriber: %v, want ErrNoResponders", err)
	}

	// Once the only subscriber leaves, there is nobody again.
	subj := e.subject("left")
	s := subscribe(t, b, subj, func(m *bus.Msg) { _ = m.Respond([]byte("here")) })
	if resp, err := b.Request(e.ctx(waitTime), subj, nil, nil); err != nil || string(resp) != "here" {
		t.Fatalf("Request = %q, %v; want here", resp, err)
	}
	if err := s.Unsubscribe(); err != nil {
		t.Fatalf("Unsubscribe: %v", err)
	}
	waitFor(t, "ErrNoResponders after Unsubscribe", func() bool {
		_, err := b.Request(e.ctx(waitTime), subj, nil, nil)
		return errors.Is(err, bus.ErrNoResponders)
	})
}

func testRequestTimeout(t *testing.T, e *env) {
	client, server := e.bus(), e.bus()
	subj := e.subject("silent")
	var got atomic.Int32
	subscribe(t, server, subj, func(*bus.Msg) { got.Add(1) })
	e.ready(client, server)

	const d = 300 * time.Millisecond
	start := time.Now()
	_, err := client.Request(e.ctx(d), subj, []byte("x"), nil)
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Request to a silent handler: %v, want context.DeadlineExceeded", err)
	}
	if errors.Is(err, bus.ErrNoResponders) {
		t.Errorf("Request to a silent handler: %v, must not be ErrNoResponders", err)
	}
	if took < d-10*time.Millisecond || took > d+2*time.Second {
		t.Errorf("Request with a %s ctx returned after %s", d, took)
	}
	waitFor(t, "the silent handler to get the request", func() bool { return got.Load() == 1 })

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := client.Request(ctx, subj, nil, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("Request with a canceled ctx: %v, want context.Canceled", err)
	}
}

func testQueueGroup(t *testing.T, e *env) {
	b1, b2 := e.bus(), e.bus()
	ctx := e.ctx(waitTime)
	subj := e.subject("work")
	const n = 2000
	var (
		seen    [n]atomic.Int32 // deliveries per message to the group
		members [3]atomic.Int32 // deliveries per member
		total   atomic.Int32    // deliveries to the group
		plain   atomic.Int32    // deliveries to a plain subscriber
	)
	member := func(id int) bus.Handler {
		return func(m *bus.Msg) {
			i, err := strconv.Atoi(string(m.Data))
			if err != nil || i < 0 || i >= n {
				t.Errorf("member %d got %q", id, m.Data)
				return
			}
			seen[i].Add(1)
			members[id].Add(1)
			total.Add(1)
		}
	}
	queueSubscribe(t, b1, subj, "workers", member(0))
	queueSubscribe(t, b1, subj, "workers", member(1))
	queueSubscribe(t, b2, subj, "workers", member(2))
	subscribe(t, b2, subj, func(*bus.Msg) { plain.Add(1) })
	e.ready(b1, b2)

	for i := range n {
		publish(t, ctx, b1, subj, []byte(strconv.Itoa(i)), nil)
	}
	waitFor(t, "the group and the plain subscriber to get every message", func() bool {
		return total.Load() >= n && plain.Load() >= n
	})
	time.Sleep(quiet) // the window in which a message must not come: nothing to wait for
	if got := total.Load(); got != n {
		t.Errorf("group handled %d deliveries for %d messages", got, n)
	}
	if got := plain.Load(); got != n {
		t.Errorf("plain subscriber beside the group got %d of %d", got, n)
	}
	for i := range seen {
		if c := seen[i].Load(); c != 1 {
			t.Errorf("message %d handled %d times by the group, want once", i, c)
		}
	}
	// Each member is in the group: with n messages, one left idle is not.
	for id := range members {
		if members[id].Load() == 0 {
			t.Errorf("member %d got none of %d messages (spread %d %d %d)", id, n,
				members[0].Load(), members[1].Load(), members[2].Load())
		}
	}
}

// pace publishes count messages per subject, one goroutine per subject,
// keeping at most window of each subject's messages unreceived, so a bus
// that buffers window*len(subjects) messages never has to drop.
func pace(t *testing.T, ctx context.Context, b bus.Bus, subjects []string, count, window int, received func(i int) int) {
	t.Helper()
	var wg sync.WaitGroup
	for i, subj := range subjects {
		wg.Go(func() {
			deadline := time.Now().Add(waitTime)
			for seq := range count {
				for seq-received(i) >= window {
					if time.Now().After(deadline) {
						t.Errorf("%s: %d of %d received after %s", subj, received(i), seq, waitTime)
						return
					}
					time.Sleep(100 * time.Microsecond) // the publisher's pace while its window is full
				}
				data := binary.BigEndian.AppendUint32(nil, uint32(seq))
				if err := b.Publish(ctx, subj, data, nil); err != nil {
					t.Errorf("Publish %s: %v", subj, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func testOrder(t *testing.T, e *env) {
	pub, sub := e.bus(), e.bus()
	const subjects, count = 20, 2000
	type state struct {
		busy  atomic.Bool   // a handler call is running
		next  atomic.Uint32 // next sequence number expected
		recv  atomic.Int32
		wrong atomic.Int32 // out of order or concurrent
	}
	var states [subjects]state
	var names []string
	for i := range subjects {
		st := &states[i]
		subj := e.subject("order", i)
		names = append(names, subj)
		subscribe(t, sub, subj, func(m *bus.Msg) {
			if !st.busy.CompareAndSwap(false, true) {
				st.wrong.Add(1)
				return
			}
			defer st.busy.Store(false)
			if len(m.Data) != 4 {
				st.wrong.Add(1)
				return
			}
			if seq := binary.BigEndian.Uint32(m.Data); seq != st.next.Load() {
				if st.wrong.Add(1) == 1 {
					t.Errorf("%s: got %d, want %d", m.Subject, seq, st.next.Load())
				}
				st.next.Store(seq + 1)
			} else {
				st.next.Add(1)
			}
			st.recv.Add(1)
		})
	}
	e.ready(pub, sub)
	pace(t, e.ctx(waitTime), pub, names, count, 500, func(i int) int { return int(states[i].recv.Load()) })
	waitFor(t, "every message", func() bool {
		for i := range states {
			if states[i].recv.Load() < count {
				return false
			}
		}
		return true
	})
	for i := range states {
		st := &states[i]
		if st.wrong.Load() != 0 || st.recv.Load() != count {
			t.Errorf("%s: %d received, %d out of order or concurrent", names[i], st.recv.Load(), st.wrong.Load())
		}
	}
}

func testUnsubscribe(t *testing.T, e *env) {
	pub, sub := e.bus(), e.bus()
	ctx := e.ctx(waitTime)
	subj := e.subject("unsub")
	var a, b atomic.Int32
	sa := subscribe(t, sub, subj, func(m *bus.Msg) {
		if !m.Late {
			a.Add(1)
		}
	})
	subscribe(t, sub, subj, func(*bus.Msg) { b.Add(1) })
	e.ready(pub, sub)

	publish(t, ctx, pub, subj, []byte("1"), nil)
	waitFor(t, "both subscriptions to get 1", func() bool { return a.Load() == 1 && b.Load() == 1 })
	if err := sa.Unsubscribe(); err != nil {
		t.Fatalf("Unsubscribe: %v", err)
	}
	for range 10 {
		publish(t, ctx, pub, subj, []byte("more"), nil)
	}
	// Both subscriptions' copies of a message are handled in order on one
	// subject: once b has them all, a had its chance at each.
	waitFor(t, "the remaining subscription to get the rest", func() bool { return b.Load() == 11 })
	if got := a.Load(); got != 1 {
		t.Errorf("handler called %d times without Late, want 1", got)
	}

	// A handler may end its own subscription: the messages routed to it
	// before are still handled, marked Late, and no others.
	self := e.subject("self")
	var calls, onTime, other atomic.Int32
	subs := make(chan bus.Subscription, 1)
	s := subscribe(t, sub, self, func(m *bus.Msg) {
		calls.Add(1)
		if !m.Late && onTime.Add(1) == 1 {
			if err := (<-subs).Unsubscribe(); err != nil {
				t.Errorf("Unsubscribe in handler: %v", err)
			}
		}
	})
	subs <- s
	subscribe(t, sub, self, func(*bus.Msg) { other.Add(1) })
	e.ready(pub, sub)
	for range 50 {
		publish(t, ctx, pub, self, nil, nil)
	}
	waitFor(t, "the other subscription to get all 50", func() bool { return other.Load() == 50 })
	if got := onTime.Load(); got != 1 {
		t.Errorf("handler that unsubscribed itself called %d times without Late, want 1", got)
	}
	if got := calls.Load(); got < 1 || got > 50 {
		t.Errorf("handler that unsubscribed itself called %d times, want 1 to 50", got)
	}
	t.Logf("the handler that unsubscribed itself was called %d times (the rest were routed to it before)", calls.Load())
}

func testManySubscriptions(t *testing.T, e *env) {
	pub, sub := e.bus(), e.bus()
	e.ready(pub, sub)
	const n = 20000
	names := make([]string, n)
	for i := range names {
		names[i] = e.subject("many", i)
	}
	var seen [n]atomic.Int32
	var total atomic.Int32

	before := runtime.NumGoroutine()
	for i, subj := range names {
		subscribe(t, sub, subj, func(m *bus.Msg) {
			if m.Subject != subj {
				t.Errorf("handler of %s got %s", subj, m.Subject)
			}
			seen[i].Add(1)
			total.Add(1)
		})
	}
	e.ready(pub, sub)
	ctx := e.ctx(waitTime)
	deadline := time.Now().Add(waitTime)
	for i, subj := range names {
		for int(total.Load()) < i-5000 { // keep at most 5000 in flight
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d delivered after %s", total.Load(), i, waitTime)
			}
			time.Sleep(100 * time.Microsecond) // the publisher's pace while 5000 are in flight
		}
		publish(t, ctx, pub, subj, nil, nil)
	}
	waitFor(t, "a message on each subscription", func() bool { return total.Load() >= n })
	after := runtime.NumGoroutine()
	t.Logf("goroutines: %d before %d subscriptions, %d after", before, n, after)
	if after-before >= 50 {
		t.Errorf("goroutines grew by %d (%d to %d) for %d subscriptions, want < 50", after-before, before, after, n)
	}
	time.Sleep(quiet) // the window in which a message must not come: nothing to wait for
	for i := range seen {
		if c := seen[i].Load(); c != 1 {
			t.Fatalf("%s handled %d times, want once", names[i], c)
		}
	}
}

func testClose(t *testing.T, e *env) {
	keep := e.bus()
	b := e.raw()
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = b.Close()
		}
	})
	subj := e.subject("closed")
	var got atomic.Int32
	subscribe(t, b, subj, func(*bus.Msg) { got.Add(1) })
	e.ready(keep, b)
	closed = true
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	ctx := e.ctx(waitTime)
	if err := b.Publish(ctx, subj, nil, nil); err == nil {
		t.Error("Publish after Close: nil error")
	}
	start := time.Now()
	if _, err := b.Request(ctx, subj, nil, nil); err == nil {
		t.Error("Request after Close: nil error")
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Request after Close took %s", took)
	}
	if _, err := b.Subscribe(subj, func(*bus.Msg) {}); err == nil {
		t.Error("Subscribe after Close: nil error")
	}
	// The closed Bus no longer receives, and others go on.
	publish(t, ctx, keep, subj, nil, nil)
	time.Sleep(quiet) // the window in which a message must not come: nothing to wait for
	if n := got.Load(); n != 0 {
		t.Errorf("closed Bus handled %d messages", n)
	}
}
