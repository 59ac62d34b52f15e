package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// A phone held up by a slow write keeps its schedule: the texts due while
// it waited are sent as soon as it can, each with the time it was due, so
// that a latency taken from it counts the wait, and none is skipped.
func TestSelfPaceKeepsItsScheduleThroughAStall(t *testing.T) {
	const (
		phase = 10 * time.Millisecond
		every = 20 * time.Millisecond
		d     = 200 * time.Millisecond
		stall = 100 * time.Millisecond
	)
	start := time.Now()
	var dues, calls []time.Time
	n := selfPace(context.Background(), start, phase, every, d, func(due time.Time) {
		dues = append(dues, due)
		calls = append(calls, time.Now())
		if len(dues) == 2 {
			time.Sleep(stall) // the second write is held up
		}
	})
	if n != 10 || len(dues) != 10 {
		t.Fatalf("%d calls (%d dues), want 10: one every %v from %v within %v", n, len(dues), every, phase, d)
	}
	for k, due := range dues {
		if want := start.Add(phase + time.Duration(k)*every); !due.Equal(want) {
			t.Errorf("text %d: due %v after the start, want %v: the schedule moved", k, due.Sub(start), want.Sub(start))
		}
		if calls[k].Before(due) {
			t.Errorf("text %d sent %v before it was due", k, due.Sub(calls[k]))
		}
	}
	// The texts due during the stall (the 3rd to the 6th, due at 50-110 ms)
	// go out at its end (~130 ms), late by what they waited.
	stallEnd := start.Add(phase + every + stall)
	for k := 2; k <= 5; k++ {
		if calls[k].Before(stallEnd) {
			t.Errorf("text %d sent %v after the start, before the stall ended at %v", k, calls[k].Sub(start), stallEnd.Sub(start))
		}
	}
	if late := calls[2].Sub(dues[2]); late < stall-every-5*time.Millisecond {
		t.Errorf("the first text due in the stall was late by %v, want about %v", late, stall-every)
	}
}

func TestSelfPaceStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	n := selfPace(ctx, time.Now(), 0, 10*time.Millisecond, time.Hour, func(time.Time) {
		if calls++; calls == 3 {
			cancel()
		}
	})
	if n != 3 {
		t.Errorf("%d calls after the context ended at the 3rd, want 3", n)
	}
}

// A text paced by its phone is timed from when it was due, and also from
// its write: a text due 300 ms before its answer but written 10 ms before
// it is 300 ms late for the phone.
func TestAnswerTimedFromDue(t *testing.T) {
	r := newRunner(Config{RunID: "r1", Conns: 1, Sources: 1, URLs: []string{"ws://127.0.0.1:1/ws"}}, nil)
	r.texts.pending[7] = struct{}{}
	now := time.Now()
	due, written := now.Add(-300*time.Millisecond), now.Add(-10*time.Millisecond)
	r.arrived(fmt.Sprintf("r1 7 %d %d", due.UnixNano(), written.UnixNano()), r.texts, r.stormTexts)
	if r.texts.arrived != 1 {
		t.Fatalf("the answer was not counted: %+v", r.errs.snapshot())
	}
	m := r.rep.Messages
	if got := m.Latency.Summary().Max; got < 300 {
		t.Errorf("latency %.1f ms, want at least 300 ms (from when the text was due)", got)
	}
	if got := m.FromWrite.Summary().Max; got < 10 || got >= 300 {
		t.Errorf("latency from the write %.1f ms, want 10 ms and under 300", got)
	}
}

// Phones paced by their own timers at 100 texts/s over 200 phones send one
// text each in 2 s, and every one is answered and timed both ways.
func TestPhonePacedRun(t *testing.T) {
	g := startNode(t, nil)
	cfg := testConfig(g, 200)
	cfg.Pace = pacePhone
	var progress bytes.Buffer // written under the runner's log lock
	rep, err := run(context.Background(), cfg, &progress)
	if err != nil {
		t.Fatal(err)
	}
	m := rep.Messages
	if !rep.OK || m.Sent != 200 || m.Answered != 200 {
		t.Fatalf("sent %d, answered %d, want 200 each (one per phone); failures %v\n%s", m.Sent, m.Answered, rep.Failures, progress.String())
	}
	if m.FromWrite.Count() != 200 || m.WriteLag.Count() != 200 {
		t.Errorf("%d latencies from the write and %d write lags, want 200 each", m.FromWrite.Count(), m.WriteLag.Count())
	}
	if m.Latency.Summary().Min < m.FromWrite.Summary().Min {
		t.Errorf("from due %.2f ms < from the write %.2f ms: the due time is the earlier", m.Latency.Summary().Min, m.FromWrite.Summary().Min)
	}
}

// slowAgent answers as the demo agent does, slowDown later.
type slowAgent struct{ slowDown time.Duration }

func (a slowAgent) Handle(ctx context.Context, ev wire.Event, out agent.Output) error {
	select { // the agent's own slowness, the thing under test
	case <-time.After(a.slowDown):
	case <-ctx.Done():
		return ctx.Err()
	}
	return agent.Demo{}.Handle(ctx, ev, out)
}

// One phone sending every 10 ms to an agent that takes 30 ms an answer has
// texts unanswered when it sends the next: the report counts them.
func TestInFlightPerPhoneCounted(t *testing.T) {
	g := startNode(t, slowAgent{30 * time.Millisecond})
	cfg := testConfig(g, 1)
	cfg.Duration, cfg.Rate = 300*time.Millisecond, 100
	rep, err := run(context.Background(), cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	m := rep.Messages
	if !rep.OK || m.InFlight.total() != m.Sent || m.Sent < 25 {
		t.Fatalf("sent %d, in-flight counts %v (total %d), failures %v", m.Sent, m.InFlight, m.InFlight.total(), rep.Failures)
	}
	if len(m.InFlight) < 3 || m.InFlight[0] == m.Sent {
		t.Errorf("in-flight counts %v (%s): want texts sent while two or more were unanswered", m.InFlight, m.InFlight)
	}
}

func TestInFlightCountsAtTheirBound(t *testing.T) {
	var c inFlightCounts
	for _, n := range []int{0, 0, 1, inFlightMax - 1, inFlightMax, inFlightMax + 5, -1} {
		c.add(n)
	}
	if len(c) != inFlightMax+1 || c[0] != 3 || c[1] != 1 || c[inFlightMax-1] != 1 || c[inFlightMax] != 2 {
		t.Errorf("counts %v", c)
	}
	var m inFlightCounts
	m.merge(c)
	m.merge(inFlightCounts{1})
	if m.total() != c.total()+1 || m[0] != 4 {
		t.Errorf("merged %v", m)
	}
	if s := (inFlightCounts{3, 1}).String(); s != "0: 75.0%, 1: 25.0%" {
		t.Errorf("String %q", s)
	}
	if s := c.String(); !strings.HasSuffix(s, "8+: 28.6%") {
		t.Errorf("String %q: the last count is 8 or more", s)
	}
}
