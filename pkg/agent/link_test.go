package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/store/memstore"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

func newMemstore(t *testing.T) *memstore.Store {
	s := memstore.New(memstore.Options{})
	t.Cleanup(func() { s.Close() })
	return s
}

func TestLinkAppendsEvents(t *testing.T) {
	s := newMemstore(t)
	l := agent.NewLink(s, 0)
	evs := []wire.Event{
		{Kind: wire.EventText, Session: "mobile:tel-1", Device: "tel-1", UserID: "u-1", ID: "m-1", Text: "hello"},
		{Kind: wire.EventMedia, Session: "mobile:tel-1", Device: "tel-1", ID: "f-1",
			Media: &wire.MediaRef{Kind: "image", Mime: "image/png", Size: 3, Blob: "k1"}},
		{Kind: wire.EventPrompt, Session: "mobile:tel-2", Device: "tel-2",
			Prompt: &wire.PromptRef{ID: "p-1", Kind: "exec_approval", Option: "deny", Expired: true}},
	}
	for _, ev := range evs {
		// Link never speaks to the device: a nil Output must do.
		if err := l.Handle(t.Context(), ev, nil); err != nil {
			t.Fatalf("Handle: %v", err)
		}
	}
	got, err := s.ReadEvents(t.Context(), "", 100, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(evs) {
		t.Fatalf("the log holds %d events, want %d", len(got), len(evs))
	}
	for i, e := range got {
		var ev wire.Event
		if err := json.Unmarshal(e.Data, &ev); err != nil {
			t.Fatalf("entry %d is not a wire.Event: %v: %s", i, err, e.Data)
		}
		if !reflect.DeepEqual(ev, evs[i]) {
			t.Fatalf("entry %d = %+v, want %+v", i, ev, evs[i])
		}
	}
}

func TestLinkMaxLen(t *testing.T) {
	s := newMemstore(t)
	l := agent.NewLink(s, 3)
	for i := range 10 {
		if err := l.Handle(t.Context(), wire.Event{Kind: wire.EventText, Device: "d", ID: fmt.Sprint(i)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.ReadEvents(t.Context(), "", 100, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("a Link with maxLen 3 left %d events in the log", len(got))
	}
}

// flaky fails the first fails appends as a store that cannot be reached.
type flaky struct {
	store.Events
	fails   int32
	appends atomic.Int32
}

func (f *flaky) AppendEvent(ctx context.Context, data []byte, maxLen int) (string, error) {
	if f.appends.Add(1) <= f.fails {
		return "", fmt.Errorf("flaky: %w", store.ErrUnavailable)
	}
	return f.Events.AppendEvent(ctx, data, maxLen)
}

// TestLinkRetries: the router has acknowledged the event already, so an
// unreachable store is retried rather than losing it.
func TestLinkRetries(t *testing.T) {
	s := newMemstore(t)
	f := &flaky{Events: s, fails: 3}
	l := agent.NewLink(f, 0)
	if err := l.Handle(t.Context(), wire.Event{Kind: wire.EventText, Device: "d", ID: "1"}, nil); err != nil {
		t.Fatalf("Handle with a store failing 3 times: %v", err)
	}
	if n := f.appends.Load(); n != 4 {
		t.Fatalf("%d appends, want 4", n)
	}
	if got, _ := s.ReadEvents(t.Context(), "", 10, 0); len(got) != 1 {
		t.Fatalf("the log holds %d events, want 1", len(got))
	}

	// It gives up when its context ends, with both errors.
	f = &flaky{Events: s, fails: 1 << 30}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	err := agent.NewLink(f, 0).Handle(ctx, wire.Event{Kind: wire.EventText, Device: "d", ID: "2"}, nil)
	if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Handle with a store that never answers = %v, want ErrUnavailable and DeadlineExceeded", err)
	}

	// Other errors are not retried.
	f = &flaky{Events: s}
	canceled, cancel2 := context.WithCancel(t.Context())
	cancel2()
	err = agent.NewLink(f, 0).Handle(canceled, wire.Event{Kind: wire.EventText, Device: "d", ID: "3"}, nil)
	if !errors.Is(err, context.Canceled) || f.appends.Load() != 1 {
		t.Fatalf("Handle with a canceled context = %v after %d appends, want context.Canceled after 1", err, f.appends.Load())
	}
}
