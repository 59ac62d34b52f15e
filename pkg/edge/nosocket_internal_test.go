package edge

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/store/memstore"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// TestDeliveryToAClosedSocketIsAnswered: a delivery that reaches an edge
// still subscribed to a device whose socket just closed is answered, never
// left to the sender's 15 s timeout, since the edge that took the device
// over may have subscribed too late to get it: "moved" when the owner
// record names a newer socket (the sender looks again), "not connected"
// when it names this edge's old socket or nobody (the sender keeps the
// output in the outbox). Neither answer writes anything: no socket renders
// an output addressed to another socket's epoch. It holds on the edge's
// output subject and on device subjects (a rolling upgrade).
func TestDeliveryToAClosedSocketIsAnswered(t *testing.T) {
	for _, direct := range []bool{true, false} {
		name := "device subject"
		if direct {
			name = "edge subject"
		}
		t.Run(name, func(t *testing.T) { testDeliveryToAClosedSocket(t, direct) })
	}
}

func testDeliveryToAClosedSocket(t *testing.T, direct bool) {
	st := memstore.New(memstore.Options{})
	s := New(Config{ID: "edge-a"}, st, nil, nil)
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	ttl := time.Minute

	deliver := func(device string, epoch int64) wire.Reply {
		t.Helper()
		data, _ := json.Marshal(wire.Output{Op: wire.OpMessage, Device: device, ID: "m1", Text: "hi", Final: true, Epoch: epoch})
		got := make(chan []byte, 1)
		s.onDelivery(&bus.Msg{Subject: bus.DeviceSubject(device), Data: data, Respond: func(b []byte) error {
			got <- b
			return nil
		}}, direct)
		select {
		case b := <-got:
			var r wire.Reply
			if err := json.Unmarshal(b, &r); err != nil {
				t.Fatalf("reply %q: %v", b, err)
			}
			return r
		case <-time.After(10 * time.Second): // a bound on failing, not a wait for success
			t.Fatalf("delivery to %s at epoch %d: no answer; the sender would wait out its timeout", device, epoch)
			return wire.Reply{}
		}
	}

	// Released: the old socket's record is gone and nobody claimed since.
	old, err := st.ClaimDevice(ctx, "released", "edge-a", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.ReleaseDevice(ctx, "released", old); err != nil {
		t.Fatal(err)
	}
	if r := deliver("released", old); r.OK || r.Moved || r.Outcome != wire.OutcomeOffline {
		t.Errorf("record released: %+v, want not connected (outcome offline, not OK, not moved)", r)
	}

	// Still recorded at the old socket's epoch.
	old, err = st.ClaimDevice(ctx, "stale", "edge-a", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if r := deliver("stale", old); r.OK || r.Moved || r.Outcome != wire.OutcomeOffline {
		t.Errorf("record names this edge's closed socket: %+v, want not connected (outcome offline)", r)
	}

	// Taken over by another edge: a newer epoch.
	old, err = st.ClaimDevice(ctx, "moved", "edge-a", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.ClaimDevice(ctx, "moved", "edge-b", ttl); err != nil {
		t.Fatal(err)
	}
	if r := deliver("moved", old); r.OK || !r.Moved {
		t.Errorf("device taken over by edge-b: %+v, want moved", r)
	}

	if direct {
		return // the rest: a device subject, which edge-b's socket gets too
	}
	// Addressed to the socket edge-b holds now: edge-b writes it and
	// answers; a "moved" from here could come first and have it sent twice.
	if _, err := st.ClaimDevice(ctx, "current", "edge-a", ttl); err != nil {
		t.Fatal(err)
	}
	current, err := st.ClaimDevice(ctx, "current", "edge-b", ttl)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(wire.Output{Op: wire.OpMessage, Device: "current", ID: "m1", Text: "hi", Final: true, Epoch: current})
	s.answerNoSocket(&bus.Msg{Subject: bus.DeviceSubject("current"), Data: data, Respond: func(b []byte) error {
		t.Errorf("answered %s for the epoch of edge-b's socket; want no answer from here", b)
		return nil
	}}, wire.Output{Op: wire.OpMessage, Device: "current", ID: "m1", Epoch: current}, false)
}
