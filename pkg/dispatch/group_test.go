package dispatch_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

func newGroups() *dispatch.Groups { return dispatch.NewGroups(noop.NewMeterProvider().Meter("test")) }

// answerBatches subscribes to edge's batch subject as an edge would: each
// output is answered what answer says of its device; it returns the
// devices of each batch so far.
func answerBatches(t *testing.T, b bus.Bus, edge string, answer func(device string) wire.Outcome) func() [][]string {
	t.Helper()
	var mu sync.Mutex
	var got [][]string
	sub, err := b.Subscribe(bus.EdgeSubject(edge), func(m *bus.Msg) {
		var batch wire.Batch
		if err := json.Unmarshal(m.Data, &batch); err != nil {
			t.Error(err)
			return
		}
		var r wire.BatchReply
		var devs []string
		for _, out := range batch.Outputs {
			devs = append(devs, out.Device)
			r.Replies = append(r.Replies, wire.OutputReply(answer(out.Device), ""))
		}
		mu.Lock()
		got = append(got, devs)
		mu.Unlock()
		data, _ := json.Marshal(r)
		_ = m.Respond(data)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	return func() [][]string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

// waitUntil waits until cond holds, for up to 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-tick.C:
		}
	}
}

func delivered(string) wire.Outcome { return wire.OutcomeDelivered }

// TestGroupOfSilentEdgeFailsAlone: an edge that takes its requests and
// never answers holds up its own outputs only: those for another edge,
// sent at the same time, are delivered at once, and the silent edge's are
// offline once their own request's time is up, while their callers can
// still keep them (the time Send leaves them, as alone).
func TestGroupOfSilentEdgeFailsAlone(t *testing.T) {
	b, st := embedded(t)
	var devs []string
	for _, dev := range []string{"ok-1", "ok-2", "ok-3", "ok-4", "silent-1", "silent-2", "silent-3"} {
		edge := "edge-ok"
		if dev[0] == 's' {
			edge = "edge-silent"
		}
		if _, err := st.ClaimDevice(t.Context(), dev, edge, time.Minute); err != nil {
			t.Fatal(err)
		}
		devs = append(devs, dev)
	}
	collect(t, b, bus.EdgeOutputSubject("edge-ok"))
	answerBatches(t, b, "edge-ok", delivered)
	for _, subject := range []string{bus.EdgeOutputSubject("edge-silent"), bus.EdgeSubject("edge-silent")} {
		sub, err := b.Subscribe(subject, func(*bus.Msg) {})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
	}
	d := &dispatch.Dispatcher{Owners: st, Bus: b, Groups: newGroups()}

	type answer struct {
		dev string
		o   dispatch.Outcome
		err error
		at  time.Time
	}
	answers := make(chan answer, len(devs))
	const callerTime = 4 * time.Second
	start := time.Now()
	for _, dev := range devs {
		go func() {
			ctx, cancel := context.WithTimeout(t.Context(), callerTime)
			defer cancel()
			o, err := d.Send(ctx, wire.Output{Op: wire.OpMessage, Device: dev, ID: "m-" + dev, Text: "hi", Final: true})
			answers <- answer{dev, o, err, time.Now()}
		}()
	}
	var ok, silent []answer
	for range devs {
		a := <-answers
		if a.dev[0] == 'o' {
			if len(silent) > 0 {
				t.Fatalf("%s answered after %s of the silent edge", a.dev, silent[0].dev)
			}
			ok = append(ok, a)
		} else {
			silent = append(silent, a)
		}
	}
	for _, a := range ok {
		if a.o != dispatch.Delivered || a.err != nil {
			t.Fatalf("%s: %s, %v; want delivered", a.dev, a.o, a.err)
		}
	}
	// Alone, a request waits until a quarter of its caller's time is left.
	for _, a := range silent {
		if a.o != dispatch.Offline || a.err != nil {
			t.Fatalf("%s on the silent edge: %s, %v; want offline", a.dev, a.o, a.err)
		}
		if took := a.at.Sub(start); took < callerTime*3/4-100*time.Millisecond || took >= callerTime {
			t.Fatalf("%s on the silent edge answered after %v; want about %v, before its caller's %v", a.dev, took, callerTime*3/4, callerTime)
		}
	}
}

// TestGroupAnswersEachAsAlone: while the request that holds an edge's turn
// is in flight, the outputs that come wait for it and go in one batch when
// it is answered; one whose caller goes away meanwhile returns at once and
// is not sent; one the batch answers "moved" goes again alone; one whose
// owner came from the cache and changed since is read again before the
// batch goes and sent alone to its new edge, never in the batch.
func TestGroupAnswersEachAsAlone(t *testing.T) {
	b, st := embedded(t)
	for _, dev := range []string{"lead", "leaves", "stays", "moves", "cached"} {
		if _, err := st.ClaimDevice(t.Context(), dev, "edge-a", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	gate := make(chan struct{})
	leadArrived := make(chan struct{})
	var mu sync.Mutex
	var alone []string // the outputs edge-a got on its output subject, in order
	sub, err := b.Subscribe(bus.EdgeOutputSubject("edge-a"), func(m *bus.Msg) {
		var out wire.Output
		if err := json.Unmarshal(m.Data, &out); err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		alone = append(alone, out.Device)
		mu.Unlock()
		ok, _ := json.Marshal(wire.OutputReply(wire.OutcomeDelivered, ""))
		if out.Device != "lead" {
			_ = m.Respond(ok)
			return
		}
		close(leadArrived)
		go func() {
			<-gate
			_ = m.Respond(ok)
		}()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	batches := answerBatches(t, b, "edge-a", func(dev string) wire.Outcome {
		if dev == "moves" {
			return wire.OutcomeMoved
		}
		return wire.OutcomeDelivered
	})
	onB := collect(t, b, bus.EdgeOutputSubject("edge-b"))

	d := &dispatch.Dispatcher{Owners: st, Bus: b, Cache: &dispatch.OwnerCache{}, Groups: newGroups()}
	d.Groups.SetHold(time.Minute) // the turn ends with the lead's answer
	send := func(ctx context.Context, dev string) <-chan error {
		res := make(chan error, 1)
		go func() {
			o, err := d.Send(ctx, wire.Output{Op: wire.OpMessage, Device: dev, ID: "m-" + dev, Text: "hi", Final: true})
			if err == nil && o != dispatch.Delivered {
				err = errors.New("outcome " + string(o))
			}
			res <- err
		}()
		return res
	}
	// "cached" is read into the cache, then moves to edge-b.
	if err := <-send(t.Context(), "cached"); err != nil {
		t.Fatal(err)
	}
	epoch, err := st.ClaimDevice(t.Context(), "cached", "edge-b", time.Minute)
	if err != nil {
		t.Fatal(err)
	}

	lead := send(t.Context(), "lead")
	<-leadArrived
	ctx, leave := context.WithCancel(t.Context())
	leaves := send(ctx, "leaves")
	stays, moves, cached := send(t.Context(), "stays"), send(t.Context(), "moves"), send(t.Context(), "cached")
	waitUntil(t, "4 outputs waiting", func() bool { return d.Groups.Waiting() == 4 })
	leave()
	if err := <-leaves; !errors.Is(err, context.Canceled) {
		t.Fatalf("an output whose caller went away while it waited: %v; want canceled", err)
	}
	close(gate)
	for name, res := range map[string]<-chan error{"lead": lead, "stays": stays, "moves": moves, "cached": cached} {
		if err := <-res; err != nil {
			t.Fatalf("%s: %v; want delivered", name, err)
		}
	}
	if got := batches(); len(got) != 1 || !slices.Equal(slices.Sorted(slices.Values(got[0])), []string{"moves", "stays"}) {
		t.Fatalf("edge-a's batches: %v; want one of stays and moves", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"cached", "lead", "moves"}; !slices.Equal(alone, want) {
		t.Fatalf("edge-a alone: %v; want %v", alone, want)
	}
	if got := onB(); len(got) != 1 || got[0].Device != "cached" || got[0].Epoch != epoch || got[0].Cached {
		t.Fatalf("edge-b got %+v; want cached at epoch %d, read fresh", got, epoch)
	}
}

// gatedEdge subscribes edge's output subject as an edge that answers every
// output delivered, the one for device "lead" only once open is closed;
// arrived is closed when that one came.
func gatedEdge(t *testing.T, b bus.Bus, edge string) (arrived <-chan struct{}, open func()) {
	t.Helper()
	gate, came := make(chan struct{}), make(chan struct{})
	sub, err := b.Subscribe(bus.EdgeOutputSubject(edge), func(m *bus.Msg) {
		var out wire.Output
		if err := json.Unmarshal(m.Data, &out); err != nil {
			t.Error(err)
			return
		}
		ok, _ := json.Marshal(wire.OutputReply(wire.OutcomeDelivered, ""))
		if out.Device != "lead" {
			_ = m.Respond(ok)
			return
		}
		close(came)
		go func() {
			<-gate
			_ = m.Respond(ok)
		}()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	return came, sync.OnceFunc(func() { close(gate) })
}

// TestGroupBounds: a group is at most MaxGroupOutputs outputs and
// wire.MaxBatchBytes of them; the output that would pass either makes the
// group go at once, without waiting for the turn, and starts the next.
func TestGroupBounds(t *testing.T) {
	b, st := embedded(t)
	epoch, err := st.ClaimDevice(t.Context(), "lead", "edge-n", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.ClaimDevice(t.Context(), "many", "edge-n", time.Minute); err != nil {
		t.Fatal(err)
	}
	d := &dispatch.Dispatcher{Owners: st, Bus: b, Groups: newGroups()}
	d.Groups.SetHold(time.Minute) // the turn ends with the lead's answer
	send := func(dev, text string) <-chan error {
		res := make(chan error, 1)
		go func() {
			o, err := d.Send(t.Context(), wire.Output{Op: wire.OpMessage, Device: dev, ID: "m", Text: text, Final: true})
			if err == nil && o != dispatch.Delivered {
				err = errors.New("outcome " + string(o))
			}
			res <- err
		}()
		return res
	}
	// run holds edge-n's turn with the lead, sends texts for "many" while
	// it is held, waits until they are in groups gone and one waiting,
	// then lets the lead's answer go and returns the sizes of the batches.
	run := func(t *testing.T, texts []string, gone int) []int {
		t.Helper()
		arrived, open := gatedEdge(t, b, "edge-n")
		defer open()
		batches := answerBatches(t, b, "edge-n", delivered)
		lead := send("lead", "first")
		<-arrived
		var res []<-chan error
		for _, text := range texts {
			res = append(res, send("many", text))
		}
		waitUntil(t, "the full groups gone and one output waiting", func() bool {
			return len(batches()) == gone && d.Groups.Waiting() == 1
		})
		open()
		for _, r := range append(res, lead) {
			if err := <-r; err != nil {
				t.Fatal(err)
			}
		}
		var sizes []int
		for _, bt := range batches() {
			sizes = append(sizes, len(bt))
		}
		return sizes
	}

	t.Run("outputs", func(t *testing.T) {
		texts := make([]string, dispatch.MaxGroupOutputs+1)
		for i := range texts {
			texts[i] = "hi"
		}
		if got := run(t, texts, 1); !slices.Equal(got, []int{dispatch.MaxGroupOutputs, 1}) {
			t.Fatalf("%d outputs while the turn was held went in groups of %v; want %d, then 1", len(texts), got, dispatch.MaxGroupOutputs)
		}
	})
	// text returns a text whose output, as Send encodes it, is n bytes.
	text := func(n int) string {
		data, err := json.Marshal(wire.Output{Op: wire.OpMessage, Device: "many", ID: "m", Final: true, Epoch: epoch})
		if err != nil {
			t.Fatal(err)
		}
		return strings.Repeat("x", n-len(data)-len(`"text":"",`))
	}
	// Two outputs (each with its comma) fill a batch to the byte.
	exact := (wire.MaxBatchBytes-len(`{"outputs":[]}`))/2 - 1
	if (wire.MaxBatchBytes-len(`{"outputs":[]}`))%2 != 0 {
		t.Fatal("the bound is not two whole outputs")
	}
	t.Run("bytes", func(t *testing.T) {
		at := text(exact)
		if got := run(t, []string{at, at, at}, 1); !slices.Equal(got, []int{2, 1}) {
			t.Fatalf("3 outputs of %d bytes went in groups of %v; want 2 (exactly %d bytes), then 1", exact, got, wire.MaxBatchBytes)
		}
	})
	t.Run("one byte past", func(t *testing.T) {
		past := text(exact + 1)
		if got := run(t, []string{past, past}, 1); !slices.Equal(got, []int{1, 1}) {
			t.Fatalf("2 outputs of %d bytes went in groups of %v; want 1, then 1", exact+1, got)
		}
	})
}
