//go:build unix

package cluster

import (
	"slices"
	"testing"

	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// askApproval sends "/approve <command>" and returns the card that comes.
func askApproval(t *testing.T, conn *client.Conn, dev, id, command string) client.Frame {
	t.Helper()
	if err := conn.Text(id, "/approve "+command); err != nil {
		t.Fatal(err)
	}
	fs := readUntil(t, conn, "the card", func(f client.Frame) bool { return f.T() == protocol.TypePrompt })
	card := fs[len(fs)-1]
	var options []string
	for _, o := range card.Slice("options") {
		if m, ok := o.(map[string]any); ok {
			id, _ := m["id"].(string)
			options = append(options, id)
		}
	}
	if card.Str("id") == "" || card.Str("kind") != protocol.PromptExecApproval || card.Str("command") != command ||
		card.Str("session") != protocol.Session(dev) || card.Int("timeout_seconds") != 300 ||
		!slices.Equal(options, []string{"once", "session", "always", "deny"}) {
		t.Fatalf("card %s, want an exec_approval card for %q in session %s with options once, session, always, deny and 300 s",
			card, command, protocol.Session(dev))
	}
	return card
}

// TestCardAnsweredOnOtherEdge (d): a card shown on edge A is answered after
// the device moved to edge B: B sends prompt_done with the applied option,
// then the demo's "exec_approval resolved: <option>". A second answer finds
// the card closed.
func TestCardAnsweredOnOtherEdge(t *testing.T) {
	t.Parallel()
	c := newCluster(t, options{})
	dev := newDevice("tel")
	a := c.connect(t, "A", dev)
	card := askApproval(t, a, dev, "c-1", "make deploy")

	b := c.connect(t, "B", dev)
	expectClose(t, a, takeoverWithin, 1000)
	if err := b.Answer(card.Str("id"), "session", ""); err != nil {
		t.Fatal(err)
	}
	fs := readUntil(t, b, "the agent's answer", finalText("exec_approval resolved: session"))
	done := ofType(fs, protocol.TypePromptDone)
	if len(done) != 1 || done[0].Str("id") != card.Str("id") || done[0].Str("option_id") != "session" || done[0].Bool("expired") {
		t.Errorf("prompt_done frames %v, want one for %s with option_id session, not expired:%s", done, card.Str("id"), describe(fs))
	}
	if i := slices.IndexFunc(fs, func(f client.Frame) bool { return f.T() == protocol.TypePromptDone }); i < 0 || i > slices.IndexFunc(fs, finalText("exec_approval resolved: session")) {
		t.Errorf("prompt_done must come before the agent's answer:%s", describe(fs))
	}
	if es := errorsIn(fs); len(es) > 0 {
		t.Errorf("errors: %v", es)
	}

	// Answered once: a second answer gets prompt_done{expired:true}, and the
	// agent hears nothing more.
	if err := b.Answer(card.Str("id"), "once", ""); err != nil {
		t.Fatal(err)
	}
	if err := b.Text("m-2", "marker"); err != nil {
		t.Fatal(err)
	}
	fs = readUntil(t, b, "the marker's reply", finalText("You said: marker"))
	done = ofType(fs, protocol.TypePromptDone)
	if len(done) != 1 || done[0].Str("id") != card.Str("id") || !done[0].Bool("expired") {
		t.Errorf("second answer: prompt_done frames %v, want one with expired:true", done)
	}
	if ms := messages(fs); len(ms) != 1 {
		t.Errorf("after the second answer the agent said %q, want only the marker's reply", texts(ms))
	}
}

// TestCardForeignDevice (e): another device, on the other edge, answering a
// device's card gets a non-fatal forbidden and changes nothing: the owner
// answers it afterwards (with an option outside the table, so the safe one
// is applied).
func TestCardForeignDevice(t *testing.T) {
	t.Parallel()
	c := newCluster(t, options{})
	dev, other := newDevice("tel"), newDevice("intruder")
	a := c.connect(t, "A", dev)
	o := c.connect(t, "B", other)
	card := askApproval(t, a, dev, "c-1", "rm -rf /tmp/scratch")

	if err := o.Answer(card.Str("id"), "always", ""); err != nil {
		t.Fatal(err)
	}
	fs := pingBarrier(t, o) // still open, and the error came before the pong
	es := errorsIn(fs)
	if len(es) != 1 || es[0].Code != protocol.CodeForbidden || es[0].Fatal {
		t.Fatalf("the foreign answer got %v, want one non-fatal forbidden:%s", es, describe(fs))
	}
	if done := ofType(fs, protocol.TypePromptDone); len(done) > 0 {
		t.Errorf("the foreign device got %v", done)
	}

	// The owner still holds the card; an unknown option becomes deny.
	if err := a.Answer(card.Str("id"), "yes-please", ""); err != nil {
		t.Fatal(err)
	}
	fs = readUntil(t, a, "the agent's answer", finalText("exec_approval resolved: deny"))
	done := ofType(fs, protocol.TypePromptDone)
	if len(done) != 1 || done[0].Str("option_id") != "deny" || done[0].Bool("expired") {
		t.Errorf("prompt_done frames %v, want one with option_id deny:%s", done, describe(fs))
	}
	if ms := messages(fs); len(ms) != 1 {
		t.Errorf("the agent said %q, want only the resolution (no resolution for the foreign answer)", texts(ms))
	}
}
