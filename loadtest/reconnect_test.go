package main

import (
	"context"
	"io"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// TestBalanceTurnsAndAvoidsTheLostEdge: attempts go round-robin over the
// edges, as a load balancer sends them, never to the edge just lost unless
// there is no other.
func TestBalanceTurnsAndAvoidsTheLostEdge(t *testing.T) {
	urls := []string{"a", "b", "c"}
	var turn atomic.Uint64
	var got []string
	for range 6 {
		got = append(got, balance(urls, &turn, ""))
	}
	if want := []string{"a", "b", "c", "a", "b", "c"}; !slices.Equal(got, want) {
		t.Errorf("round robin: %v, want %v", got, want)
	}
	got = nil
	for range 4 {
		got = append(got, balance(urls, &turn, "a"))
	}
	if want := []string{"b", "c", "b", "c"}; !slices.Equal(got, want) {
		t.Errorf("avoiding a: %v, want %v", got, want)
	}
	if u := balance([]string{"a"}, &turn, "a"); u != "a" {
		t.Errorf("the only edge: %q, want a", u)
	}
}

// TestResendPause: uniform in [cap/2, cap], the cap doubling from 500 ms
// to 30 s.
func TestResendPause(t *testing.T) {
	for _, tc := range []struct {
		n    int
		r    float64
		want time.Duration
	}{
		{1, 0, 250 * time.Millisecond},
		{1, 0.999, 250*time.Millisecond + 249750*time.Microsecond},
		{3, 0.5, 1500 * time.Millisecond},
		{8, 0, 15 * time.Second},
		{100, 1, 30 * time.Second},
	} {
		if got := resendPause(tc.n, func() float64 { return tc.r }); got != tc.want {
			t.Errorf("resend %d, random %v: %v, want %v", tc.n, tc.r, got, tc.want)
		}
	}
}

// TestReconnectsMerged: counts add up, the time until all were back runs
// from the earliest drop to the latest return of any process, and a phone
// not back fails the run.
func TestReconnectsMerged(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 5, 0, 0, 0, time.UTC)
	a, b := sampleReport("a", 10, time.Millisecond), sampleReport("b", 10, time.Millisecond)
	a.Reconnects.Dropped, a.Reconnects.Back, a.Reconnects.Ends = 4, 4, map[string]int{"lost": 4}
	a.Reconnects.FirstDrop, a.Reconnects.LastBack = t0.Add(time.Second), t0.Add(3*time.Second)
	a.Reconnects.Handshake.Record(100 * time.Millisecond)
	b.Reconnects.Dropped, b.Reconnects.Back, b.Reconnects.Ends = 5, 5, map[string]int{"lost": 3, "close:1001": 2}
	b.Reconnects.FirstDrop, b.Reconnects.LastBack = t0, t0.Add(2*time.Second)
	b.Reconnects.Handshake.Record(200 * time.Millisecond)
	m := newReport()
	m.Merge(a)
	m.Merge(b)
	rc := m.Reconnects
	if rc.Dropped != 9 || rc.Back != 9 || rc.Ends["lost"] != 7 || rc.Ends["close:1001"] != 2 || rc.Handshake.Count() != 2 {
		t.Errorf("merged counts: %+v", rc)
	}
	if rc.Seconds != 3 {
		t.Errorf("all back after %gs, want 3 (first drop of b to last return of a)", rc.Seconds)
	}
	if !m.OK {
		t.Errorf("merged run failed: %v", m.Failures)
	}
	b.Reconnects.NotBack = 1
	b.judge()
	if b.OK {
		t.Error("a phone not back did not fail the run")
	}
}

// TestPhonesComeBackAfterADrop: with -reconnect, phones whose connections
// drop come back to the next edge (a refused one is passed over), keep
// their device, and the texts they sent are all answered.
func TestPhonesComeBackAfterADrop(t *testing.T) {
	g := startNode(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "ws://" + ln.Addr().String() + "/ws"
	ln.Close() // nothing listens there: a refused dial
	cfg := testConfig(g, 6)
	cfg.URLs = []string{dead, g.URL()}
	cfg.Reconnect, cfg.Retry = true, 30*time.Second
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := newRunner(cfg, io.Discard)
	if ok, _ := r.connectAll(ctx, r.devs, r.rep.Connect.Handshake); ok != 6 {
		t.Fatalf("%d of 6 connected (those on the dead edge move on to the live one)", ok)
	}
	for _, d := range r.devs {
		if l := d.link.Load(); l == nil || !r.send(d, l, r.texts, time.Time{}) {
			t.Fatalf("%s: no text sent", d.id)
		}
	}
	for _, d := range r.devs { // the network drops them all, no close frame
		d.link.Load().c.CloseNow()
	}
	for r.stillAway() > 0 || r.held() < 6 {
		if ctx.Err() != nil {
			t.Fatalf("%d of 6 back", r.held())
		}
		sleep(ctx, 20*time.Millisecond)
	}
	for _, d := range r.devs {
		if l := d.link.Load(); l == nil || !r.send(d, l, r.texts, time.Time{}) {
			t.Fatalf("%s: no text sent after the reconnect", d.id)
		}
	}
	r.drain(ctx)
	r.reconnectReport()
	rc := r.rep.Reconnects
	r.closeAll()
	if r.texts.arrived != 12 || r.texts.lost != 0 {
		t.Errorf("texts answered %d, lost %d; want 12 and 0", r.texts.arrived, r.texts.lost)
	}
	if rc.Dropped != 6 || rc.Back != 6 || rc.NotBack != 0 || rc.Ends["lost"] != 6 || rc.Handshake.Count() != 6 || rc.Away.Count() != 6 || rc.Seconds <= 0 {
		t.Errorf("reconnects: %+v, want 6 dropped and back", rc)
	}
	errs := r.errs.snapshot()
	delete(errs, "retried")
	delete(errs, "dial")
	if len(errs) != 0 {
		t.Errorf("errors other than refused dials: %v", errs)
	}
	for _, d := range r.devs {
		if d.url != g.URL() {
			t.Errorf("%s is on %s, want the live edge", d.id, d.url)
		}
	}
}
