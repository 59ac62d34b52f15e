//go:build unix

package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/bus/natsbus"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// TestEdgeKilled (g): edge A dies by SIGKILL. Its phones lose their sockets
// (no close frame: nobody is left to send one). While they are away the
// agent, through the router's agent API, says several things to them, a
// streamed message among them; the router keeps them in the outbox. The
// phones reconnect to edge B and get all of it right after ready, in order,
// each frame once, before anything new. A card that expires while its phone
// is away comes back as prompt_done{expired} and the demo's "expired"
// message. A phone on B notices nothing.
func TestEdgeKilled(t *testing.T) {
	t.Parallel()
	const ttl = time.Second
	c := newCluster(t, options{promptTTL: "1"})
	devs := []string{newDevice("tel-1"), newDevice("tel-2")}
	onA := make(map[string]*client.Conn)
	for _, dev := range devs {
		onA[dev] = c.connect(t, "A", dev)
	}
	carded := newDevice("tel-card")
	onA[carded] = c.connect(t, "A", carded)
	bystander := newDevice("tel-b")
	pb := c.connect(t, "B", bystander)

	// A card the phone will not answer: it expires while the phone is away.
	if err := onA[carded].Text("c-1", "/approve make backup"); err != nil {
		t.Fatal(err)
	}
	fs := readUntil(t, onA[carded], "the card", func(f client.Frame) bool { return f.T() == protocol.TypePrompt })
	card, cardAt := fs[len(fs)-1], time.Now()
	if card.Int("timeout_seconds") != 1 {
		t.Fatalf("card %s, want timeout_seconds 1 (MOBILE_PROMPT_TTL=1)", card)
	}

	// The agent API reaches a phone that is online, at once.
	c.say(t, devs[0], agentMessage{ID: "live-1", Text: "before the crash", Final: true})
	readUntil(t, onA[devs[0]], "the live agent message", finalText("before the crash"))

	ownerA, err := c.probe.Owners.DeviceOwner(testCtx(t), devs[0])
	if err != nil {
		t.Fatal(err)
	}
	c.edge("A").Kill(t)
	for dev, conn := range onA {
		select {
		case <-conn.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the socket on the killed edge is still open after 5 s", dev)
		}
		for _, f := range drain(conn) {
			if f.Close() != nil || f.T() == protocol.TypeMessage {
				t.Errorf("%s: after the kill: %s; want the socket just gone", dev, f)
			}
		}
	}
	// Until NATS notices the dead edge, a delivery to its devices would wait
	// for an answer that never comes (15 s) before going to the outbox.
	waitNoResponders(t, c.nats, bus.EdgeOutputSubject(ownerA.Edge))

	type sent struct {
		id, text    string
		edit, final bool
	}
	want := make(map[string][]sent)
	for _, dev := range devs {
		steps := []agentMessage{
			{ID: "o-1", Text: "first while away", Final: true},
			{ID: "s-1", Text: "a streamed", Final: false},
			{ID: "s-1", Text: "a streamed answer, complete", Edit: true, Final: true},
			{ID: "o-2", Text: "second while away", Final: true},
			{Text: "with an id of the router's", Final: true},
		}
		for _, m := range steps {
			id := c.say(t, dev, m)
			if id == "" {
				t.Fatalf("the router answered no id for %+v", m)
			}
			want[dev] = append(want[dev], sent{id, m.Text, m.Edit, m.Final})
		}
	}

	// The phone on B is not disturbed.
	c.say(t, bystander, agentMessage{Text: "for the phone on B", Final: true})
	readUntil(t, pb, "the bystander's message", finalText("for the phone on B"))

	for _, dev := range devs {
		conn := c.connect(t, "B", dev)
		c.mustDeliver(t, dev, "marker", "marker")
		fs := readUntil(t, conn, "the marker after the outbox", finalText("marker"))
		var got []sent
		for _, f := range ofType(fs, protocol.TypeMessage) {
			got = append(got, sent{f.Str("id"), f.Str("text"), f.Bool("edit"), f.Bool("final")})
		}
		exp := append(want[dev], sent{"marker", "marker", false, true})
		if len(got) != len(exp) {
			t.Errorf("%s on B: %d message frames, want %d:\n got  %+v\n want %+v", dev, len(got), len(exp), got, exp)
			continue
		}
		for i := range exp {
			if got[i] != exp[i] {
				t.Errorf("%s on B: message frame %d is %+v, want %+v (all: %+v)", dev, i, got[i], exp[i], got)
			}
		}
		if es := errorsIn(fs); len(es) > 0 {
			t.Errorf("%s on B: errors %v", dev, es)
		}
	}

	// The card expired while its phone was away (the sweeper runs every
	// 250 ms): the outcome waits for the phone.
	testsvc.WaitFor(t, 15*time.Second, "the card's expiry", func() bool { return time.Since(cardAt) > ttl+time.Second })
	conn := c.connect(t, "B", carded)
	c.mustDeliver(t, carded, "marker", "marker")
	fs = readUntil(t, conn, "the marker after the outbox", finalText("marker"))
	var got []string
	for _, f := range fs {
		switch f.T() {
		case protocol.TypePromptDone:
			got = append(got, fmt.Sprintf("prompt_done %s %s expired=%v", f.Str("id"), f.Str("option_id"), f.Bool("expired")))
		case protocol.TypeMessage:
			got = append(got, "message "+f.Str("text"))
		}
	}
	wantCard := []string{
		fmt.Sprintf("prompt_done %s deny expired=true", card.Str("id")),
		"message exec_approval expired: deny",
		"message marker",
	}
	if !slices.Equal(got, wantCard) {
		t.Errorf("%s on B got:\n  %s\nwant:\n  %s", carded, strings.Join(got, "\n  "), strings.Join(wantCard, "\n  "))
	}
}

// drain returns what is left to read on a connection that has ended.
func drain(conn *client.Conn) []client.Frame {
	var fs []client.Frame
	for {
		f, err := conn.Next(context.Background())
		if f.IsZero() && err != nil {
			return fs
		}
		fs = append(fs, f)
	}
}

// waitNoResponders waits until nobody subscribes to the subjects: NATS
// has dropped a dead edge's subscriptions.
func waitNoResponders(t *testing.T, natsURL string, subjects ...string) {
	t.Helper()
	b, err := natsbus.Connect(natsURL, natsbus.Options{Name: "cluster-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	deadline := time.Now().Add(10 * time.Second)
	for _, subj := range subjects {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			_, err := b.Request(ctx, subj, []byte("{}"), nil)
			cancel()
			if errors.Is(err, bus.ErrNoResponders) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: NATS still has a subscriber 10 s after the edge died (last: %v)", subj, err)
			}
		}
	}
}
