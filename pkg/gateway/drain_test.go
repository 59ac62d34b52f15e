package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// TestDrainSpreadsCloses: Drain closes the listener at once and every
// socket with 1001, spread over the window rather than all together.
func TestDrainSpreadsCloses(t *testing.T) {
	const phones = 20
	const window = time.Second
	n := startNode(t, nil)
	conns := make([]*client.Conn, phones)
	for i := range conns {
		conns[i], _ = n.connect(t, fmt.Sprintf("tel-%d", i))
	}

	start := time.Now()
	drained := make(chan error, 1)
	go func() { drained <- n.Edge.Drain(testCtx(t), window) }()

	// The listener is closed at once: a new phone is refused.
	deadline := time.Now().Add(window / 4)
	for {
		c, err := net.DialTimeout("tcp", n.Addr().String(), time.Second)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatalf("the edge still accepts connections %v into the drain", time.Since(start))
		}
		time.Sleep(5 * time.Millisecond) // poll interval: the loop waits for its condition
	}

	closedAt := make([]time.Duration, phones)
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			ci, err := c.ExpectClose(testCtx(t))
			if err != nil {
				t.Errorf("phone %d: %v", i, err)
				return
			}
			closedAt[i] = time.Since(start)
			if ci.Code != 1001 {
				t.Errorf("phone %d: close %s, want 1001 (going away)", i, ci)
			}
		})
	}
	wg.Wait()
	select {
	case err := <-drained:
		if err != nil {
			t.Fatalf("Drain: %v", err)
		}
	case <-time.After(window + 10*time.Second):
		t.Fatal("Drain did not return 10 s after its window")
	}
	if n.Edge.Conns() != 0 {
		t.Fatalf("%d connections open after Drain", n.Edge.Conns())
	}
	first, last := closedAt[0], closedAt[0]
	for _, d := range closedAt {
		first, last = min(first, d), max(last, d)
	}
	if last-first < window/2 {
		t.Fatalf("closes from %v to %v: spread %v, want at least half the window (%v)", first, last, last-first, window/2)
	}
	if last > window+5*time.Second { // generous: a busy machine delays when a phone sees its close
		t.Fatalf("the last close came at %v, window %v", last, window)
	}
}

// TestDrainFinishesHandoff: a connection whose event is being handed to a
// router is closed only after the router answered, and the phone hears
// the answer before the close. An accepted event keeps its dedup key (a
// resend is a duplicate); a refused one is reported with internal_error.
func TestDrainFinishesHandoff(t *testing.T) {
	for _, accept := range []bool{true, false} {
		t.Run(fmt.Sprintf("accept=%v", accept), func(t *testing.T) {
			n := startNode(t, func(c *gateway.Config) { c.Router = false })
			got := make(chan *bus.Msg, 1)
			sub, err := n.Bus.QueueSubscribe(bus.InboundSubject, bus.QueueRouters, func(m *bus.Msg) { got <- m })
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Unsubscribe()
			conn, _ := n.connect(t, "tel-1")
			if err := conn.Text("m-1", "hello"); err != nil {
				t.Fatal(err)
			}
			var req *bus.Msg
			select {
			case req = <-got:
			case <-time.After(5 * time.Second):
				t.Fatal("the event did not reach the router")
			}

			drained := make(chan error, 1)
			go func() { drained <- n.Edge.Drain(testCtx(t), 10*time.Millisecond) }()
			// The router has not answered: the socket stays open.
			select {
			case err := <-drained:
				t.Fatalf("Drain returned (%v) while an event was being handed over", err)
			case <-conn.Done():
				t.Fatal("the socket closed while its event was being handed over")
			case <-time.After(300 * time.Millisecond):
			}
			reply, _ := json.Marshal(wire.Reply{OK: accept, Error: map[bool]string{false: "refused"}[accept]})
			if err := req.Respond(reply); err != nil {
				t.Fatal(err)
			}

			var before []client.Frame
			for {
				f, err := conn.Next(testCtx(t))
				if err != nil {
					t.Fatalf("waiting for the close: %v (before: %v)", err, before)
				}
				if ci := f.Close(); ci != nil {
					if ci.Code != 1001 {
						t.Fatalf("close %s, want 1001", ci)
					}
					break
				}
				before = append(before, f)
			}
			var errs []string
			for _, f := range before {
				if e := client.AsServerError(f); e != nil {
					errs = append(errs, string(e.Code))
				}
			}
			if accept && len(errs) > 0 || !accept && (len(errs) != 1 || errs[0] != string(protocol.CodeInternalError)) {
				t.Fatalf("errors before the close: %v (frames %v)", errs, before)
			}
			select {
			case err := <-drained:
				if err != nil {
					t.Fatalf("Drain: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Drain did not return after the last socket closed")
			}
			if err := n.Edge.Close(); err != nil {
				t.Fatal(err)
			}
			// Close came after the hand-over ended, so it cut nothing short:
			// an accepted event is remembered, a refused one forgotten. The
			// dedup key is <len(device)>:<device>:<id>.
			first, err := n.Store.Claim(context.Background(), "5:tel-1:m-1", "probe", protocol.DedupWindow)
			if err != nil {
				t.Fatal(err)
			}
			if first == accept {
				t.Fatalf("after an event the router %s, a resend is first=%v", map[bool]string{true: "took", false: "refused"}[accept], first)
			}
		})
	}
}

// TestOutboxReadAgain: an output filed in the outbox after the device's
// socket read it (a reconnect racing the router) reaches the phone once
// the router announces it with OpOutbox, without a reconnect.
func TestOutboxReadAgain(t *testing.T) {
	n := startNode(t, nil)
	conn, _ := n.connect(t, "tel-1")
	item, _ := json.Marshal(wire.Output{Op: wire.OpMessage, Device: "tel-1", ID: "late", Text: "filed late", Final: true, Offline: true})
	if _, err := n.Store.PushOutbox(testCtx(t), "tel-1", item, store.OutboxLimits{MaxItems: 256, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	nudge, _ := json.Marshal(wire.Control{Op: wire.OpOutbox, Device: "tel-1"})
	if err := n.Bus.Publish(testCtx(t), bus.EdgeOutputSubject(n.Edge.ID()), nudge, nil); err != nil {
		t.Fatal(err)
	}
	text, _, err := conn.CollectMessage(testCtx(t), "late")
	if err != nil || text != "filed late" {
		t.Fatalf("the phone got %q, %v; want the outbox item", text, err)
	}
	// Written, so acknowledged: the item leaves the outbox.
	var left []store.OutboxItem
	if !testsvc.Eventually(5*time.Second, func() bool {
		left, err = n.Store.PeekOutbox(testCtx(t), "tel-1", 0)
		return err == nil && len(left) == 0
	}) {
		t.Fatalf("outbox after the nudge: %d items, %v; want it empty", len(left), err)
	}
}
