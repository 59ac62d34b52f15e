package gateway_test

// A phone that sleeps: what the agent sends while nobody holds the phone's
// socket is kept for a day (MOBILE_OUTBOX_TTL), not the 10 minutes of
// earlier versions, and delivered when the phone comes back.

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/clock"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// TestKeptForADay: two phones ask, go to sleep, and the agent answers both.
// With the default outbox TTL, one phone that comes back a day less a
// millisecond later receives its answer; the other phone's answer is gone
// once the day has passed.
func TestKeptForADay(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	asleep := make(chan struct{})
	answered := make(chan error, 2)
	n := startNode(t, func(cfg *gateway.Config) {
		cfg.Clock = clk
		cfg.RouterCfg.JournalLease, cfg.Edge.OwnerTTL = 72*time.Hour, 72*time.Hour
		cfg.Agent = agent.Func(func(ctx context.Context, ev wire.Event, out agent.Output) error {
			if ev.Text != "later" {
				return nil
			}
			<-asleep
			err := out.Message(ctx, "answer-"+ev.ID, "the answer to "+ev.ID, false, true)
			answered <- err
			return err
		})
	})
	if got := dispatch.DefaultOutboxConfig().TTL; got != 24*time.Hour {
		t.Fatalf("default outbox TTL %v, want 24h", got)
	}
	devs := []string{"tel-sleep-1", "tel-sleep-2"}
	for _, d := range devs {
		c, _ := n.connect(t, d)
		if err := c.Text("q-"+d, "later"); err != nil {
			t.Fatal(err)
		}
		n.agent.waitFor(t, func(ev wire.Event) bool { return ev.ID == "q-"+d })
		c.CloseNow()
		waitOffline(t, n, d)
	}
	close(asleep)
	for range devs {
		if err := <-answered; err != nil {
			t.Fatalf("the answer to a sleeping phone: %v", err)
		}
	}
	for _, d := range devs {
		items, err := n.Store.PeekOutbox(testCtx(t), d, 0)
		if err != nil || len(items) != 1 {
			t.Fatalf("%s's outbox: %d items (%v), want its answer", d, len(items), err)
		}
	}

	clk.Advance(24*time.Hour - time.Millisecond)
	c, _ := n.connect(t, devs[0])
	ctx, cancel := context.WithTimeout(testCtx(t), 10*time.Second)
	defer cancel()
	for {
		f, err := c.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for the kept answer a day later: %v", err)
		}
		if f.T() == "message" && f.Str("id") == "answer-q-"+devs[0] {
			if !strings.Contains(f.Str("text"), devs[0]) {
				t.Fatalf("kept answer %s, want the answer to %s", f, devs[0])
			}
			break
		}
	}
	clk.Advance(time.Millisecond)
	if items, err := n.Store.PeekOutbox(testCtx(t), devs[1], 0); err != nil || len(items) != 0 {
		t.Fatalf("%s's outbox a day after the answer: %d items (%v), want none", devs[1], len(items), err)
	}
}

// TestMediaKeptWithItsOutboxItem: a file the agent sends to a sleeping
// phone is kept by reference, and its blob lives as long as the outbox
// item (a day), not the 15 minutes of a blob: the phone that wakes an hour
// later gets the file's bytes.
func TestMediaKeptWithItsOutboxItem(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	asleep := make(chan struct{})
	answered := make(chan error, 1)
	file := bytes.Repeat([]byte("png!"), 1000)
	n := startNode(t, func(cfg *gateway.Config) {
		cfg.Clock = clk
		cfg.RouterCfg.JournalLease, cfg.Edge.OwnerTTL = 72*time.Hour, 72*time.Hour
		cfg.Agent = agent.Func(func(ctx context.Context, ev wire.Event, out agent.Output) error {
			if ev.Text != "picture" {
				return nil
			}
			<-asleep
			err := out.Media(ctx, agent.Media{ID: "pic-1", Kind: "image", Mime: "image/png", Filename: "p.png", Data: file})
			answered <- err
			return err
		})
	})
	const dev = "tel-sleep-media"
	c, _ := n.connect(t, dev)
	if err := c.Text("q-1", "picture"); err != nil {
		t.Fatal(err)
	}
	n.agent.waitFor(t, func(ev wire.Event) bool { return ev.ID == "q-1" })
	c.CloseNow()
	waitOffline(t, n, dev)
	close(asleep)
	if err := <-answered; err != nil {
		t.Fatalf("the file to a sleeping phone: %v", err)
	}
	clk.Advance(time.Hour) // the blob's own 15 minutes are long past
	c, _ = n.connect(t, dev)
	ctx, cancel := context.WithTimeout(testCtx(t), 10*time.Second)
	defer cancel()
	_, data, err := c.CollectMedia(ctx, "pic-1")
	if err != nil {
		t.Fatalf("the kept file an hour later: %v", err)
	}
	if !bytes.Equal(data, file) {
		t.Fatalf("the kept file has %d bytes, want the %d sent", len(data), len(file))
	}
}
