package dispatch

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/hermes-mobile/gateway/pkg/telemetry"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// Groups gathers a Dispatcher's outputs by edge (group commit): the first
// output for an edge that has no request in flight goes at once, alone, as
// without Groups; the outputs for that edge that arrive while it is in
// flight wait, and go together in one wire.Batch on the edge's subject
// (the path of DeliverBatch) as soon as it is answered. So a low rate pays
// no delay, and a high one pays a bus round trip, and an edge's handling,
// per group instead of per output.
//
// A request holds its edge's turn until it is answered or for GroupHold,
// whichever comes first: an output that waits for the phone's ack (up to
// the edge's AckWait) or an edge that does not answer holds up the outputs
// behind it for GroupHold at most. A group is at most MaxGroupOutputs
// outputs and wire.MaxBatchBytes; one that fills goes at once.
//
// Each output of a group gets the answer it would have got alone: the
// edge writes it as it writes one from its output subject (the same write,
// owner fence and wait for the ack); one the edge answers "moved" (its
// device is not held at that epoch there, or moved after the write), or
// whose edge is of a release before batches, goes again alone after its
// owner is read again (Send), as DeliverBatch sends again what its batch
// did not settle. An output whose owner came from the OwnerCache has its
// owner read again before its group goes, in one store round trip for the
// group: alone, the edge would read it before writing
// (wire.Output.Cached), which it does not do for a batch. Each waits for
// its group until its own request's deadline, and stops waiting when its
// caller goes away.
//
// Safe for concurrent use; NewGroups makes one.
type Groups struct {
	hold atomic.Int64 // a time.Duration; zero: GroupHold (SetHold)
	m    *groupMetrics

	mu    sync.Mutex
	edges map[string]*group // the edges with a turn held; none idle
}

// GroupHold bounds how long a request in flight holds its edge's turn
// (Groups): past it, the outputs that gathered behind it go without
// waiting for its answer. A bus round trip to a loaded edge takes a
// millisecond or two; a phone's ack, a network's round trip.
const GroupHold = 2 * time.Millisecond

// MaxGroupOutputs bounds the outputs of one group (Groups), as
// POST /v1/deliver/batch's default bounds the deliveries of a batch.
const MaxGroupOutputs = 1000

// group is one edge's turn and the outputs waiting for it.
type group struct {
	waiting []*member
	size    int // the encoded size of waiting's outputs, with their commas
}

// member is an output waiting in a group.
type member struct {
	out      wire.Output
	data     []byte // out, encoded (with its traceparent)
	deadline time.Time
	answer   chan groupAnswer // buffered: the group never waits for its reader
	left     atomic.Bool      // its sender stopped waiting: not sent
}

type groupAnswer struct {
	o   Outcome
	err error
}

// NewGroups returns Groups counting on m (docs/metrics.md).
func NewGroups(m metric.Meter) *Groups {
	return &Groups{m: newGroupMetrics(m), edges: make(map[string]*group)}
}

// SetHold sets how long a request holds its edge's turn at most (zero:
// GroupHold).
func (g *Groups) SetHold(d time.Duration) { g.hold.Store(int64(d)) }

// Waiting returns how many outputs wait for their edge's turn now, those
// whose senders stopped waiting included.
func (g *Groups) Waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, e := range g.edges {
		n += len(e.waiting)
	}
	return n
}

// batchOverhead is what a wire.Batch adds to its outputs' encodings.
const batchOverhead = len(`{"outputs":[]}`)

// enter takes edge's turn for m (lead: m goes alone, now, and its sender
// calls the turn's release once answered), or puts m in the group waiting
// for it. A group that fills goes at once, outside the turn. With m nil it
// only takes an idle edge's turn: a sender learns whether it leads before
// it makes its member.
func (d *Dispatcher) enter(edge string, m *member) (lead bool) {
	g := d.Groups
	g.mu.Lock()
	e := g.edges[edge]
	if e == nil {
		g.edges[edge] = &group{}
		g.mu.Unlock()
		return true
	}
	if m == nil {
		g.mu.Unlock()
		return false
	}
	var full []*member
	if e.size+len(m.data)+1 > wire.MaxBatchBytes-batchOverhead {
		full, e.waiting, e.size = e.waiting, nil, 0
	}
	e.waiting = append(e.waiting, m)
	e.size += len(m.data) + 1
	if len(e.waiting) >= MaxGroupOutputs {
		full, e.waiting, e.size = e.waiting, nil, 0
	}
	g.mu.Unlock()
	if len(full) > 0 {
		go d.sendGroup(edge, full, false)
	}
	return false
}

// turn returns the function that ends a turn of edge (once, whatever calls
// it): it is called when the turn's request is answered, and after
// GroupHold. The group that gathered meanwhile takes the next turn; with
// none, the edge is idle.
func (d *Dispatcher) turn(edge string) (release func()) {
	var once sync.Once
	end := func() {
		once.Do(func() {
			g := d.Groups
			g.mu.Lock()
			e := g.edges[edge]
			next := e.waiting
			if len(next) == 0 {
				delete(g.edges, edge)
			} else {
				e.waiting, e.size = nil, 0
			}
			g.mu.Unlock()
			if len(next) > 0 {
				go d.sendGroup(edge, next, true)
			}
		})
	}
	t := time.AfterFunc(cmp.Or(time.Duration(d.Groups.hold.Load()), GroupHold), end)
	return func() {
		t.Stop()
		end()
	}
}

// await waits for m's answer from its group until rctx, its request's
// context (made from its caller's ctx), ends: then it is what a request
// alone would have answered (busOutcome).
func await(ctx, rctx context.Context, m *member) (Outcome, error) {
	select {
	case a := <-m.answer:
		return a.o, a.err
	case <-rctx.Done():
		m.left.Store(true)
		o, err, _ := busOutcome(ctx, rctx.Err(), Offline)
		return o, err
	}
}

// sendGroup sends ms, the outputs gathered for edge, in one wire.Batch,
// and answers each. turn: the request holds the edge's turn.
func (d *Dispatcher) sendGroup(edge string, ms []*member, turn bool) {
	release := func() {}
	if turn {
		release = d.turn(edge)
		defer release()
	}
	var deadline time.Time
	live := ms[:0:0]
	for _, m := range ms {
		if m.left.Load() {
			continue
		}
		live = append(live, m)
		if m.deadline.After(deadline) {
			deadline = m.deadline
		}
	}
	if len(live) == 0 {
		return
	}
	// Nobody's caller cancels the others' request: each stops waiting on
	// its own (await).
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if live = d.recheck(ctx, edge, live); len(live) == 0 {
		return
	}
	var buf bytes.Buffer
	buf.Grow(batchOverhead + len(live)*(len(live[0].data)+1))
	buf.WriteString(`{"outputs":[`)
	for k, m := range live {
		if k > 0 {
			buf.WriteByte(',')
		}
		buf.Write(m.data)
	}
	buf.WriteString("]}")
	d.Groups.m.sent(len(live))
	reply, err := d.Bus.Request(ctx, batchSubject(edge), buf.Bytes(), nil)
	release()
	if errors.Is(err, context.DeadlineExceeded) {
		// The last deadline of the group's outputs passed (each waits for
		// its own): no answer in time is offline, as alone (busOutcome).
		answerAll(live, Offline, nil)
		return
	}
	// No responders: an edge of the release before batches, or one that
	// is gone; each goes again alone (moved), as without Groups.
	if o, berr, ok := busOutcome(ctx, err, moved); ok {
		answerAll(live, o, berr)
		return
	}
	var r wire.BatchReply
	if err := wire.Unmarshal(reply, &r); err != nil {
		answerAll(live, "", fmt.Errorf("bad reply from edge: %w", err))
		return
	}
	if len(r.Replies) != len(live) {
		answerAll(live, "", fmt.Errorf("bad reply from edge: %d answers to %d outputs", len(r.Replies), len(live)))
		return
	}
	for k, m := range live {
		m.answer <- groupAnswer{o: Outcome(r.Replies[k].Result(m.out.WaitAck))}
	}
}

// recheck reads again, in one store round trip, the owners of the outputs
// of ms whose owner came from the OwnerCache, and returns those that still
// go to edge at their epoch; the others are answered "moved", and go again
// alone after their owner is read again. Alone, the edge would have read
// the owner of a cached output before writing it; it does not for a batch.
func (d *Dispatcher) recheck(ctx context.Context, edge string, ms []*member) []*member {
	var devices []string
	for _, m := range ms {
		if m.out.Cached {
			devices = append(devices, m.out.Device)
		}
	}
	if len(devices) == 0 {
		return ms
	}
	owners, err := d.owners(ctx, devices)
	if err != nil {
		// The store is away: the edge's own read of the owner fails as
		// well, and it answers what it would alone (written, but the
		// owner could not be checked).
		return ms
	}
	kept := ms[:0:0]
	k := 0
	for _, m := range ms {
		if !m.out.Cached {
			kept = append(kept, m)
			continue
		}
		same := owners[k].Edge == edge && owners[k].Epoch == m.out.Epoch
		k++
		if same {
			kept = append(kept, m)
			continue
		}
		m.answer <- groupAnswer{o: moved}
	}
	return kept
}

// answerAll answers every output of ms o and err.
func answerAll(ms []*member, o Outcome, err error) {
	for _, m := range ms {
		m.answer <- groupAnswer{o: o, err: err}
	}
}

// join is how Send's request for out (encoded: data) to owner's edge goes
// when d has Groups: lead is true when it goes alone now, and then release
// ends the edge's turn once it is answered; otherwise (joined) o and err
// are its answer from its group. Outputs a group cannot carry go alone,
// outside the turns: with epoch 0 (no owner record: the edge writes to
// whatever socket it holds, which a batch does not do) or too large.
func (d *Dispatcher) join(ctx, rctx context.Context, edge string, out wire.Output, data []byte) (joined bool, release func(), o Outcome, err error) {
	if out.Epoch == 0 || len(data)+tracedOutputSize+1 > wire.MaxBatchBytes-batchOverhead {
		return false, func() {}, "", nil
	}
	if d.enter(edge, nil) {
		return false, d.turn(edge), "", nil
	}
	m := &member{out: out, data: data, answer: make(chan groupAnswer, 1)}
	if tp := telemetry.TraceParent(ctx); tp != "" {
		// Alone, the bus's headers carry the span; in a batch, the output
		// names its own.
		m.out.TraceParent = tp
		if m.data, err = wire.Marshal(m.out); err != nil {
			return true, nil, "", err
		}
	}
	m.deadline, _ = rctx.Deadline()
	if d.enter(edge, m) { // the edge went idle meanwhile
		return false, d.turn(edge), "", nil
	}
	o, err = await(ctx, rctx, m)
	return true, nil, o, err
}

// groupMetrics count the requests that carried a Dispatcher's outputs with
// Groups: alone or as a group, and the outputs that went in groups.
type groupMetrics struct {
	requests  metric.Int64Counter
	aloneKind metric.AddOption
	groupKind metric.AddOption
	grouped   metric.Int64Counter
}

func newGroupMetrics(m metric.Meter) *groupMetrics {
	var x groupMetrics
	var in telemetry.Instruments
	var e error
	x.requests, e = m.Int64Counter("hermes_deliver_requests",
		metric.WithDescription("Bus requests that carried the API's single deliveries to their edges, by kind: alone (one delivery, its edge idle), group (those that arrived while a request to their edge was in flight)."))
	in.Check(e)
	x.grouped, e = m.Int64Counter("hermes_deliver_grouped",
		metric.WithDescription("The API's single deliveries that went to their edge in a group's request."))
	in.Check(e)
	if err := in.Err(); err != nil {
		panic(fmt.Sprintf("dispatch: creating the groups' instruments: %v", err))
	}
	x.aloneKind = metric.WithAttributes(attribute.String("kind", "alone"))
	x.groupKind = metric.WithAttributes(attribute.String("kind", "group"))
	x.requests.Add(bg, 0, x.aloneKind)
	x.requests.Add(bg, 0, x.groupKind)
	x.grouped.Add(bg, 0)
	return &x
}

// alone counts a request that carried one output alone.
func (m *groupMetrics) alone() { m.requests.Add(bg, 1, m.aloneKind) }

// sent counts a group's request that carried n outputs.
func (m *groupMetrics) sent(n int) {
	m.requests.Add(bg, 1, m.groupKind)
	m.grouped.Add(bg, int64(n))
}
