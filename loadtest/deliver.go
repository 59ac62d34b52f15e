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
		dev, _ := r.pick(&next)
		if dev == nil {
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
	body, _ := json.Marshal(map[string]string{
		"target": dev.id,
		"id":     "ld-" + strconv.FormatUint(seq, 10),
		"text":   r.text(deliverPrefix, seq, now),
	})
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
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.cfg.DeliverURL+"/v1/deliver", bytes.NewReader(body))
	if err != nil {
		fail("deliver:request")
		return
	}
	req.Header.Set("Authorization", "Bearer "+r.cfg.DeliverToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		fail("deliver:request")
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(b, &e) // a body that is not JSON leaves e.Error empty
		fail(fmt.Sprintf("deliver:%d:%s", resp.StatusCode, e.Error))
	}
}
