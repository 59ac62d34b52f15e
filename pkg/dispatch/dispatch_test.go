package dispatch_test

import (
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/bus/natsbus"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/store/memstore"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// TestPublishComesBeforeLaterSends: a moment published without waiting
// reaches the owner's edge subject before an output sent after it, with
// epoch 0 (the edge writes it to whatever socket of the device it holds),
// while the Send carries the owner's epoch and waits for the answer.
func TestPublishComesBeforeLaterSends(t *testing.T) {
	b, st := embedded(t)
	epoch, err := st.ClaimDevice(t.Context(), "d1", "edge-1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got := collect(t, b, bus.EdgeOutputSubject("edge-1"))
	d := &dispatch.Dispatcher{Owners: st, Bus: b}
	if err := d.Publish(t.Context(), wire.Output{Op: wire.OpTyping, Device: "d1"}); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if o, err := d.Send(t.Context(), wire.Output{Op: wire.OpMessage, Device: "d1", ID: "m1", Text: "hi", Final: true}); err != nil || o != dispatch.Delivered {
		t.Fatalf("Send: %s, %v", o, err)
	}
	if got := got(); len(got) != 2 || got[0].Op != wire.OpTyping || got[1].Op != wire.OpMessage {
		t.Fatalf("the subscriber got %+v, want typing then the message", got)
	}
	if got := got(); got[0].Epoch != 0 || got[1].Epoch != epoch {
		t.Fatalf("epochs %d and %d, want 0 for the moment and %d for the message", got[0].Epoch, got[1].Epoch, epoch)
	}
}

// TestSendReachesEdgesBeforeEdgeSubjects: an edge of a release before edge
// subjects listens on its devices' subjects only. A Send to a device it
// owns gets no responders on the edge's subject and is made again on the
// device's, where that edge answers; a device with no owner record is
// offline at once, with no request made.
//
// shim(v0.2.0): tests the fallback to the device's subject.
func TestSendReachesEdgesBeforeEdgeSubjects(t *testing.T) {
	b, st := embedded(t)
	epoch, err := st.ClaimDevice(t.Context(), "d1", "edge-old", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got1, got2 := collect(t, b, bus.DeviceSubject("d1")), collect(t, b, bus.DeviceSubject("d2"))
	d := &dispatch.Dispatcher{Owners: st, Bus: b}
	if o, err := d.Send(t.Context(), wire.Output{Op: wire.OpMessage, Device: "d1", ID: "m1", Text: "hi", Final: true}); err != nil || o != dispatch.Delivered {
		t.Fatalf("Send to an edge of the release before: %s, %v", o, err)
	}
	if o, err := d.Send(t.Context(), wire.Output{Op: wire.OpMessage, Device: "d2", ID: "m2", Text: "hi", Final: true}); err != nil || o != dispatch.Offline {
		t.Fatalf("Send to a device with no owner record: %s, %v; want offline", o, err)
	}
	if got := append(got1(), got2()...); len(got) != 1 || got[0].ID != "m1" || got[0].Epoch != epoch {
		t.Fatalf("the device subjects got %+v, want m1 at epoch %d alone", got, epoch)
	}
}

// TestCachedOwnerOfAGoneEdge: an owner in the Cache whose edge is gone
// (no responders on its subject) is read again, so a device that has
// moved to another edge gets the output instead of being called offline.
func TestCachedOwnerOfAGoneEdge(t *testing.T) {
	b, st := embedded(t)
	if _, err := st.ClaimDevice(t.Context(), "d1", "edge-gone", time.Minute); err != nil {
		t.Fatal(err)
	}
	d := &dispatch.Dispatcher{Owners: st, Bus: b, Cache: &dispatch.OwnerCache{}}
	// A typing state reads the owner and leaves it in the cache.
	if err := d.Publish(t.Context(), wire.Output{Op: wire.OpTyping, Device: "d1"}); err != nil {
		t.Fatal(err)
	}
	epoch, err := st.ClaimDevice(t.Context(), "d1", "edge-new", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan wire.Output, 1)
	sub, err := b.Subscribe(bus.EdgeOutputSubject("edge-new"), func(m *bus.Msg) {
		var out wire.Output
		_ = json.Unmarshal(m.Data, &out)
		got <- out
		ok, _ := json.Marshal(wire.Reply{OK: true})
		_ = m.Respond(ok)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if o, err := d.Send(t.Context(), wire.Output{Op: wire.OpMessage, Device: "d1", ID: "m1", Text: "hi", Final: true}); err != nil || o != dispatch.Delivered {
		t.Fatalf("Send after the cached owner's edge went: %s, %v", o, err)
	}
	if out := <-got; out.Epoch != epoch || out.Cached {
		t.Fatalf("edge-new got epoch %d (cached %v), want %d read fresh", out.Epoch, out.Cached, epoch)
	}
}

// embedded returns a bus on an in-process NATS server and a memory store,
// both closed when the test ends.
func embedded(t *testing.T) (*natsbus.Bus, *memstore.Store) {
	t.Helper()
	b, err := natsbus.Embedded(natsbus.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, memstore.New(memstore.Options{})
}

// collect subscribes to subject as an edge would, answering each request
// delivered, and returns what the subject got so far, in order.
func collect(t *testing.T, b bus.Bus, subject string) func() []wire.Output {
	t.Helper()
	var mu sync.Mutex
	var got []wire.Output
	sub, err := b.Subscribe(subject, func(m *bus.Msg) {
		var out wire.Output
		if err := json.Unmarshal(m.Data, &out); err != nil {
			t.Error(err)
		}
		mu.Lock()
		got = append(got, out)
		mu.Unlock()
		if m.Respond != nil {
			ok, _ := json.Marshal(wire.Reply{OK: true})
			_ = m.Respond(ok)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	return func() []wire.Output {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}
