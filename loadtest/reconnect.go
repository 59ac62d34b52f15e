package main

// -reconnect: phones that come back on their own when their connection
// ends, as the SDKs do, so that an edge killed or restarted under them can
// be measured (loadtest/edgekill.sh).

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// reconnects is what the phones' reconnects did; guarded by mu.
type reconnects struct {
	mu                  sync.Mutex
	firstDrop, lastBack time.Time
	dropped, back       int
	ends                map[string]int
}

// drop records that a connection ended without the run asking, how
// (kind: "lost" without a close frame, "close:<code>").
func (x *reconnects) drop(kind string, at time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.firstDrop.IsZero() || at.Before(x.firstDrop) {
		x.firstDrop = at
	}
	x.dropped++
	if x.ends == nil {
		x.ends = map[string]int{}
	}
	x.ends[kind]++
}

// backAt records a phone ready again at at.
func (x *reconnects) backAt(at time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.back++
	if at.After(x.lastBack) {
		x.lastBack = at
	}
}

// balance picks the edge of a phone's next attempt as a round-robin load
// balancer would: the next of urls after the last one it handed out,
// skipping avoid (the edge the phone just lost) unless it is the only one.
func balance(urls []string, turn *atomic.Uint64, avoid string) string {
	for range len(urls) {
		u := urls[(turn.Add(1)-1)%uint64(len(urls))]
		if u != avoid {
			return u
		}
	}
	return urls[0]
}

// resendPause is the SDKs' pause before the n-th resend (n from 1) of texts
// that met internal_error: uniform in [cap/2, cap], cap = min(backoffCap,
// backoffBase·2^(n-1)). rnd nil: math/rand/v2.
func resendPause(n int, rnd func() float64) time.Duration {
	if rnd == nil {
		rnd = rand.Float64
	}
	window := backoffCap
	if n >= 1 && n <= 16 {
		window = min(backoffCap, backoffBase<<(n-1))
	}
	return window/2 + time.Duration(rnd()*float64(window/2))
}

// lostLink handles the end of d's connection l that the run did not ask
// for: with -reconnect d connects again (and true is returned); without, it
// is an error of kind.
func (r *runner) lostLink(d *device, l *link, kind string) bool {
	d.link.CompareAndSwap(l, nil)
	if !r.cfg.Reconnect {
		r.errs.add(kind)
		return false
	}
	r.reconnect(d, kind)
	return true
}

// reconnect brings d back after its connection ended: a pause of the
// SDKs' backoff, then attempts to the next edge in turn, for as long as
// -retry allows. The handshake is timed from its first attempt, the time
// away from the drop.
func (r *runner) reconnect(d *device, kind string) {
	drop := time.Now()
	r.reconn.drop(kind, drop)
	d.away.Store(true)
	d.url = balance(r.cfg.URLs, &r.turn, d.url)
	var b backoff
	sleep(r.quit, b.next(0))
	if r.connect(r.quit, d, r.rep.Reconnects.Handshake) != nil {
		return // still away: counted at the end
	}
	now := time.Now()
	r.rep.Reconnects.Away.Record(now.Sub(drop))
	r.reconn.backAt(now)
	d.away.Store(false)
	if l := d.link.Load(); l != nil {
		r.resend(d, l)
	}
}

// remember keeps the text of seq as unanswered on d, to be sent again on
// d's next connection (-reconnect).
func (d *device) remember(seq uint64, text string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.unanswered == nil {
		d.unanswered = map[uint64]string{}
	}
	d.unanswered[seq] = text
}

// answered forgets seq's text.
func (d *device) answered(seq uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.unanswered, seq)
}

// pendingTexts are d's unanswered texts, oldest first.
func (d *device) pendingTexts() (seqs []uint64, texts []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	seqs = slices.Sorted(func(yield func(uint64) bool) {
		for s := range d.unanswered {
			if !yield(s) {
				return
			}
		}
	})
	for _, s := range seqs {
		texts = append(texts, d.unanswered[s])
	}
	return seqs, texts
}

// resend sends d's unanswered texts again on l with their ids, as the SDKs
// do after a reconnect or an internal_error: the gateway's dedup drops
// those a router already has. It returns how many were written.
func (r *runner) resend(d *device, l *link) int {
	seqs, texts := d.pendingTexts()
	n := 0
	for i, s := range seqs {
		if l.c.Text("m"+strconv.FormatUint(s, 10), texts[i]) != nil {
			break // the connection is gone: its reconnect sends them
		}
		n++
	}
	if n > 0 {
		r.mu.Lock()
		r.lastSend = time.Now()
		r.rep.Reconnects.Resent += n
		r.mu.Unlock()
	}
	return n
}

// resendLater sends d's unanswered texts again after the SDKs' pause, once
// an internal_error said that one of them was not taken (one resend of a
// device at a time; a later error while it waits is covered by it).
func (r *runner) resendLater(d *device) {
	if !d.resending.CompareAndSwap(false, true) {
		return
	}
	n := int(d.resends.Add(1))
	go func() {
		defer d.resending.Store(false)
		sleep(r.quit, resendPause(n, nil))
		if l := d.link.Load(); l != nil && r.quit.Err() == nil {
			r.resend(d, l)
		}
	}()
}

// stillAway counts the phones that dropped and are not back (gave up, or
// still trying when the run ended).
func (r *runner) stillAway() int {
	n := 0
	for _, d := range r.devs {
		if d.away.Load() {
			n++
		}
	}
	return n
}

// reconnectReport copies the reconnects into the report.
func (r *runner) reconnectReport() {
	x, rc := &r.reconn, &r.rep.Reconnects
	x.mu.Lock()
	defer x.mu.Unlock()
	rc.Dropped, rc.Back, rc.Ends = x.dropped, x.back, x.ends
	rc.FirstDrop, rc.LastBack = x.firstDrop, x.lastBack
	rc.NotBack = r.stillAway()
	rc.setSeconds()
}
