package router_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/bus/natsbus"
	"github.com/hermes-mobile/gateway/pkg/router"
	"github.com/hermes-mobile/gateway/pkg/store/memstore"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// TestAcceptorBeforeAck: with an agent that takes events durably (Link), an
// edge's event is in the log by the time the router acknowledges it, so a
// router dying after the acknowledgement cannot lose it. Events keep the
// order they were acknowledged in.
func TestAcceptorBeforeAck(t *testing.T) {
	st := memstore.New(memstore.Options{})
	defer st.Close()
	b, err := natsbus.Embedded(natsbus.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	r := router.New(router.Config{}, st, b, agent.NewLink(st, 100), nil)
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, id := range []string{"a", "b", "c"} {
		data, _ := json.Marshal(wire.Event{Kind: wire.EventText, Device: "tel-1", Session: "mobile:tel-1", ID: id, Text: id})
		reply, err := b.Request(ctx, bus.InboundSubject, data, nil)
		if err != nil {
			t.Fatal(err)
		}
		var rep wire.Reply
		if json.Unmarshal(reply, &rep); !rep.OK {
			t.Fatalf("event %s refused: %s", id, rep.Error)
		}
		// No waiting: the log must already hold it.
		entries, err := st.ReadEvents(ctx, "", 10, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != i+1 {
			t.Fatalf("after acknowledging %q the log holds %d events, want %d", id, len(entries), i+1)
		}
		var got wire.Event
		json.Unmarshal(entries[i].Data, &got)
		if got.ID != id {
			t.Fatalf("event %d in the log is %q, want %q", i, got.ID, id)
		}
	}
}
