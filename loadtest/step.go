package main

// Step mode: a sweep offers increasing rates of one kind of operation, each
// for a fixed time, and stops at the first step that saturates. An
// operation is a round trip, a delivery or a handshake; it is started by an
// offer and completed (or failed) when its answer arrives, whichever
// goroutine sees it.

import (
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// stepRule says when a step is saturated.
type stepRule struct {
	// MinAchieved: a step whose achieved rate is below this fraction of
	// the offered rate is saturated.
	MinAchieved float64
	// P99Max: a step whose p99 latency is above this is saturated.
	P99Max time.Duration
	// MissAfter: an operation not completed this long after it started is
	// missed. A missed or failed operation counts as slower than any
	// completed one in the percentiles.
	MissAfter time.Duration
}

// StepResult is one step of a sweep.
type StepResult struct {
	Offered  float64    `json:"offered_per_s"`
	Seconds  float64    `json:"seconds"` // the time operations were started
	Sent     int        `json:"sent"`    // operations started
	SentRate float64    `json:"sent_per_s"`
	Done     int        `json:"done"`   // completed within MissAfter
	Missed   int        `json:"missed"` // not completed within MissAfter
	Failed   int        `json:"failed"` // refused or failed; Errors says how
	Achieved float64    `json:"achieved_per_s"`
	Latency  *Histogram `json:"latency"` // of the completed operations
	// P50 and P99 are of every operation started, the missed and failed
	// ones counted as slower than MissAfter: -1 means over MissAfter.
	P50       float64        `json:"p50_ms"`
	P99       float64        `json:"p99_ms"`
	Errors    map[string]int `json:"errors,omitempty"`
	Load1     float64        `json:"load1"` // the machine's 1-minute load average at the end of the step; -1 unknown
	Saturated bool           `json:"saturated"`
	Why       string         `json:"why,omitempty"`
}

// quantile is the q-quantile of every operation the step started, the
// missed and failed ones counted as slower than any completed one; ok is
// false when it falls on one of those, or when nothing was started.
func (s *StepResult) quantile(q float64) (d time.Duration, ok bool) {
	total := s.Done + s.Missed + s.Failed
	if total == 0 {
		return 0, false
	}
	rank := max(int(math.Ceil(q*float64(total)-1e-9)), 1)
	if rank > s.Done {
		return 0, false
	}
	return s.Latency.Rank(uint64(rank)), true
}

// judge fills the percentiles and decides whether s is saturated.
func (r stepRule) judge(s *StepResult) {
	var why []string
	if s.Achieved < r.MinAchieved*s.Offered {
		why = append(why, fmt.Sprintf("achieved %.0f/s < %.0f%% of %g/s", s.Achieved, r.MinAchieved*100, s.Offered))
	}
	s.P50, s.P99 = -1, -1
	if d, ok := s.quantile(0.50); ok {
		s.P50 = ms(d)
	}
	p99, ok := s.quantile(0.99)
	switch {
	case !ok:
		why = append(why, fmt.Sprintf("p99 is a miss or a failure (%d missed, %d failed of %d)", s.Missed, s.Failed, s.Sent))
	default:
		s.P99 = ms(p99)
		if p99 > r.P99Max {
			why = append(why, fmt.Sprintf("p99 %.1f ms > %v", s.P99, r.P99Max))
		}
	}
	s.Saturated, s.Why = len(why) > 0, strings.Join(why, "; ")
}

// Sweep is the steps of one target, up to the first saturated one.
type Sweep struct {
	Target string       `json:"target"` // "gateway" or "floor"
	URLs   []string     `json:"urls"`
	Steps  []StepResult `json:"steps"`
	// Sustained is the highest offered rate of a step that did not
	// saturate (0 when the first did); Saturated says whether a step did,
	// else Sustained is only a lower bound.
	Sustained float64 `json:"sustained_per_s"`
	Saturated bool    `json:"saturated"`
	// Peak is the highest achieved rate of any step.
	Peak float64 `json:"peak_per_s"`
	// Late counts answers that came after their step had given them up.
	Late   int    `json:"late"`
	Failed string `json:"failed,omitempty"` // why the sweep could not run
}

// step returns the step of the sweep offered rate, if it ran.
func (w *Sweep) step(rate float64) *StepResult {
	for i := range w.Steps {
		if w.Steps[i].Offered == rate {
			return &w.Steps[i]
		}
	}
	return nil
}

// offerFunc starts operation seq at time at; its outcome is reported to the
// tracker (done or fail) by whoever sees it. It must not wait for it.
type offerFunc func(seq uint64, at time.Time)

// tracker follows the operations of the step under way.
type tracker struct {
	mu       sync.Mutex
	seq      uint64
	pending  map[uint64]time.Time // started, not yet done, failed or missed
	cur      *StepResult
	lastDone time.Time
	late     int
	rule     stepRule
}

func newTracker(rule stepRule) *tracker {
	return &tracker{rule: rule, pending: map[uint64]time.Time{}}
}

// begin starts a step offering rate.
func (t *tracker) begin(rate float64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cur = &StepResult{Offered: rate, Latency: new(Histogram), Errors: map[string]int{}}
	t.lastDone = time.Time{}
	clear(t.pending)
}

// start registers a new operation of the current step.
func (t *tracker) start() (uint64, time.Time) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seq++
	t.pending[t.seq] = now
	t.cur.Sent++
	return t.seq, now
}

// done completes seq at time at. An operation of an earlier step, or one
// already given up, is late.
func (t *tracker) done(seq uint64, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	began, ok := t.pending[seq]
	if !ok {
		t.late++
		return
	}
	delete(t.pending, seq)
	if d := at.Sub(began); d > t.rule.MissAfter {
		t.cur.Missed++
	} else {
		t.cur.Done++
		t.cur.Latency.Record(d)
		if at.After(t.lastDone) {
			t.lastDone = at
		}
	}
}

// fail ends seq as failed with kind; an operation not pending is ignored.
func (t *tracker) fail(seq uint64, kind string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.pending[seq]; !ok {
		return
	}
	delete(t.pending, seq)
	t.cur.Failed++
	t.cur.Errors[kind]++
}

// note counts an error that belongs to no one operation (an error frame,
// a connection lost).
func (t *tracker) note(kind string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cur != nil {
		t.cur.Errors[kind]++
	}
}

// outstanding is how many operations of the step are pending, and when the
// newest of them started.
func (t *tracker) outstanding() (int, time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var newest time.Time
	for _, at := range t.pending {
		if at.After(newest) {
			newest = at
		}
	}
	return len(t.pending), newest
}

// finish ends the step that started at start and offered for d: what is
// still pending is missed. The achieved rate is the completions over the
// time from start to the last of them (at least d).
func (t *tracker) finish(start time.Time, d time.Duration) StepResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.cur
	s.Missed += len(t.pending)
	clear(t.pending)
	s.Seconds = d.Seconds()
	s.SentRate = perSecond(s.Sent, d)
	span := max(d, t.lastDone.Sub(start))
	s.Achieved = perSecond(s.Done, span)
	r := *s
	if len(r.Errors) == 0 {
		// Only in the result: the step's own map still counts what comes
		// after it (a socket lost once the servers stop).
		r.Errors = nil
	}
	return r
}

// runStep offers rate for d through offer, then waits until every
// operation has ended or MissAfter has passed since the last one started.
func (t *tracker) runStep(ctx context.Context, rate float64, d time.Duration, offer offerFunc) StepResult {
	t.begin(rate)
	start := time.Now()
	pace(ctx, rate, d, func() bool {
		seq, at := t.start()
		offer(seq, at)
		return true
	})
	return t.settle(ctx, start, d)
}

// settle ends the step that started at start and offered for d, once every
// operation has ended or MissAfter has passed since the last one started,
// and judges it.
func (t *tracker) settle(ctx context.Context, start time.Time, d time.Duration) StepResult {
	for ctx.Err() == nil {
		n, newest := t.outstanding()
		if n == 0 || time.Since(newest) > t.rule.MissAfter {
			break
		}
		sleep(ctx, 5*time.Millisecond)
	}
	s := t.finish(start, d)
	t.rule.judge(&s)
	s.Load1 = loadAverage()
	return s
}

// sweep runs the steps of rates in order, each for d, until one saturates
// or ctx ends; each step is reported to progress as it ends.
func (t *tracker) sweep(ctx context.Context, w *Sweep, rates []float64, d time.Duration, offer offerFunc, progress func(StepResult)) {
	for _, rate := range rates {
		if ctx.Err() != nil {
			break
		}
		s := t.runStep(ctx, rate, d, offer)
		w.Steps = append(w.Steps, s)
		w.Peak = max(w.Peak, s.Achieved)
		if progress != nil {
			progress(s)
		}
		if s.Saturated {
			w.Saturated = true
			break
		}
		w.Sustained = rate
	}
	t.mu.Lock()
	w.Late = t.late
	t.mu.Unlock()
}

// loadAverage is the machine's 1-minute load average, -1 when unknown.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

// Ratio compares a gateway sweep with the floor's.
type Ratio struct {
	// Sustained is gateway.Sustained / floor.Sustained; Bound says how
	// exact it is: "=" when both saturated, "<=" when only the gateway did
	// (the floor could do more), ">=" when only the floor did, "?" when
	// neither did or the gateway saturated at its first step.
	Sustained float64 `json:"sustained"`
	Bound     string  `json:"bound"`
	// Peak is gateway.Peak / floor.Peak.
	Peak float64 `json:"peak"`
}

// ratio compares g with the floor f.
func ratio(g, f *Sweep) Ratio {
	var r Ratio
	if f.Peak > 0 {
		r.Peak = g.Peak / f.Peak
	}
	if g.Sustained <= 0 || f.Sustained <= 0 {
		r.Bound = "?"
		return r
	}
	r.Sustained = g.Sustained / f.Sustained
	switch {
	case g.Saturated && f.Saturated:
		r.Bound = "="
	case g.Saturated:
		r.Bound = "<="
	case f.Saturated:
		r.Bound = ">="
	default:
		r.Bound = "?"
	}
	return r
}
