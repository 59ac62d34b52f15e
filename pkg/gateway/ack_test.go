package gateway_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// ackNode starts a node whose agent answers a text with one final message
// of id "r-<the text's id>" and the text itself. handled(id) waits until
// the agent's answer to id returned (the router counts it as delivered or
// kept it).
func ackNode(t *testing.T, mutate func(*gateway.Config)) (n *node, handled func(id string)) {
	var mu sync.Mutex
	done := make(map[string]chan struct{})
	ch := func(id string) chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		if done[id] == nil {
			done[id] = make(chan struct{})
		}
		return done[id]
	}
	n = startNode(t, func(cfg *gateway.Config) {
		cfg.Agent = agent.Func(func(ctx context.Context, ev wire.Event, out agent.Output) error {
			defer close(ch(ev.Device + "/" + ev.ID))
			return out.Message(ctx, "r-"+ev.ID, ev.Text, false, true)
		})
		if mutate != nil {
			mutate(cfg)
		}
	})
	return n, func(id string) {
		t.Helper()
		select {
		case <-ch(id):
		case <-testCtx(t).Done():
			t.Fatalf("the agent's answer to %s did not return", id)
		}
	}
}

// waitOutboxItems waits until the device's outbox holds want items.
func waitOutboxItems(t *testing.T, n *node, device string, want int) {
	t.Helper()
	var items []store.OutboxItem
	var err error
	if !testsvc.Eventually(10*time.Second, func() bool {
		items, err = n.Store.PeekOutbox(testCtx(t), device, 0)
		return err == nil && len(items) == want
	}) {
		t.Fatalf("the outbox holds %d items (%v), want %d", len(items), err, want)
	}
}

// ackRead reads frames until the final message id and returns its text.
func ackRead(t *testing.T, c *client.Conn, id string) string {
	t.Helper()
	text, _, err := c.CollectMessage(testCtx(t), id)
	if err != nil {
		t.Fatalf("message %s: %v", id, err)
	}
	return text
}

// TestAckUnackedGoesBackToOutbox: a phone that acknowledges what it
// displays (it has sent an ack) gets an answer, does not ack it, and its
// socket closes. The answer counts as not delivered: it waits in the
// outbox and arrives on the next connection. A phone that never acks is
// answered as before: written is delivered.
func TestAckUnackedGoesBackToOutbox(t *testing.T) {
	t.Parallel()
	n, handled := ackNode(t, func(cfg *gateway.Config) { cfg.Edge.AckWait = dispatch.DefaultTimeout - time.Second }) // as long as it may be

	c, _ := n.connect(t, "tel-acks")
	if err := c.Text("m1", "first"); err != nil {
		t.Fatal(err)
	}
	if got := ackRead(t, c, "r-m1"); got != "first" {
		t.Fatalf("r-m1 = %q", got)
	}
	if err := c.Ack("r-m1"); err != nil {
		t.Fatal(err)
	}
	if err := c.Text("m2", "second"); err != nil {
		t.Fatal(err)
	}
	if got := ackRead(t, c, "r-m2"); got != "second" {
		t.Fatalf("r-m2 = %q", got)
	}
	c.CloseNow() // before its ack: the app never displayed it

	waitOutboxItems(t, n, "tel-acks", 1)
	c2, _ := n.connect(t, "tel-acks")
	if got := ackRead(t, c2, "r-m2"); got != "second" {
		t.Fatalf("r-m2 from the outbox = %q", got)
	}

	// A phone that never acks: written is delivered, nothing is kept.
	q, _ := n.connect(t, "tel-noacks")
	if err := q.Text("m1", "once"); err != nil {
		t.Fatal(err)
	}
	ackRead(t, q, "r-m1")
	handled("tel-noacks/m1")
	q.CloseNow()
	waitOffline(t, n, "tel-noacks")
	wantOutboxItems(t, n, "tel-noacks", 0)
}

// TestAckKnownFromTheFirstFrame: a phone that acked on an earlier socket
// is known to ack on its next one from the first frame, on the memory and
// the Redis store. Its outbox, flushed right after ready to a phone that
// drops it unread (the socket closes without an ack), is not delivered: it
// stays in the outbox and comes again on the next socket, before the
// answers to what the phone sends there.
func TestAckKnownFromTheFirstFrame(t *testing.T) {
	t.Parallel()
	for _, st := range []struct {
		name   string
		mutate func(*gateway.Config)
	}{
		{"memory", func(*gateway.Config) {}},
		{"redis", func(cfg *gateway.Config) { cfg.RedisURL, cfg.RedisPrefix = testsvc.RedisURL(t), randomPrefix() }},
	} {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			n, _ := ackNode(t, func(cfg *gateway.Config) {
				cfg.Edge.AckWait = dispatch.DefaultTimeout - time.Second // as long as it may be
				st.mutate(cfg)
			})
			const dev = "tel-first"
			// Socket 1: the phone acks r-m1 (the gateway learns it acks),
			// then leaves before acking r-m2, which goes to the outbox.
			c1, _ := n.connect(t, dev)
			if err := c1.Text("m1", "first"); err != nil {
				t.Fatal(err)
			}
			ackRead(t, c1, "r-m1")
			if err := c1.Ack("r-m1"); err != nil {
				t.Fatal(err)
			}
			if err := c1.Text("m2", "second"); err != nil {
				t.Fatal(err)
			}
			ackRead(t, c1, "r-m2")
			c1.CloseNow()
			waitOutboxItems(t, n, dev, 1)

			// Socket 2: the outbox's r-m2 is written right after ready; the
			// phone drops it unread.
			c2, _ := n.connect(t, dev)
			if got := ackRead(t, c2, "r-m2"); got != "second" {
				t.Fatalf("r-m2 from the outbox = %q", got)
			}
			c2.CloseNow()
			waitOffline(t, n, dev)

			// Socket 3: r-m2 again, from the outbox, before the answer to m3.
			c3, _ := n.connect(t, dev)
			if err := c3.Text("m3", "third"); err != nil {
				t.Fatal(err)
			}
			if f := nextMessage(t, c3); f.Str("id") != "r-m2" || f.Str("text") != "second" {
				t.Fatalf("socket 3's first message is %s, want r-m2 again: dropped unread on socket 2, it was not delivered", f)
			}
			if err := c3.Ack("r-m2"); err != nil {
				t.Fatal(err)
			}
			ackRead(t, c3, "r-m3")
			if err := c3.Ack("r-m3"); err != nil {
				t.Fatal(err)
			}
			waitOutboxEmpty(t, n, dev)
		})
	}
}

// nextMessage returns the next message frame from c, skipping the avatar
// and typing frames before it.
func nextMessage(t *testing.T, c *client.Conn) client.Frame {
	t.Helper()
	f, err := c.Next(testCtx(t))
	for err == nil && (f.T() == protocol.TypeAvatar || f.T() == protocol.TypeTyping) {
		f, err = c.Next(testCtx(t))
	}
	if err != nil {
		t.Fatal(err)
	}
	if f.T() != protocol.TypeMessage {
		t.Fatalf("got %s, want a message", f)
	}
	return f
}

// TestAckReleasesTheAnswer: the acked answer is delivered once: after the
// ack, a reconnect gets nothing from the outbox.
func TestAckReleasesTheAnswer(t *testing.T) {
	t.Parallel()
	n, handled := ackNode(t, func(cfg *gateway.Config) { cfg.Edge.AckWait = dispatch.DefaultTimeout - time.Second }) // as long as it may be
	c, _ := n.connect(t, "tel-acked")
	if err := c.Ack("nothing-yet"); err != nil { // says: this phone acks
		t.Fatal(err)
	}
	if err := c.Text("m1", "hello"); err != nil {
		t.Fatal(err)
	}
	ackRead(t, c, "r-m1")
	if err := c.Ack("r-m1"); err != nil {
		t.Fatal(err)
	}
	handled("tel-acked/m1") // the agent's send returned: acked
	c.CloseNow()
	waitOffline(t, n, "tel-acked")
	wantOutboxItems(t, n, "tel-acked", 0)
}

// TestAckWaitPasses: an acking phone that does not ack within AckWait (its
// socket still open) has the answer kept for it: it comes again, from the
// outbox, on the same socket.
func TestAckWaitPasses(t *testing.T) {
	t.Parallel()
	n, _ := ackNode(t, func(cfg *gateway.Config) { cfg.Edge.AckWait = 200 * time.Millisecond })
	c, _ := n.connect(t, "tel-slow")
	if err := c.Ack("nothing-yet"); err != nil {
		t.Fatal(err)
	}
	if err := c.Text("m1", "again"); err != nil {
		t.Fatal(err)
	}
	ackRead(t, c, "r-m1")
	// Not acked: the router keeps it and the edge writes it again.
	if got := ackRead(t, c, "r-m1"); got != "again" {
		t.Fatalf("r-m1 again = %q", got)
	}
	if err := c.Ack("r-m1"); err != nil {
		t.Fatal(err)
	}
	waitOutboxEmpty(t, n, "tel-slow")
}

// TestDeliverFrameDelivered: the sender of a deliver frame hears
// delivered{id, device} once the phone has it.
func TestDeliverFrameDelivered(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	phone, _ := n.connect(t, "tel-target")
	cron := n.dial(t)
	if _, err := cron.Hello(testCtx(t), testToken, protocol.Device{ID: "cron-1"}, protocol.User{ID: "cron"}); err != nil {
		t.Fatal(err)
	}
	if err := cron.Deliver("job-1", "mobile:tel-target", "from cron", nil); err != nil {
		t.Fatal(err)
	}
	if got := ackRead(t, phone, "job-1"); got != "from cron" {
		t.Fatalf("delivered text %q", got)
	}
	f, err := cron.Next(testCtx(t))
	for err == nil && (f.T() == protocol.TypeAvatar || f.T() == protocol.TypeTyping) {
		f, err = cron.Next(testCtx(t))
	}
	if err != nil || f.T() != protocol.TypeDelivered || f.Str("id") != "job-1" || f.Str("device") != "tel-target" {
		t.Fatalf("the deliver's sender got %v (%v), want delivered{job-1, tel-target}", f, err)
	}
}

// TestDeliverFrameWaitAck: a deliver frame with "wait":"ack" is answered
// delivered only once the phone acked it, as POST /v1/deliver answers 200
// only then; written and not acked within AckWait (a phone that never acks)
// is device_offline naming the id, as the API's 202 says the phone may not
// have it. A wait other than "ack" is a bad_frame.
func TestDeliverFrameWaitAck(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(cfg *gateway.Config) { cfg.Edge.AckWait = 500 * time.Millisecond })
	phone, _ := n.connect(t, "tel-wait")
	cron := n.dial(t)
	if _, err := cron.Hello(testCtx(t), testToken, protocol.Device{ID: "cron-1"}, protocol.User{ID: "cron"}); err != nil {
		t.Fatal(err)
	}
	deliver := func(id, wait string) {
		t.Helper()
		if err := cron.Send(map[string]any{"t": "deliver", "id": id, "target": "mobile:tel-wait", "text": "text " + id, "wait": wait}); err != nil {
			t.Fatal(err)
		}
	}
	next := func() client.Frame {
		t.Helper()
		f, err := cron.Next(testCtx(t))
		for err == nil && (f.T() == protocol.TypeAvatar || f.T() == protocol.TypeTyping) {
			f, err = cron.Next(testCtx(t))
		}
		if err != nil {
			t.Fatal(err)
		}
		return f
	}

	deliver("unacked", "ack")
	ackRead(t, phone, "unacked") // and not acked
	if f := next(); f.T() != protocol.TypeError || f.Str("code") != string(protocol.CodeDeviceOffline) || !strings.Contains(f.Str("message"), "unacked") {
		t.Fatalf("the sender got %s, want a device_offline naming unacked: written, not acknowledged", f)
	}

	deliver("acked", "ack")
	ackRead(t, phone, "acked")
	if err := phone.Ack("acked"); err != nil {
		t.Fatal(err)
	}
	if f := next(); f.T() != protocol.TypeDelivered || f.Str("id") != "acked" || f.Str("device") != "tel-wait" {
		t.Fatalf("the sender got %s, want delivered{acked, tel-wait}", f)
	}

	deliver("bad", "read")
	if f := next(); f.T() != protocol.TypeError || f.Str("code") != string(protocol.CodeBadFrame) {
		t.Fatalf(`the sender of "wait":"read" got %s, want bad_frame`, f)
	}
}

// TestDeliverFramesPipelineAcrossTargets: deliver frames written one after
// the other without waiting are answered per target. A phone that holds
// its ack keeps its own deliver waiting, not the sender's next deliver to
// another phone; frames to one phone arrive, and are answered, in the
// order they were sent.
func TestDeliverFramesPipelineAcrossTargets(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(cfg *gateway.Config) { cfg.Edge.AckWait = dispatch.DefaultTimeout - time.Second })
	slow, _ := n.connect(t, "tel-slow")
	if err := slow.Ack("nothing-yet"); err != nil { // says: this phone acks
		t.Fatal(err)
	}
	quick, _ := n.connect(t, "tel-quick")
	cron := n.dial(t)
	if _, err := cron.Hello(testCtx(t), testToken, protocol.Device{ID: "cron-1"}, protocol.User{ID: "cron"}); err != nil {
		t.Fatal(err)
	}
	if err := cron.Deliver("held", "mobile:tel-slow", "ack me later", nil); err != nil {
		t.Fatal(err)
	}
	if got := ackRead(t, slow, "held"); got != "ack me later" {
		t.Fatalf("held = %q", got)
	}
	// tel-slow has it and does not ack: its deliver waits. The next ones,
	// to tel-quick, are answered meanwhile, in order.
	for _, id := range []string{"q1", "q2", "q3"} {
		if err := cron.Deliver(id, "mobile:tel-quick", "text "+id, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"q1", "q2", "q3"} {
		if got := ackRead(t, quick, id); got != "text "+id {
			t.Fatalf("%s = %q", id, got)
		}
	}
	next := func() client.Frame {
		t.Helper()
		f, err := cron.Next(testCtx(t))
		for err == nil && (f.T() == protocol.TypeAvatar || f.T() == protocol.TypeTyping) {
			f, err = cron.Next(testCtx(t))
		}
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	for _, id := range []string{"q1", "q2", "q3"} {
		if f := next(); f.T() != protocol.TypeDelivered || f.Str("id") != id {
			t.Fatalf("the sender got %s, want delivered{%s} while tel-slow holds its ack", f, id)
		}
	}
	if err := slow.Ack("held"); err != nil {
		t.Fatal(err)
	}
	if f := next(); f.T() != protocol.TypeDelivered || f.Str("id") != "held" || f.Str("device") != "tel-slow" {
		t.Fatalf("the sender got %s, want delivered{held, tel-slow} after the ack", f)
	}
}

// TestAckRereadKeepsTheUnackedFlush: a phone known to ack gets the outbox
// flushed right after ready and does not ack it (its network died); then
// the router files another item and the edge reads the outbox again. The
// second read's item, written (not one that waits for an ack), must not
// remove the flush's unacknowledged item with it: on the phone's next
// socket the flushed message comes again. (Found by the fault test's
// silent-network fault: removing up to the reread's item took the flush's
// answers with it.)
func TestAckRereadKeepsTheUnackedFlush(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t, telemetry.Config{ServiceName: "hermes-edge"})
	n := startNode(t, func(cfg *gateway.Config) {
		cfg.Telemetry = tel
		cfg.Agent = agent.Func(func(ctx context.Context, ev wire.Event, out agent.Output) error {
			return out.Message(ctx, "r-"+ev.ID, ev.Text, false, true)
		})
		cfg.Edge.AckWait = 2 * time.Second
	})
	srv := httptest.NewServer(tel.Handler())
	t.Cleanup(srv.Close)
	unacked := func() float64 {
		sum := 0.0
		for k, v := range testsvc.Scrape(t, srv.URL+"/metrics") {
			if strings.HasPrefix(k, "hermes_deliveries_unacked") {
				sum += v
			}
		}
		return sum
	}
	const dev = "tel-reread"

	// Socket 1: the phone acks r-m1 (the store learns it acks), then
	// leaves with r-m2 unacked: r-m2 waits in the outbox.
	c1, _ := n.connect(t, dev)
	if err := c1.Text("m1", "first"); err != nil {
		t.Fatal(err)
	}
	ackRead(t, c1, "r-m1")
	if err := c1.Ack("r-m1"); err != nil {
		t.Fatal(err)
	}
	if err := c1.Text("m2", "second"); err != nil {
		t.Fatal(err)
	}
	ackRead(t, c1, "r-m2")
	c1.CloseNow()
	waitOutboxItems(t, n, dev, 1)
	base := unacked()

	// Socket 2: the flush writes r-m2, which the phone never acks. An item
	// that needs no ack (a message's first part) is filed, and the edge
	// told to read the outbox again, as the router does.
	c2, _ := n.connect(t, dev)
	if got := ackRead(t, c2, "r-m2"); got != "second" {
		t.Fatalf("r-m2 from the outbox = %q", got)
	}
	item, err := wire.Marshal(wire.Output{Op: wire.OpMessage, Device: dev, ID: "r-x", Text: "part"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Store.PushOutbox(testCtx(t), dev, item, store.OutboxLimits{MaxItems: 256, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	nudge, _ := wire.Marshal(wire.Control{Op: wire.OpOutbox, Device: dev})
	if err := n.Bus.Publish(testCtx(t), bus.EdgeOutputSubject(n.Edge.ID()), nudge, nil); err != nil {
		t.Fatal(err)
	}
	if f := nextMessage(t, c2); f.Str("id") != "r-x" {
		t.Fatalf("after the reread: %s, want r-x", f)
	}
	// r-m2's ack wait ends unacked; the reread's item was written long
	// before, so its acknowledgement has run by now.
	testsvc.WaitFor(t, 10*time.Second, "r-m2's ack wait to end unacked on socket 2", func() bool { return unacked() > base })
	c2.CloseNow()
	waitOffline(t, n, dev)

	// Socket 3: r-m2 again, first.
	c3, _ := n.connect(t, dev)
	if err := c3.Text("m3", "third"); err != nil {
		t.Fatal(err)
	}
	if f := nextMessage(t, c3); f.Str("id") != "r-m2" || f.Str("text") != "second" {
		t.Fatalf("socket 3's first message is %s, want r-m2 again: it was never acked on socket 2", f)
	}
}
