//go:build unix

package cluster

import (
	"net/http"
	"slices"
	"testing"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// TestDeliverThroughRouter (a): the router's POST /v1/deliver reaches a
// device on either edge, only that device, as one final message; a device
// that is not online is device_offline; a wrong token delivers nothing. The
// agent in the router process answers a device on an edge.
func TestDeliverThroughRouter(t *testing.T) {
	t.Parallel()
	c := newCluster(t, options{})
	onA, onB := newDevice("tel-a"), newDevice("tel-b")
	pa := c.connect(t, "A", onA)
	pb := c.connect(t, "B", onB)

	c.mustDeliver(t, onA, "d-a", "to the phone on edge A")
	c.mustDeliver(t, onB, "d-b", "to the phone on edge B")
	for _, x := range []struct {
		conn     *client.Conn
		id, text string
	}{{pa, "d-a", "to the phone on edge A"}, {pb, "d-b", "to the phone on edge B"}} {
		fs := readUntil(t, x.conn, "delivery "+x.id, finalText(x.text))
		ms := messages(fs)
		if len(ms) != 1 || ms[0].id != x.id || ms[0].frames != 1 {
			t.Errorf("delivery %s arrived as %+v, want one message %q in one frame:%s", x.id, ms, x.id, describe(fs))
		}
		last := fs[len(fs)-1]
		if ch := last.Map("chunk"); ch.Int("index") != 0 || ch.Int("total") != 1 || last.Bool("edit") {
			t.Errorf("delivery %s: %s, want chunk {0,1} and no edit", x.id, last)
		}
	}

	// A device no edge holds: device_offline, and nothing is queued.
	offline := newDevice("tel-away")
	code, body := c.deliver(t, offline, "d-off", "nobody is there")
	if code != http.StatusNotFound || body["error"] != "device_offline" {
		t.Errorf("deliver to an offline device: %d %v, want 404 {\"error\":\"device_offline\"}", code, body)
	}

	// Without the deliver token (none, or the agent's), nothing is delivered.
	for _, token := range []string{"", "wrong-" + testsvc.RandomHex(4), c.agentToken, c.token} {
		code, body := c.post(t, "/v1/deliver", token, map[string]any{
			"target": protocol.Session(onA), "id": "forged", "text": "forged delivery",
		})
		if code < 400 || code >= 500 {
			t.Errorf("deliver with token %q: %d %v, want a 4xx refusal", token, code, body)
		}
	}
	c.mustDeliver(t, onA, "d-after", "after the refused deliveries")
	fs := readUntil(t, pa, "the delivery after the refused ones", finalText("after the refused deliveries"))
	if ms := messages(fs); len(ms) != 1 {
		t.Errorf("before the marker the phone got %q, want nothing:%s", texts(ms), describe(fs))
	}

	// The demo agent runs in the router process and answers across the bus.
	if err := pb.Text("t-1", "hello from edge B"); err != nil {
		t.Fatal(err)
	}
	fs = readUntil(t, pb, "the agent's reply", finalText("You said: hello from edge B"))
	if ms := messages(fs); len(ms) != 1 || ms[0].frames != 3 {
		t.Errorf("reply arrived as %+v, want one message streamed in 3 frames:%s", ms, describe(fs))
	}
	first := slices.IndexFunc(fs, func(f client.Frame) bool { return f.T() == protocol.TypeMessage })
	if !slices.ContainsFunc(fs[:first], func(f client.Frame) bool {
		return f.T() == protocol.TypeAvatar && f.Str("state") == protocol.AvatarThinking
	}) {
		t.Errorf("no thinking avatar before the reply:%s", describe(fs))
	}
	// The phone on A got none of it.
	c.mustDeliver(t, onA, "d-a2", "marker")
	if ms := messages(readUntil(t, pa, "marker", finalText("marker"))); len(ms) != 1 {
		t.Errorf("phone on A got %q before the marker, want only the marker", texts(ms))
	}
}
