package gateway_test

import (
	"testing"

	"github.com/hermes-mobile/gateway/pkg/wire"
)

// TestEventCarriesItsSocket: an event names the edge and the owner epoch of
// the socket it came through, as the owner record does at that moment, so
// the router can send the answer there without reading the record; a
// reconnect's event names the new socket's epoch.
func TestEventCarriesItsSocket(t *testing.T) {
	n := startNode(t, nil)
	ctx := testCtx(t)
	for i, id := range []string{"first", "second"} {
		c, _ := n.connect(t, "tel-epoch")
		if err := c.Text(id, "hello"); err != nil {
			t.Fatal(err)
		}
		ev := n.agent.waitFor(t, func(ev wire.Event) bool { return ev.ID == id })
		o, err := n.Store.DeviceOwner(ctx, "tel-epoch")
		if err != nil {
			t.Fatal(err)
		}
		if ev.Edge != n.Edge.ID() || ev.Epoch != o.Epoch || ev.Epoch == 0 {
			t.Fatalf("socket %d: the event names edge %q epoch %d; the owner record %q epoch %d (want the same, not 0)",
				i, ev.Edge, ev.Epoch, o.Edge, o.Epoch)
		}
		c.CloseNow()
	}
	evs := n.agent.Events()
	if evs[0].Epoch >= evs[len(evs)-1].Epoch {
		t.Fatalf("the reconnect's event names epoch %d, not past the first socket's %d", evs[len(evs)-1].Epoch, evs[0].Epoch)
	}
}
