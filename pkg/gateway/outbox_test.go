package gateway_test

// The outbox across broken connections: what the agent sent while a phone
// was offline leaves the outbox only once it was written to a socket of
// the phone's, so a socket that breaks mid-flush, or one that is replaced
// while it flushes, leaves it to the next connection.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// A large outbox: far more than the socket buffers of a loopback
// connection hold (a few MiB), and than the 1 MiB outbound queue of the
// test nodes, so a flush cannot complete before the phone reads.
const (
	bigOutboxItems    = 100
	bigOutboxItemSize = 200 << 10
)

// startOutboxNode starts a node whose agent, on the text "fill", waits for
// the device to go offline and then sends bigOutboxItems messages, which go
// to the device's outbox. fill returns once they are all there.
func startOutboxNode(t *testing.T, opts ...func(*gateway.Config)) (n *node, fill func(device string)) {
	offline := make(chan struct{})
	filled := make(chan error, 1)
	n = startNode(t, func(cfg *gateway.Config) {
		cfg.Edge.MaxOutboundBytes = 1 << 20
		cfg.Agent = agent.Func(func(ctx context.Context, ev wire.Event, out agent.Output) error {
			if ev.Text != "fill" {
				return nil
			}
			<-offline
			for i := range bigOutboxItems {
				if err := out.Message(ctx, bigItemID(i), bigItemText(i), false, true); err != nil {
					filled <- err
					return err
				}
			}
			filled <- nil
			return nil
		})
		for _, o := range opts {
			o(cfg)
		}
	})
	fill = func(device string) {
		t.Helper()
		c, _ := n.connect(t, device)
		if err := c.Text("fill-1", "fill"); err != nil {
			t.Fatal(err)
		}
		n.agent.waitFor(t, func(ev wire.Event) bool { return ev.ID == "fill-1" })
		c.CloseNow()
		waitOffline(t, n, device)
		close(offline)
		if err := <-filled; err != nil {
			t.Fatalf("the agent's messages to the offline device: %v", err)
		}
		wantOutboxItems(t, n, device, bigOutboxItems)
	}
	return n, fill
}

func bigItemID(i int) string { return fmt.Sprintf("big-%03d", i) }

func bigItemText(i int) string {
	return fmt.Sprintf("%03d:", i) + strings.Repeat(string(rune('a'+i%26)), bigOutboxItemSize)
}

// waitOffline waits until the device has no owner: its socket is gone.
func waitOffline(t *testing.T, n *node, device string) {
	t.Helper()
	var err error
	if !testsvc.Eventually(10*time.Second, func() bool {
		_, err = n.Store.DeviceOwner(testCtx(t), device)
		return errors.Is(err, store.ErrNotFound)
	}) {
		t.Fatalf("%s still has an owner 10 s after its socket closed (%v)", device, err)
	}
}

// wantOutboxItems checks that the device's outbox holds exactly the first
// want big items, in order.
func wantOutboxItems(t *testing.T, n *node, device string, want int) {
	t.Helper()
	items, err := n.Store.PeekOutbox(testCtx(t), device, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != want {
		t.Fatalf("the outbox holds %d items, want %d", len(items), want)
	}
	for i, it := range items {
		if !strings.Contains(string(it.Data), `"id":"`+bigItemID(i)+`"`) {
			t.Fatalf("outbox item %d is not %s: %.80s", i, bigItemID(i), it.Data)
		}
	}
}

// waitOutboxEmpty waits for the acknowledgement of a completed flush.
func waitOutboxEmpty(t *testing.T, n *node, device string) {
	t.Helper()
	var items []store.OutboxItem
	var err error
	if !testsvc.Eventually(10*time.Second, func() bool {
		items, err = n.Store.PeekOutbox(testCtx(t), device, 0)
		return err == nil && len(items) == 0
	}) {
		t.Fatalf("the outbox still holds %d items (%v) 10 s after the phone read them all", len(items), err)
	}
}

// receiveAll reads every big item, in order, from c.
func receiveAll(t *testing.T, c *client.Conn) { t.Helper(); receiveFrom(t, c, 0) }

// receiveFrom reads the big items from index first on, in order, from c.
func receiveFrom(t *testing.T, c *client.Conn, first int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := first; i < bigOutboxItems; i++ {
		text, _, err := c.CollectMessage(ctx, bigItemID(i))
		if err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
		if text != bigItemText(i) {
			t.Fatalf("item %d arrived with %d bytes, want %d", i, len(text), len(bigItemText(i)))
		}
	}
}

// helloSlow says hello on a socket whose client keeps only a few frames
// for its consumer, so it stops reading soon after ready.
func helloSlow(t *testing.T, n *node, device string) *client.Conn {
	t.Helper()
	c := n.dial(t, client.Options{Buffer: 4})
	if _, err := c.Hello(testCtx(t), testToken, protocol.Device{ID: device}, protocol.User{ID: "u-1"}); err != nil {
		t.Fatalf("hello: %v", err)
	}
	return c
}

// TestOutboxSurvivesBrokenFlush: the phone's socket breaks right after
// ready, while its large outbox is being written. Only items written to
// the socket before it broke may leave the outbox (this phone never acked,
// so written is delivered; how many fit in the loopback socket buffers
// before the close lands varies); every other item stays, in order, and
// the next connection gets them all, and then the outbox is empty. The
// outbox is 20 MiB, far more than the socket buffers, so the flush was
// broken mid-way; it is 20 times the node's outbound queue, so this also
// shows that a flush waits for the phone instead of closing it as a slow
// reader.
func TestOutboxSurvivesBrokenFlush(t *testing.T) {
	n, fill := startOutboxNode(t)
	fill("tel-big")

	broken := helloSlow(t, n, "tel-big")
	broken.CloseNow()
	waitOffline(t, n, "tel-big")
	first := wantOutboxTail(t, n, "tel-big")
	t.Logf("%d items were written before the socket broke", first)

	c, _ := n.connect(t, "tel-big")
	receiveFrom(t, c, first)
	waitOutboxEmpty(t, n, "tel-big")
}

// wantOutboxTail checks that the device's outbox holds the big items from
// some index on, in order, and at least one of them; it returns the index.
func wantOutboxTail(t *testing.T, n *node, device string) int {
	t.Helper()
	items, err := n.Store.PeekOutbox(testCtx(t), device, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(items) == 0 {
		t.Fatalf("the outbox is empty: all %d items (%d MiB) counted as written to a socket that broke", bigOutboxItems, bigOutboxItems*bigOutboxItemSize>>20)
	}
	first := bigOutboxItems - len(items)
	for i, it := range items {
		if !strings.Contains(string(it.Data), `"id":"`+bigItemID(first+i)+`"`) {
			t.Fatalf("outbox item %d is not %s: %.80s", i, bigItemID(first+i), it.Data)
		}
	}
	return first
}

// TestOutboxTakeoverMidFlush: a second socket of the device takes over
// while the first one's flush is stuck on a phone that stopped reading.
// The new socket's flush is not held up by the old one and gets every
// item; the old one, replaced, removes nothing it did not write. The write
// timeout is an hour, so the old socket is still stuck (not cut) when the
// new one has everything: the order, not a duration, shows that the new
// flush did not wait for the old one.
func TestOutboxTakeoverMidFlush(t *testing.T) {
	n, fill := startOutboxNode(t, func(cfg *gateway.Config) { cfg.Edge.WriteTimeout = time.Hour })
	fill("tel-big")

	stuck := helloSlow(t, n, "tel-big")
	defer stuck.CloseNow()
	c, _ := n.connect(t, "tel-big")
	receiveAll(t, c)
	waitOutboxEmpty(t, n, "tel-big")
}
