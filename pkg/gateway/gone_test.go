package gateway_test

import (
	"context"
	"errors"
	"testing"

	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// TestMediaGoneIsNotQueued: agent media whose bytes are gone from the store
// fails with ErrGone and is not kept in the outbox, where it would fail
// again at every reconnect; the session goes on.
func TestMediaGoneIsNotQueued(t *testing.T) {
	errs := make(chan error, 1)
	n := startNode(t, func(cfg *gateway.Config) {
		cfg.Agent = agent.Func(func(ctx context.Context, ev wire.Event, out agent.Output) error {
			errs <- out.Media(ctx, agent.Media{Kind: "image", Mime: "image/png", Filename: "x.png", Blob: "no-such-blob"})
			return out.Message(ctx, "after", "still here", false, true)
		})
	})
	c, _ := n.connect(t, "tel-gone")
	if err := c.Text("m-1", "send me the picture"); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; !errors.Is(err, dispatch.ErrGone) {
		t.Fatalf("Media with a missing blob = %v, want ErrGone", err)
	}
	msg, err := c.Expect(testCtx(t), protocol.TypeMessage)
	if err != nil || msg.Str("text") != "still here" {
		t.Fatalf("next message %v, %v", msg, err)
	}
	items, err := n.Store.PeekOutbox(testCtx(t), "tel-gone", 0)
	if err != nil || len(items) != 0 {
		t.Fatalf("outbox holds %d items (%v), want none", len(items), err)
	}
}
