package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"
)

const (
	// deliverWorkers bounds the POST /v1/deliver requests in flight: each
	// waits until the phone's edge has written the message.
	deliverWorkers = 32
	// deliverTimeout bounds one request (the router answers within 15 s).
	deliverTimeout = 20 * time.Second
)

// deliveries posts to the router's POST /v1/deliver at DeliverRate for the
// message phase, round-robin over the connected devices, so the time from
// the router to a phone on either edge is measured. A delivery the router
// accepts must arrive; one it refuses is counted as deliver:<status>:<code>.
// With -deliver-ttl the deliveries carry that ttl and go to every device in
// turn, connected or not; a 202 (queued in the outbox) must arrive too.
func (r *runner) deliveries(ctx context.Context) {
	hc := &http.Client{Timeout: deliverTimeout, Transport: &http.Transport{MaxIdleConnsPerHost: deliverWorkers}}
	defer hc.CloseIdleConnections()
	jobs := make(chan *device)
	var wg sync.WaitGroup
	for range deliverWorkers {
		wg.Go(func() {
			for d := range jobs {
				r.deliver(ctx, hc, d)
			}
		})
	}
	d := &r.rep.Deliveries
	start := time.Now()
	next := 0
	sent := 0
	pace(ctx, r.cfg.DeliverRate, r.cfg.Duration, func() bool {
		var dev *device
		if r.cfg.DeliverTTL > 0 { // every device, connected or not: an away one's is queued
			dev = r.devs[next%len(r.devs)]
			next++
		} else if dev, _ = r.pick(&next); dev == nil {
			return false
		}
		select {
		case jobs <- dev:
			sent++
			return true
		case <-ctx.Done():
			return false
		}
	})
	close(jobs)
	wg.Wait()
	took := time.Since(start)
	d.Sent, d.Rate = sent, perSecond(sent, took)
}

// deliver posts one text to dev through the router.
func (r *runner) deliver(ctx context.Context, hc *http.Client, dev *device) {
	seq := r.seq.Add(1)
	now := time.Now()
	req := map[string]any{
		"target": dev.id,
		"id":     "ld-" + strconv.FormatUint(seq, 10),
		"text":   r.text(deliverPrefix, seq, now),
	}
	if r.cfg.DeliverTTL > 0 {
		req["ttl"] = r.cfg.DeliverTTL
	}
	body, _ := json.Marshal(req)
	r.mu.Lock()
	r.dlv.pending[seq] = struct{}{}
	r.lastSend = now
	r.mu.Unlock()
	fail := func(kind string) {
		r.mu.Lock()
		delete(r.dlv.pending, seq)
		r.mu.Unlock()
		r.errs.add(kind)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, r.cfg.DeliverURL+"/v1/deliver", bytes.NewReader(body))
	if err != nil {
		fail("deliver:request")
		return
	}
	hreq.Header.Set("Authorization", "Bearer "+r.cfg.DeliverToken)
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(hreq)
	if err != nil {
		fail("deliver:request")
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e struct {
		Error  string `json:"error"`
		Queued bool   `json:"queued"`
	}
	_ = json.Unmarshal(b, &e) // a body that is not JSON leaves e empty
	switch {
	case resp.StatusCode == http.StatusOK:
	case resp.StatusCode == http.StatusAccepted && r.cfg.DeliverTTL > 0:
		// With a ttl a 202 is kept in the device's outbox: it must arrive
		// once the phone is back.
		if e.Queued {
			r.mu.Lock()
			r.rep.Deliveries.Queued++
			r.mu.Unlock()
		}
	default:
		fail(fmt.Sprintf("deliver:%d:%s", resp.StatusCode, e.Error))
	}
}
