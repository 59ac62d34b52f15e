package gateway_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// TestMintedDevicesKeepCronsQueuedMessage: the review's flood, on a node:
// cron queues a message with a ttl for a sleeping phone (delivered,
// queued), then the app token says hello as 40 made-up devices, each
// sending 10 texts and leaving before the agent answers, so that the
// answers are kept in their outboxes past the store-wide bound. The
// store-wide bound used to drop the items nearest their deadline, of any
// device: cron's message (its ttl is shorter than the agent's day) went
// first, and the phone woke to nothing. The bound now drops the largest
// holder's oldest: the app token's, then its fullest made-up device.
func TestMintedDevicesKeepCronsQueuedMessage(t *testing.T) {
	const bound = 16 << 10 // the flood's 400 answers take about 50 KiB
	handled := &countingAgent{next: agent.Demo{}, gate: make(chan struct{})}
	n := startNode(t, func(cfg *gateway.Config) {
		cfg.Outbox.StoreBytes = bound
		cfg.Agent = handled
	})

	cron, _ := n.connect(t, "cron")
	if err := cron.Send(map[string]any{"t": "deliver", "id": "job-1", "target": "mobile:tel-sleeping", "text": "your 7 o'clock reminder", "ttl": 3600}); err != nil {
		t.Fatal(err)
	}
	f, err := cron.Expect(testCtx(t), protocol.TypeDelivered)
	if err != nil || !f.Bool("queued") {
		t.Fatalf("cron's deliver to the sleeping phone: %v, %v; want delivered, queued", f, err)
	}

	kept := func() int {
		total := 0
		for d := range 40 {
			items, err := n.Store.PeekOutbox(testCtx(t), fmt.Sprintf("minted-%d", d), 0)
			if err != nil {
				t.Fatal(err)
			}
			total += len(items)
		}
		return total
	}
	for d := range 40 {
		c, _ := n.connect(t, fmt.Sprintf("minted-%d", d))
		for i := range 10 {
			if err := c.Text(fmt.Sprintf("m%d-%d", d, i), strings.Repeat("flood ", 8)); err != nil {
				t.Fatal(err)
			}
		}
		// A text is handed to the router before the next frame is read:
		// the pong says all ten were.
		if err := c.Ping("flooded"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Expect(testCtx(t), protocol.TypePong); err != nil {
			t.Fatal(err)
		}
		c.CloseNow()
	}
	close(handled.gate) // the agent answers devices that are gone
	// The agent's answers are kept (the devices left) before its Handle
	// returns: once it returned for every text, the flood is all in.
	testsvc.WaitFor(t, 20*time.Second, "the agent to answer the flood's 400 texts", func() bool { return handled.done.Load() >= 400 })
	k := kept()
	t.Logf("the made-up devices keep %d of their 400 answers under a bound of %d bytes", k, bound)
	if k >= 400 {
		t.Fatalf("the made-up devices keep all %d answers: the flood did not pass the bound of %d bytes", k, bound)
	}

	phone, _ := n.connect(t, "tel-sleeping")
	msg, err := phone.Expect(testCtx(t), protocol.TypeMessage)
	if err != nil {
		t.Fatalf("the sleeping phone woke to nothing: cron's queued message was dropped by the made-up devices' flood (%v)", err)
	}
	if got := msg.Str("text"); got != "your 7 o'clock reminder" {
		t.Fatalf("the sleeping phone got %q", got)
	}
}

// countingAgent holds every event until gate closes, then hands it on,
// and counts the events whose Handle returned.
type countingAgent struct {
	next agent.Agent
	gate chan struct{}
	done atomic.Int64
}

func (a *countingAgent) Handle(ctx context.Context, ev wire.Event, out agent.Output) error {
	defer a.done.Add(1)
	select {
	case <-a.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return a.next.Handle(ctx, ev, out)
}
