package dispatch_test

import (
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// kept returns how many items device's outbox holds.
func kept(t *testing.T, st store.Outbox, device string) int {
	t.Helper()
	items, err := st.PeekOutbox(t.Context(), device, 0)
	if err != nil {
		t.Fatal(err)
	}
	return len(items)
}

// outbox is an Outbox on st and b, closed when the test ends.
func outbox(t *testing.T, st store.Store, b bus.Bus) *dispatch.Outbox {
	t.Helper()
	o := dispatch.NewOutbox(dispatch.OutboxConfig{TTL: time.Hour}, st, b, nil)
	t.Cleanup(o.Close)
	return o
}

// TestDeliverTTLToOfflineDeviceIsQueued: a delivery with a ttl to a device
// no edge holds is kept in its outbox, offline, and the Delivery says
// Queued, which every surface answers as queued (POST /v1/deliver: 202
// {"queued":true}; the deliver frame: delivered with queued). The worked
// example of docs/development.md.
func TestDeliverTTLToOfflineDeviceIsQueued(t *testing.T) {
	b, st := embedded(t)
	d := &dispatch.Deliverer{Dispatcher: &dispatch.Dispatcher{Owners: st, Bus: b}, Blobs: st, BlobTTL: time.Minute, Outbox: outbox(t, st, b)}
	dl, err := d.Deliver(t.Context(), &protocol.Deliver{ID: "job-1", Target: "mobile:asleep", Text: "wake up", TTL: time.Minute})
	if err != nil || dl.Outcome != dispatch.Queued || dl.Device != "asleep" {
		t.Fatalf("Deliver = %+v, %v; want it queued for asleep", dl, err)
	}
	items, err := st.PeekOutbox(t.Context(), "asleep", 0)
	if err != nil || len(items) != 1 {
		t.Fatalf("the outbox holds %d items (%v), want 1", len(items), err)
	}
	var out wire.Output
	if err := wire.Unmarshal(items[0].Data, &out); err != nil || !out.Offline || out.ID != "job-1" || out.Text != "wake up" {
		t.Fatalf("kept %s (%v), want the text, offline", items[0].Data, err)
	}
	// Without a ttl nothing is kept: the device is offline.
	if dl, err := d.Deliver(t.Context(), &protocol.Deliver{ID: "job-2", Target: "mobile:asleep", Text: "hi"}); err != nil || dl.Outcome != dispatch.Offline {
		t.Fatalf("Deliver without a ttl = %+v, %v; want offline", dl, err)
	}
	// A ttl past the outbox's is refused before anything is sent.
	if dl, err := d.Deliver(t.Context(), &protocol.Deliver{ID: "job-3", Target: "mobile:asleep", Text: "hi", TTL: 2 * time.Hour}); err != nil || dl.Outcome != dispatch.Refused {
		t.Fatalf("a ttl past MOBILE_OUTBOX_TTL: %+v, %v; want it refused", dl, err)
	}
}
