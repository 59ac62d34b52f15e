package main

// The scenarios of step mode, each against the gateway and against the
// floor. What an operation is:
//
//	roundtrip  a phone's text → edge → router (demo agent) → edge → its final
//	           answer; on the floor a phone's ping → pong
//	deliver    POST /v1/deliver at the router → the phone's message, phones on
//	           every edge; on the floor a phone's ping → pong
//	deliver-batch
//	           the same deliveries, -batch of them in one POST
//	           /v1/deliver/batch → each phone's message; the floor the same
//	cron       a deliver frame from one cron connection, sent without
//	           waiting for the one before → the phone's message; on the floor
//	           a ping from one connection, pipelined the same way → pong
//	hello      dial → hello → ready on a new connection, closed at once; the
//	           same on the floor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// The scenarios, in the order "all" runs them.
var scenarios = []string{"roundtrip", "deliver", "deliver-batch", "cron", "hello"}

// scenarioWhat describes each scenario's operation, for the report.
var scenarioWhat = map[string][2]string{
	"roundtrip":     {"text → edge → router (demo agent) → edge → final answer", "ping → pong, same phones"},
	"deliver":       {"POST /v1/deliver → router → edge → phone", "ping → pong, same phones"},
	"deliver-batch": {"POST /v1/deliver/batch of -batch deliveries → router → edge → phone", "ping → pong, same phones"},
	"cron":          {"deliver frames pipelined on one cron connection → edge → router → edge → phone", "pings pipelined on one connection → pong"},
	"hello":         {"dial → hello → ready on a new connection, then dropped", "the same"},
}

// phone is one connection held by a pool.
type phone struct {
	id      string
	c       *client.Conn
	closing atomic.Bool
}

// pool is the phones of one target.
type pool struct {
	phones []*phone
	next   atomic.Uint64
	wg     sync.WaitGroup
}

// connectPool connects n phones (device ids lt-<run>-<tag><i>) split in turn
// over urls, 100 handshakes at a time, and hands every frame they receive
// to onFrame; an end the pool did not ask for is noted on tr.
func connectPool(ctx context.Context, cfg stepConfig, urls []string, n int, tag string, tr *tracker, onFrame func(client.Frame)) (*pool, error) {
	p := &pool{phones: make([]*phone, n)}
	var (
		wg    sync.WaitGroup
		next  atomic.Int64
		errMu sync.Mutex
		first error
	)
	for range min(100, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				u := urls[i%len(urls)]
				ph, err := dialPhone(ctx, cfg, u, fmt.Sprintf("lt-%s-%s%d", cfg.RunID, tag, i), sourceFor(i, cfg.Sources, u))
				if err != nil {
					errMu.Lock()
					if first == nil {
						first = fmt.Errorf("phone %d of %d on %s: %w", i+1, n, u, err)
					}
					errMu.Unlock()
					return
				}
				p.phones[i] = ph
				p.wg.Go(func() { consumePhone(ph, tr, onFrame) })
			}
		})
	}
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = ctx.Err()
	}
	if first != nil {
		p.close()
		return nil, first
	}
	return p, nil
}

// dialPhone connects one device and says hello.
func dialPhone(ctx context.Context, cfg stepConfig, url, id string, src netip.Addr) (*phone, error) {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	c, err := client.Dial(ctx, url, client.Options{LocalAddr: src, Timeout: connectTimeout, WriteTimeout: writeTimeout, Buffer: frameBuffer})
	if err != nil {
		return nil, err
	}
	if _, err := c.Hello(ctx, cfg.Token, protocol.Device{ID: id, Name: "Load " + id, Platform: "loadtest", AppVersion: "1"},
		protocol.User{ID: "lt-" + cfg.RunID, Name: "Load test"}); err != nil {
		c.CloseNow()
		return nil, err
	}
	return &phone{id: id, c: c}, nil
}

// consumePhone reads ph's frames until its connection ends.
func consumePhone(ph *phone, tr *tracker, onFrame func(client.Frame)) {
	for {
		f, err := ph.c.Next(context.Background())
		if f.IsZero() {
			if !ph.closing.Load() {
				tr.note("lost")
			}
			return
		}
		if err != nil {
			tr.note("bad_frame_from_server")
			continue
		}
		if ci := f.Close(); ci != nil {
			if !ph.closing.Swap(true) {
				tr.note(fmt.Sprintf("close:%d", ci.Code))
			}
			ph.c.CloseNow()
			return
		}
		onFrame(f)
	}
}

// pick is the next phone, round-robin.
func (p *pool) pick() *phone {
	return p.phones[(p.next.Add(1)-1)%uint64(len(p.phones))]
}

// close closes every phone with a closing handshake and waits for their
// consumers.
func (p *pool) close() {
	var wg sync.WaitGroup
	sem := make(chan struct{}, closeConcurrency)
	for _, ph := range p.phones {
		if ph == nil {
			continue
		}
		ph.closing.Store(true)
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ph.c.Close()
		})
	}
	wg.Wait()
	p.wg.Wait()
}

// opText is what an operation carries: the run id and its number. Answers
// and deliveries that carry another run's id are not this run's.
func opText(prefix, run string, seq uint64) string {
	return prefix + run + " " + strconv.FormatUint(seq, 10)
}

// opSeq reads the operation number out of s, which starts with prefix and
// the run id; ok is false for anything else.
func opSeq(s, prefix, run string) (uint64, bool) {
	rest, ok := strings.CutPrefix(s, prefix+run+" ")
	if !ok {
		return 0, false
	}
	seq, err := strconv.ParseUint(rest, 10, 64)
	return seq, err == nil
}

// gatewayFrame completes the operation a phone's frame answers: the demo
// agent's final answer or a delivered message; an error frame is noted.
func gatewayFrame(tr *tracker, run string) func(client.Frame) {
	return func(f client.Frame) {
		switch f.T() {
		case protocol.TypeMessage:
			if !f.Bool("final") {
				return
			}
			now := time.Now()
			text := f.Str("text")
			if seq, ok := opSeq(text, answerPrefix, run); ok {
				tr.done(seq, now)
			} else if seq, ok := opSeq(text, deliverPrefix, run); ok {
				tr.done(seq, now)
			}
		case protocol.TypeError:
			tr.note("error:" + f.Str("code"))
		}
	}
}

// floorFrame completes the operation a pong answers.
func floorFrame(tr *tracker, run string) func(client.Frame) {
	return func(f client.Frame) {
		switch f.T() {
		case protocol.TypePong:
			if seq, ok := opSeq(f.Str("ts"), "", run); ok {
				tr.done(seq, time.Now())
			}
		case protocol.TypeError:
			tr.note("error:" + f.Str("code"))
		}
	}
}

// target is one side of a scenario, ready to offer operations.
type target struct {
	offer offerFunc
	close func()
}

// prepare connects what scenario needs on the gateway (floor false, the
// -url edges) or on the floor (its URL).
func prepare(ctx context.Context, cfg stepConfig, scenario string, floor bool, urls []string, tr *tracker) (*target, error) {
	onFrame := gatewayFrame(tr, cfg.RunID)
	if floor {
		onFrame = floorFrame(tr, cfg.RunID)
	}
	tag := scenario[:1]
	if floor {
		tag = "f" + tag
	}
	switch {
	case scenario == "hello":
		return helloTarget(ctx, cfg, urls, tag, tr), nil

	case floor && scenario == "cron":
		p, err := connectPool(ctx, cfg, urls, 1, tag, tr, onFrame)
		if err != nil {
			return nil, err
		}
		return &target{offer: pingOffer(cfg, p, tr), close: p.close}, nil
	}

	p, err := connectPool(ctx, cfg, urls, cfg.Phones, tag, tr, onFrame)
	if err != nil {
		return nil, err
	}
	switch {
	case floor:
		return &target{offer: pingOffer(cfg, p, tr), close: p.close}, nil
	case scenario == "roundtrip":
		return &target{offer: textOffer(cfg, p, tr), close: p.close}, nil
	case scenario == "deliver":
		offer, stop := apiOffer(ctx, cfg, p, tr)
		return &target{offer: offer, close: func() { stop(); p.close() }}, nil
	case scenario == "deliver-batch":
		offer, stop := batchOffer(ctx, cfg, p, tr)
		return &target{offer: offer, close: func() { stop(); p.close() }}, nil
	default: // cron
		cron, err := dialPhone(ctx, cfg, urls[0], "lt-"+cfg.RunID+"-cron", netip.Addr{})
		if err != nil {
			p.close()
			return nil, fmt.Errorf("the cron connection: %w", err)
		}
		cp := &pool{phones: []*phone{cron}}
		cp.wg.Go(func() {
			consumePhone(cron, tr, func(f client.Frame) {
				if f.T() == protocol.TypeError {
					tr.note("cron:error:" + f.Str("code"))
				}
			})
		})
		return &target{offer: cronOffer(cfg, cron, p, tr), close: func() { cp.close(); p.close() }}, nil
	}
}

// textOffer sends a text on the next phone; the demo agent's final answer
// completes it.
func textOffer(cfg stepConfig, p *pool, tr *tracker) offerFunc {
	return func(seq uint64, _ time.Time) {
		ph := p.pick()
		if err := ph.c.Text("m"+strconv.FormatUint(seq, 10), opText(msgPrefix, cfg.RunID, seq)); err != nil {
			tr.fail(seq, "write")
		}
	}
}

// pingOffer sends a ping on the next phone; its pong completes it.
func pingOffer(cfg stepConfig, p *pool, tr *tracker) offerFunc {
	return func(seq uint64, _ time.Time) {
		if err := p.pick().c.Ping(opText("", cfg.RunID, seq)); err != nil {
			tr.fail(seq, "write")
		}
	}
}

// cronOffer sends a deliver frame to the next phone on the cron
// connection, without waiting for the ones before; the phone's message
// completes it.
func cronOffer(cfg stepConfig, cron *phone, p *pool, tr *tracker) offerFunc {
	return func(seq uint64, _ time.Time) {
		to := p.pick()
		if err := cron.c.Deliver("ld-"+strconv.FormatUint(seq, 10), to.id, opText(deliverPrefix, cfg.RunID, seq), nil); err != nil {
			tr.fail(seq, "write")
		}
	}
}

// apiOffer posts a delivery to the next phone through the router's API,
// at most cfg.InFlight at once (an operation beyond that fails as
// client_busy: the load generator cannot offer it); the phone's message
// completes it. stop waits for the requests in flight.
func apiOffer(ctx context.Context, cfg stepConfig, p *pool, tr *tracker) (offer offerFunc, stop func()) {
	hc := &http.Client{Timeout: deliverTimeout, Transport: &http.Transport{
		MaxIdleConns: cfg.InFlight, MaxIdleConnsPerHost: cfg.InFlight, IdleConnTimeout: time.Minute,
	}}
	sem := make(chan struct{}, cfg.InFlight)
	var wg sync.WaitGroup
	offer = func(seq uint64, _ time.Time) {
		select {
		case sem <- struct{}{}:
		default:
			tr.fail(seq, "client_busy")
			return
		}
		to := p.pick()
		wg.Go(func() {
			defer func() { <-sem }()
			if kind := postDeliver(ctx, hc, cfg, to.id, seq); kind != "" {
				tr.fail(seq, kind)
			}
		})
	}
	stop = func() {
		wg.Wait()
		hc.CloseIdleConnections()
	}
	return offer, stop
}

// batchFlush is how long an offered delivery waits for its batch to fill.
const batchFlush = 5 * time.Millisecond

// batchOffer gathers the deliveries offered, each to the next phone, and
// posts them cfg.Batch at a time (or what gathered in batchFlush) to the
// router's POST /v1/deliver/batch, at most cfg.InFlight requests at once;
// each phone's message completes its delivery, and an item the router
// answers with another status than 200 fails it. stop posts what is left
// and waits for the requests in flight.
func batchOffer(ctx context.Context, cfg stepConfig, p *pool, tr *tracker) (offer offerFunc, stop func()) {
	hc := &http.Client{Timeout: deliverTimeout, Transport: &http.Transport{
		MaxIdleConns: cfg.InFlight, MaxIdleConnsPerHost: cfg.InFlight, IdleConnTimeout: time.Minute,
	}}
	type item struct {
		seq uint64
		to  string
	}
	sem := make(chan struct{}, cfg.InFlight)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		batch []item
		timer *time.Timer
	)
	post := func(items []item) {
		select {
		case sem <- struct{}{}:
		default:
			for _, it := range items {
				tr.fail(it.seq, "client_busy")
			}
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			seqs := make([]uint64, len(items))
			devs := make([]string, len(items))
			for i, it := range items {
				seqs[i], devs[i] = it.seq, it.to
			}
			for i, kind := range postBatch(ctx, hc, cfg, devs, seqs) {
				if kind != "" {
					tr.fail(seqs[i], kind)
				}
			}
		})
	}
	flush := func() {
		mu.Lock()
		items := batch
		batch = nil
		mu.Unlock()
		if len(items) > 0 {
			post(items)
		}
	}
	offer = func(seq uint64, _ time.Time) {
		to := p.pick()
		mu.Lock()
		batch = append(batch, item{seq, to.id})
		var full []item
		switch {
		case len(batch) >= cfg.Batch:
			full, batch = batch, nil
		case len(batch) == 1:
			if timer == nil {
				timer = time.AfterFunc(batchFlush, flush)
			} else {
				timer.Reset(batchFlush)
			}
		}
		mu.Unlock()
		if full != nil {
			post(full)
		}
	}
	stop = func() {
		flush()
		wg.Wait()
		hc.CloseIdleConnections()
	}
	return offer, stop
}

// postBatch posts the deliveries of seqs to devs in one POST
// /v1/deliver/batch; it returns, per delivery, "" when the router
// answered it 200, else the kind of failure.
func postBatch(ctx context.Context, hc *http.Client, cfg stepConfig, devs []string, seqs []uint64) []string {
	kinds := make([]string, len(seqs))
	all := func(kind string) []string {
		for i := range kinds {
			kinds[i] = kind
		}
		return kinds
	}
	items := make([]map[string]string, len(seqs))
	for i, seq := range seqs {
		items[i] = map[string]string{
			"target": devs[i],
			"id":     "ld-" + strconv.FormatUint(seq, 10),
			"text":   opText(deliverPrefix, cfg.RunID, seq),
		}
	}
	body, _ := json.Marshal(map[string]any{"deliveries": items})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.DeliverURL+"/v1/deliver/batch", bytes.NewReader(body))
	if err != nil {
		return all("batch:request")
	}
	req.Header.Set("Authorization", "Bearer "+cfg.DeliverToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return all("batch:request")
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	var r struct {
		Error   string `json:"error"`
		Results []struct {
			Status int `json:"status"`
			Error  *struct {
				Error string `json:"error"`
			} `json:"error"`
		} `json:"results"`
	}
	_ = json.Unmarshal(b, &r) // checked below
	if resp.StatusCode != http.StatusOK || len(r.Results) != len(seqs) {
		return all(fmt.Sprintf("batch:%d:%s", resp.StatusCode, r.Error))
	}
	for i, res := range r.Results {
		if res.Status != http.StatusOK {
			code := ""
			if res.Error != nil {
				code = res.Error.Error
			}
			kinds[i] = fmt.Sprintf("deliver:%d:%s", res.Status, code)
		}
	}
	return kinds
}

// postDeliver posts one delivery; it returns "" when the router answered
// 200, else the kind of failure.
func postDeliver(ctx context.Context, hc *http.Client, cfg stepConfig, device string, seq uint64) string {
	body, _ := json.Marshal(map[string]string{
		"target": device,
		"id":     "ld-" + strconv.FormatUint(seq, 10),
		"text":   opText(deliverPrefix, cfg.RunID, seq),
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.DeliverURL+"/v1/deliver", bytes.NewReader(body))
	if err != nil {
		return "deliver:request"
	}
	req.Header.Set("Authorization", "Bearer "+cfg.DeliverToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return "deliver:request"
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(b, &e) // a body that is not an error frame leaves e empty
		return fmt.Sprintf("deliver:%d:%s", resp.StatusCode, e.Error)
	}
	return ""
}

// helloTarget opens a new connection per operation, at most cfg.InFlight
// at once, says hello as a new device and drops the connection once ready
// has come; ready completes the operation.
func helloTarget(ctx context.Context, cfg stepConfig, urls []string, tag string, tr *tracker) *target {
	sem := make(chan struct{}, cfg.InFlight)
	var wg sync.WaitGroup
	offer := func(seq uint64, _ time.Time) {
		select {
		case sem <- struct{}{}:
		default:
			tr.fail(seq, "client_busy")
			return
		}
		i := int(seq)
		u := urls[i%len(urls)]
		wg.Go(func() {
			defer func() { <-sem }()
			ph, err := dialPhone(ctx, cfg, u, fmt.Sprintf("lt-%s-%s%d", cfg.RunID, tag, seq), sourceFor(i, cfg.Sources, u))
			if err != nil {
				var se *client.ServerError
				var he *client.HandshakeError
				switch {
				case errors.As(err, &se):
					tr.fail(seq, "error:"+string(se.Code))
				case errors.As(err, &he):
					tr.fail(seq, fmt.Sprintf("dial:http %d", he.Status))
				default:
					tr.fail(seq, "dial")
				}
				return
			}
			tr.done(seq, time.Now())
			ph.c.CloseNow()
		})
	}
	return &target{offer: offer, close: wg.Wait}
}
