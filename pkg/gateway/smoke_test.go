package gateway_test

import (
	"strings"
	"testing"

	"github.com/hermes-mobile/gateway/pkg/wire"
)

// TestEchoRoundTrip is the shortest path through every part: hello, a text
// to the agent, and its streamed reply.
func TestEchoRoundTrip(t *testing.T) {
	n := startNode(t, nil)
	c, ready := n.connect(t, "tel-1")
	if got := ready.Str("session"); got != "mobile:tel-1" {
		t.Fatalf("session = %q", got)
	}
	if err := c.Text("m-1", "hello gateway"); err != nil {
		t.Fatal(err)
	}
	msg, err := c.Expect(testCtx(t), "message")
	if err != nil {
		t.Fatal(err)
	}
	text, _, err := c.CollectMessage(testCtx(t), msg.Str("id"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, "hello gateway") {
		t.Fatalf("reply %q does not contain the text", text)
	}
	ev := n.agent.waitFor(t, func(ev wire.Event) bool { return ev.Kind == wire.EventText })
	if ev.ID != "m-1" || ev.Device != "tel-1" || ev.Text != "hello gateway" {
		t.Fatalf("agent got %+v", ev)
	}
}
