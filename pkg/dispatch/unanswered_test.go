package dispatch_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// TestDeviceThatKeepsMovingIsOffline: every edge the device is looked for
// at answers that it moved on, without writing (a rolling restart, its
// phone reconnecting to the edge that drains next). Send used to return
// its own "device moved" after four looks, which the API answered 500;
// it is offline now, and a delivery with a ttl is kept.
func TestDeviceThatKeepsMovingIsOffline(t *testing.T) {
	b, st := embedded(t)
	if _, err := st.ClaimDevice(t.Context(), "mover", "edge-1", time.Minute); err != nil {
		t.Fatal(err)
	}
	sub, err := b.Subscribe(bus.EdgeOutputSubject("edge-1"), func(m *bus.Msg) {
		data, _ := json.Marshal(wire.OutputReply(wire.OutcomeMoved, "moved"))
		_ = m.Respond(data)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	d := &dispatch.Dispatcher{Owners: st, Bus: b}
	if o, err := d.Send(t.Context(), wire.Output{Op: wire.OpMessage, Device: "mover", ID: "m1", Text: "hi", Final: true}); err != nil || o != dispatch.Offline {
		t.Fatalf("Send to a device that keeps moving: %s, %v; want offline", o, err)
	}
	dl, err := (&dispatch.Deliverer{Dispatcher: d, Blobs: st, BlobTTL: time.Minute, Outbox: outbox(t, st, b)}).
		Deliver(t.Context(), &protocol.Deliver{ID: "job-1", Target: "mobile:mover", Text: "hi", TTL: time.Minute})
	if n := kept(t, st, "mover"); err != nil || dl.Outcome != dispatch.Queued || n != 1 {
		t.Fatalf("a delivery with a ttl to it: %+v, %v, %d kept; want it queued", dl, err, n)
	}
}

// TestSilentEdgeLeavesTimeToKeep: the device's edge takes the request and
// never answers (it is overloaded, or died holding it). The caller's
// deadline used to end with the request's, so the answer was a bare
// "deadline exceeded" and a delivery with a ttl was not kept (the API's
// 503). The request now gives up while a quarter of the caller's time, at
// most KeepMargin, is left: the device is offline and the delivery kept.
func TestSilentEdgeLeavesTimeToKeep(t *testing.T) {
	b, st := embedded(t)
	if _, err := st.ClaimDevice(t.Context(), "d1", "edge-silent", time.Minute); err != nil {
		t.Fatal(err)
	}
	sub, err := b.Subscribe(bus.EdgeOutputSubject("edge-silent"), func(*bus.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	// The API's ratio: DefaultTimeout for the edge, KeepMargin to keep.
	ctx, cancel := context.WithTimeout(t.Context(), (dispatch.DefaultTimeout+dispatch.KeepMargin)/10)
	defer cancel()
	d := &dispatch.Deliverer{Dispatcher: &dispatch.Dispatcher{Owners: st, Bus: b}, Blobs: st, BlobTTL: time.Minute, Outbox: outbox(t, st, b)}
	dl, err := d.Deliver(ctx, &protocol.Deliver{ID: "job-1", Target: "mobile:d1", Text: "hi", TTL: time.Minute})
	if n := kept(t, st, "d1"); err != nil || dl.Outcome != dispatch.Queued || n != 1 {
		t.Fatalf("a delivery with a ttl to a silent edge: %+v, %v, %d kept; want it queued", dl, err, n)
	}
	if ctx.Err() != nil {
		t.Fatal("the delivery settled after its caller's deadline")
	}
}
