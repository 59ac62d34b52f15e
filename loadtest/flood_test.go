package main

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// A flood's deliveries are each kept, in turn, in the outboxes of its
// made-up devices, and counted by answer.
func TestFloodQueuesForMadeUpDevices(t *testing.T) {
	g := startNode(t, nil)
	cfg := floodConfig{URL: g.APIURL(), Token: testDeliver, Devices: 3, Rate: 200, Bytes: 1000,
		Duration: 50 * time.Millisecond, TTL: 60, RunID: "t" + randomHex(2)}
	res := flood(context.Background(), cfg)
	sent := res["202_queued"]
	if sent == 0 || len(res) != 1 {
		t.Fatalf("answers %v: want only 202_queued", res)
	}
	kept := 0
	for i := range cfg.Devices {
		items, err := g.Store.PeekOutbox(context.Background(), fmt.Sprintf("flood-%s-%d", cfg.RunID, i), 0)
		if err != nil {
			t.Fatal(err)
		}
		if want := sent/cfg.Devices + btoi(i < sent%cfg.Devices); len(items) != want {
			t.Errorf("device %d holds %d items, want %d of %d sent", i, len(items), want, sent)
		}
		for _, it := range items {
			if len(it.Data) < cfg.Bytes {
				t.Errorf("an item of %d bytes: want its text of %d and more", len(it.Data), cfg.Bytes)
			}
		}
		kept += len(items)
	}
	if kept != sent {
		t.Fatalf("kept %d of %d queued", kept, sent)
	}
	// A refused key is counted by its status, not as queued.
	cfg.Token = "wrong"
	if res := flood(context.Background(), cfg); res["401"] == 0 || res["202_queued"] != 0 {
		t.Fatalf("with a wrong key: %v, want only 401", res)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
