package router_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// blockingAcceptor takes events durably at once, except those of device
// slow, which wait until release is closed.
type blockingAcceptor struct {
	slow    string
	release chan struct{}
}

func (a *blockingAcceptor) Handle(context.Context, wire.Event, agent.Output) error { return nil }

func (a *blockingAcceptor) Accept(ctx context.Context, ev wire.Event) error {
	if ev.Device == a.slow {
		select {
		case <-a.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// TestEventsOfOtherDevicesDoNotWait: while taking one device's event waits
// on the store (here: the agent's Accept), other devices' events are taken
// and acknowledged; the slow device's next event waits behind its first.
func TestEventsOfOtherDevicesDoNotWait(t *testing.T) {
	st := memstore.New(memstore.Options{})
	defer st.Close()
	b, err := natsbus.Embedded(natsbus.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	acc := &blockingAcceptor{slow: "tel-slow", release: make(chan struct{})}
	r := router.New(router.Config{}, st, b, acc, nil)
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	request := func(ctx context.Context, device, id string) error {
		data, _ := json.Marshal(wire.Event{Kind: wire.EventText, Device: device, Session: "mobile:" + device, ID: id, Text: id})
		reply, err := b.Request(ctx, bus.InboundSubject, data, nil)
		if err != nil {
			return err
		}
		var rep wire.Reply
		if json.Unmarshal(reply, &rep); !rep.OK {
			return errors.New(rep.Error)
		}
		return nil
	}
	slow := make(chan error, 1)
	go func() { slow <- request(context.Background(), "tel-slow", "s1") }()

	// Many devices, more than the bus has dispatchers: each is taken while
	// tel-slow's event waits.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 100 {
		if err := request(ctx, fmt.Sprintf("tel-%d", i), "m"); err != nil {
			t.Fatalf("event of tel-%d while tel-slow's waits: %v", i, err)
		}
	}
	select {
	case err := <-slow:
		t.Fatalf("tel-slow's event answered (%v) before its Accept returned", err)
	default:
	}
	close(acc.release)
	if err := <-slow; err != nil {
		t.Fatalf("tel-slow's event: %v", err)
	}
}
