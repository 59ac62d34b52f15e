package main

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

var testRule = stepRule{MinAchieved: 0.9, P99Max: 100 * time.Millisecond, MissAfter: time.Second}

// stepWith is a step offered at 100/s whose done operations took lat each.
func stepWith(achieved float64, done, missed, failed int, lat time.Duration) *StepResult {
	s := &StepResult{Offered: 100, Achieved: achieved, Sent: done + missed + failed, Done: done, Missed: missed, Failed: failed, Latency: new(Histogram)}
	for range done {
		s.Latency.Record(lat)
	}
	return s
}

func TestJudgeSaturation(t *testing.T) {
	for _, c := range []struct {
		name         string
		s            *StepResult
		saturated    bool
		why          string // part of Why when saturated
		p50ms, p99ms float64
	}{
		{"keeps up", stepWith(95, 1000, 0, 0, 5*time.Millisecond), false, "", 5, 5},
		{"exactly 90%", stepWith(90, 1000, 0, 0, 5*time.Millisecond), false, "", 5, 5},
		{"achieves too little", stepWith(89, 1000, 0, 0, 5*time.Millisecond), true, "achieved 89/s < 90% of 100/s", 5, 5},
		{"p99 over the bound", stepWith(100, 1000, 0, 0, 150*time.Millisecond), true, "p99 150.0 ms > 100ms", 150, 150},
		// 10 of 1000 missed: the 990th fastest is still a completed one.
		{"1% missed", stepWith(100, 990, 10, 0, 5*time.Millisecond), false, "", 5, 5},
		// 11 of 1000 missed or failed: the p99 falls on one of them.
		{"over 1% missed or failed", stepWith(100, 989, 6, 5, 5*time.Millisecond), true, "p99 is a miss or a failure (6 missed, 5 failed of 1000)", 5, -1},
		{"most missed", stepWith(100, 400, 600, 0, 5*time.Millisecond), true, "p99 is a miss", -1, -1},
		{"nothing sent", stepWith(0, 0, 0, 0, 0), true, "achieved 0/s", -1, -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			testRule.judge(c.s)
			if c.s.Saturated != c.saturated || (c.saturated && !strings.Contains(c.s.Why, c.why)) || (!c.saturated && c.s.Why != "") {
				t.Errorf("saturated %v (%q), want %v (%q)", c.s.Saturated, c.s.Why, c.saturated, c.why)
			}
			same := func(got, want float64) bool {
				if want < 0 {
					return got == want
				}
				return within(time.Duration(got*1e6), time.Duration(want*1e6))
			}
			if !same(c.s.P50, c.p50ms) || !same(c.s.P99, c.p99ms) {
				t.Errorf("p50 %v p99 %v ms, want %v %v", c.s.P50, c.s.P99, c.p50ms, c.p99ms)
			}
		})
	}
}

func TestTrackerCountsEachOutcomeOnce(t *testing.T) {
	tr := newTracker(testRule)
	tr.begin(100)
	start := time.Now()
	a, at := tr.start()
	b, _ := tr.start()
	c, _ := tr.start()
	d, _ := tr.start()
	tr.done(a, at.Add(20*time.Millisecond))
	tr.done(a, at.Add(30*time.Millisecond)) // twice: the second is late
	tr.done(b, at.Add(2*time.Second))       // after MissAfter: missed
	tr.fail(c, "write")
	tr.fail(c, "write") // not pending any more: ignored
	tr.note("error:internal_error")
	_ = d // never answered: missed at the end of the step
	s := tr.finish(start, 100*time.Millisecond)
	if s.Sent != 4 || s.Done != 1 || s.Missed != 2 || s.Failed != 1 {
		t.Fatalf("sent %d done %d missed %d failed %d, want 4 1 2 1", s.Sent, s.Done, s.Missed, s.Failed)
	}
	if s.Errors["write"] != 1 || s.Errors["error:internal_error"] != 1 {
		t.Fatalf("errors %v", s.Errors)
	}
	if got := s.Latency.Percentile(0.5); !within(got, 20*time.Millisecond) {
		t.Fatalf("latency %v, want 20ms", got)
	}
	// One done in 100 ms of offering (the completion within it): 10/s.
	if s.Achieved < 9.9 || s.Achieved > 10.1 {
		t.Fatalf("achieved %v, want 10/s", s.Achieved)
	}
	tr.done(d, time.Now()) // after its step: late
	if tr.late != 2 {
		t.Fatalf("late %d, want 2", tr.late)
	}
}

// TestTrackerNotesAfterAQuietStep: a step without errors ends with none
// in its result, and a socket lost after it (the servers stopping) is
// still noted, not a write to a nil map that stops the whole run.
func TestTrackerNotesAfterAQuietStep(t *testing.T) {
	tr := newTracker(testRule)
	tr.begin(100)
	start := time.Now()
	a, at := tr.start()
	tr.done(a, at.Add(time.Millisecond))
	if s := tr.finish(start, 100*time.Millisecond); s.Errors != nil {
		t.Fatalf("errors %v, want none", s.Errors)
	}
	tr.note("lost")
	tr.fail(a, "write") // no longer pending: ignored
	if tr.cur.Errors["lost"] != 1 {
		t.Fatalf("errors after the step %v, want lost once", tr.cur.Errors)
	}
}

func TestAchievedCountsTheTimeToTheLastAnswer(t *testing.T) {
	tr := newTracker(testRule)
	tr.begin(100)
	start := time.Now()
	for range 10 {
		seq, _ := tr.start()
		// Answered 900 ms after the start although offered for 100 ms.
		tr.done(seq, start.Add(900*time.Millisecond))
	}
	s := tr.finish(start, 100*time.Millisecond)
	if s.Achieved < 11 || s.Achieved > 11.2 {
		t.Fatalf("achieved %v, want 10 / 0.9 s = 11.1/s", s.Achieved)
	}
}

// capped is a server of capacity perSec: operation n completes at
// max(its start, the previous completion) + 1/perSec, computed rather than
// waited for, so the outcome does not depend on the machine's speed.
type capped struct {
	mu     sync.Mutex
	perSec float64
	free   time.Time // when the server is next free
	tr     *tracker
}

func (c *capped) offer(seq uint64, at time.Time) {
	c.mu.Lock()
	begin := at
	if c.free.After(begin) {
		begin = c.free
	}
	c.free = begin.Add(time.Duration(float64(time.Second) / c.perSec))
	done := c.free
	c.mu.Unlock()
	c.tr.done(seq, done)
}

func TestSweepStopsAtTheFirstSaturatedStep(t *testing.T) {
	tr := newTracker(testRule)
	srv := &capped{perSec: 200, tr: tr}
	var w Sweep
	var seen []float64
	tr.sweep(context.Background(), &w, []float64{50, 100, 400, 800}, 300*time.Millisecond, srv.offer, func(s StepResult) { seen = append(seen, s.Offered) })
	if len(w.Steps) != 3 || len(seen) != 3 {
		t.Fatalf("%d steps (progress saw %v), want 3: the one at 800/s must not run", len(w.Steps), seen)
	}
	for _, s := range w.Steps[:2] {
		if s.Saturated || s.Done != s.Sent || s.Sent != int(s.Offered*0.3) {
			t.Fatalf("step %g/s: %+v, want unsaturated, all %d done", s.Offered, s, int(s.Offered*0.3))
		}
	}
	last := w.Steps[2]
	// 120 operations at 200/s take 0.6 s: 200/s achieved, a queue of up to
	// 0.3 s.
	if !last.Saturated || last.Achieved > 210 || last.Achieved < 150 || last.P99 < 200 {
		t.Fatalf("step 400/s: %+v, want saturated at about 200/s with p99 about 300 ms", last)
	}
	if !w.Saturated || w.Sustained != 100 || w.Peak < 95 {
		t.Fatalf("sweep: saturated %v sustained %v peak %v, want true 100 ≥ 95", w.Saturated, w.Sustained, w.Peak)
	}
}

func TestSweepThatNeverSaturates(t *testing.T) {
	tr := newTracker(testRule)
	srv := &capped{perSec: 10000, tr: tr}
	var w Sweep
	tr.sweep(context.Background(), &w, []float64{50, 100}, 200*time.Millisecond, srv.offer, nil)
	if w.Saturated || w.Sustained != 100 || len(w.Steps) != 2 {
		t.Fatalf("saturated %v sustained %v steps %d, want false 100 2", w.Saturated, w.Sustained, len(w.Steps))
	}
}

func TestSweepMissesWhatIsNeverAnswered(t *testing.T) {
	rule := testRule
	rule.MissAfter = 50 * time.Millisecond
	rule.P99Max = 50 * time.Millisecond
	tr := newTracker(rule)
	var w Sweep
	start := time.Now()
	tr.sweep(context.Background(), &w, []float64{100}, 100*time.Millisecond, func(uint64, time.Time) {}, nil)
	s := w.Steps[0]
	if s.Sent != 10 || s.Missed != 10 || s.Done != 0 || !s.Saturated || s.P50 != -1 {
		t.Fatalf("%+v, want 10 sent, all missed, saturated", s)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the step took %v: it must give up MissAfter after its last start", took)
	}
}

func TestRatio(t *testing.T) {
	for _, c := range []struct {
		g, f      Sweep
		sustained float64
		bound     string
		peak      float64
	}{
		{Sweep{Sustained: 500, Saturated: true, Peak: 600}, Sweep{Sustained: 2000, Saturated: true, Peak: 2400}, 0.25, "=", 0.25},
		{Sweep{Sustained: 500, Saturated: true, Peak: 600}, Sweep{Sustained: 2000, Peak: 2000}, 0.25, "<=", 0.3},
		{Sweep{Sustained: 2000, Peak: 2000}, Sweep{Sustained: 1000, Saturated: true, Peak: 1500}, 2, ">=", 2000.0 / 1500},
		{Sweep{Sustained: 2000, Peak: 2000}, Sweep{Sustained: 2000, Peak: 2000}, 1, "?", 1},
		{Sweep{Sustained: 0, Saturated: true, Peak: 50}, Sweep{Sustained: 2000, Saturated: true, Peak: 2500}, 0, "?", 0.02},
	} {
		r := ratio(&c.g, &c.f)
		if r.Bound != c.bound || r.Sustained != c.sustained || r.Peak < c.peak-1e-9 || r.Peak > c.peak+1e-9 {
			t.Errorf("ratio(%+v, %+v) = %+v, want %v %s peak %v", c.g, c.f, r, c.sustained, c.bound, c.peak)
		}
	}
}

func TestRankOfAHistogram(t *testing.T) {
	var h Histogram
	if h.Rank(1) != 0 {
		t.Fatal("rank of an empty histogram")
	}
	for i := 1; i <= 100; i++ {
		h.Record(time.Duration(i) * time.Millisecond)
	}
	for k, want := range map[uint64]time.Duration{1: time.Millisecond, 50: 50 * time.Millisecond, 99: 99 * time.Millisecond, 100: 100 * time.Millisecond, 500: 100 * time.Millisecond} {
		if got := h.Rank(k); !within(got, want) {
			t.Errorf("Rank(%d) = %v, want %v", k, got, want)
		}
	}
}

func TestStepConfigValidation(t *testing.T) {
	good := stepConfig{Scenarios: []string{"roundtrip"}, URLs: []string{"ws://127.0.0.1:1/ws"}, Token: "t", Phones: 10,
		Rates: []float64{100, 200}, Step: time.Second, Rule: testRule, Floor: "auto", Batch: 10, InFlight: 10, Sources: 1}
	if err := good.validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	for _, c := range []struct {
		name string
		mod  func(*stepConfig)
		want string
	}{
		{"unknown scenario", func(c *stepConfig) { c.Scenarios = []string{"storm"} }, `"storm" is not one of`},
		{"deliver without the API", func(c *stepConfig) { c.Scenarios = []string{"deliver"} }, "needs -deliver"},
		{"deliver-batch without the API", func(c *stepConfig) { c.Scenarios = []string{"deliver-batch"} }, "needs -deliver"},
		{"batch over the router's bound", func(c *stepConfig) { c.Batch = MaxBatch + 1 }, "-batch"},
		{"rates not increasing", func(c *stepConfig) { c.Rates = []float64{200, 100} }, "must increase"},
		{"rate over the cap", func(c *stepConfig) { c.Rates = []float64{MaxStepRate + 1} }, "is not in"},
		{"floor not on loopback", func(c *stepConfig) { c.Floor = "ws://10.0.0.1:1/ws" }, "-floor"},
		{"edge not on loopback", func(c *stepConfig) { c.URLs = []string{"ws://example.com/ws"} }, "loopback"},
		{"p99 bound over the miss time", func(c *stepConfig) { c.Rule.P99Max = 2 * time.Second }, "-p99-max"},
		{"no token", func(c *stepConfig) { c.Token = "" }, "-token"},
		{"too many phones", func(c *stepConfig) { c.Phones = MaxConns + 1 }, "-phones"},
	} {
		cfg := good
		c.mod(&cfg)
		if err := cfg.validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
	rates, err := parseRates("100, 1k,2.5K")
	if err != nil || len(rates) != 3 || rates[1] != 1000 || rates[2] != 2500 {
		t.Fatalf("parseRates = %v, %v", rates, err)
	}
	if _, err := parseRates("100,fast"); err == nil {
		t.Fatal("parseRates accepted fast")
	}
}
