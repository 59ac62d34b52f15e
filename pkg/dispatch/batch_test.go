package dispatch_test

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// TestDeliverBatchAcrossReleases: DeliverBatch sends the texts of the
// devices one edge holds in one wire.Batch on the edge's subject, and
// reaches the devices of an edge of the release before batches (nobody on
// its edge subject; it answers on device subjects with the booleans of
// that release) by sending each delivery alone. A device with no owner
// is offline, as Deliver says; a delivery the new edge answers "moved"
// is sent again on its device's subject.
//
// shim(v0.2.0): tests the fallback for an edge before batches.
func TestDeliverBatchAcrossReleases(t *testing.T) {
	b, st := embedded(t)
	claim := func(dev, edge string) {
		if _, err := st.ClaimDevice(t.Context(), dev, edge, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	claim("new-1", "edge-new")
	claim("new-2", "edge-new")
	claim("moving", "edge-new")
	claim("old-1", "edge-old")

	var mu sync.Mutex
	var batches [][]string         // the devices of each batch the new edge got
	deviceMsgs := map[string]int{} // outputs on each device subject
	sub, err := b.Subscribe(bus.EdgeSubject("edge-new"), func(m *bus.Msg) {
		var in wire.Batch
		if err := json.Unmarshal(m.Data, &in); err != nil {
			t.Error(err)
		}
		var devs []string
		var r wire.BatchReply
		for _, out := range in.Outputs {
			devs = append(devs, out.Device)
			o := wire.OutcomeDelivered
			if out.Device == "moving" {
				o = wire.OutcomeMoved
			}
			r.Replies = append(r.Replies, wire.OutputReply(o, ""))
		}
		mu.Lock()
		batches = append(batches, devs)
		mu.Unlock()
		data, _ := json.Marshal(r)
		_ = m.Respond(data)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	// The old edge's answer, and the one device subject "moving" is held on.
	for _, dev := range []string{"old-1", "moving"} {
		sub, err := b.Subscribe(bus.DeviceSubject(dev), func(m *bus.Msg) {
			mu.Lock()
			deviceMsgs[dev]++
			mu.Unlock()
			ok, _ := json.Marshal(map[string]any{"ok": true, "acked": true}) // a Reply before Outcome
			_ = m.Respond(ok)
		})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
	}

	d := &dispatch.Deliverer{Dispatcher: &dispatch.Dispatcher{Owners: st, Bus: b}, Blobs: st, BlobTTL: time.Minute}
	var fs []*protocol.Deliver
	for _, dev := range []string{"new-1", "old-1", "new-2", "gone", "moving", "new-1"} {
		fs = append(fs, &protocol.Deliver{Target: dev, ID: fmt.Sprintf("m%d", len(fs)), Text: "hi"})
	}
	fs = append(fs, &protocol.Deliver{Target: "mobile:x", Text: "no id"})
	fs = append(fs, &protocol.Deliver{Target: "mobile:", Text: "no device"})

	res := d.DeliverBatch(t.Context(), fs)
	ok, off := dispatch.Delivered, dispatch.Offline
	for i, want := range []dispatch.Outcome{ok, ok, ok, off, ok, ok, off} {
		if res[i].Err != nil || res[i].Delivery.Outcome != want {
			t.Errorf("delivery %d (%s): %s, %v; want %s", i, fs[i].Target, res[i].Delivery.Outcome, res[i].Err, want)
		}
	}
	if r := res[7]; r.Err != nil || r.Delivery.Outcome != dispatch.Refused || r.Delivery.Refusal == nil || r.Delivery.Refusal.Code != protocol.CodeBadFrame {
		t.Errorf("a target naming no device: %+v, %v; want refused, bad_frame", r.Delivery, r.Err)
	}
	if res[6].Delivery.ID == "" {
		t.Errorf("a delivery without an id got none")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(batches) != 1 || fmt.Sprint(batches[0]) != "[new-1 new-1 new-2 moving]" {
		t.Errorf("the new edge got batches %v, want one with new-1 twice, new-2 and moving", batches)
	}
	if deviceMsgs["old-1"] != 1 || deviceMsgs["moving"] != 1 {
		t.Errorf("device subjects got %v, want old-1 and moving once each", deviceMsgs)
	}
}
