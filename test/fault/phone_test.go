//go:build unix

package fault

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// recorder keeps the history of a run; every phone and cron write to it.
type recorder struct {
	mu sync.Mutex
	h  History
}

func (r *recorder) text(t Text) {
	r.mu.Lock()
	r.h.Texts = append(r.h.Texts, t)
	r.mu.Unlock()
}

func (r *recorder) delivery(d Delivery) {
	r.mu.Lock()
	r.h.Deliveries = append(r.h.Deliveries, d)
	r.mu.Unlock()
}

func (r *recorder) frame(f Frame) {
	r.mu.Lock()
	r.h.Frames = append(r.h.Frames, f)
	r.mu.Unlock()
}

func (r *recorder) history() History {
	r.mu.Lock()
	defer r.mu.Unlock()
	return History{
		Texts:      append([]Text(nil), r.h.Texts...),
		Deliveries: append([]Delivery(nil), r.h.Deliveries...),
		Frames:     append([]Frame(nil), r.h.Frames...),
		Wire:       r.h.Wire, // written before the run, read only since
	}
}

// Timings of a phone.
const (
	pingEvery = time.Second
	// patience is how long a phone waits for a pong before it gives the
	// socket up and connects elsewhere.
	patience = 3 * time.Second
	// resendEvery is how often, in the quiet phase, a phone resends what
	// is still unanswered.
	resendEvery = 5 * time.Second
)

// phone behaves like the app: it connects to a random live edge, sends
// texts with unique ids, acks every message it displays, and when the
// socket closes, fails or stays silent past its patience, reconnects to a
// live edge and resends every unanswered text with the same id. An error
// frame (internal_error: "send again") makes it resend too. Every 5 to 20 s
// it closes its socket and connects again (the app in the background and
// back), so every edge keeps phones, also one restarted a moment ago; at
// one such moment in three (while texts are sent) it sleeps instead: it
// sends a text or two, closes its socket cleanly or abandons it (the
// operating system suspended the app: the socket stays open, unread), and
// stays away for a stretch of the run (sleepFor) while the agent's answers
// and cron's deliveries with a ttl go to its outbox; then it connects to a
// random edge.
type phone struct {
	// dev names the phone in the history; wire is the device id of its
	// hello, key its device key in the store (all three the same for the
	// legacy owner's phones), token its hello's token.
	dev, wire, key, token string

	w    *world
	rec  *recorder
	rng  *mrand.Rand
	sent int // texts sent so far
	conn int // connections opened so far
	// gaveUp counts the sockets given up for want of a pong.
	gaveUp int
	// sleeps counts the stretches it slept; sleepFor is the longest one.
	sleeps   int
	sleepFor time.Duration
	// asleep: the socket it abandoned when it went to sleep, closed when
	// it wakes; the stretch it sleeps.
	abandoned *client.Conn
	stretch   time.Duration

	mu         sync.Mutex
	unanswered map[string]string // id -> text
	order      []string          // ids of unanswered, in sending order

	// The silent-network fault (world.silence): an order comes in on
	// silentReq; the phone leaves its socket (goingSilent), connects
	// through a blackhole, gives that socket up, and reports on the order
	// once ready on another edge (avoid: the blackholed edge's URL).
	silentReq   chan *silentOrder
	acked       atomic.Bool // it sent an ack (FAULT_SILENT_ANY)
	goingSilent *silentOrder
	avoid       string
	report      *silentOrder
	result      silentResult
}

// silentOrder asks a phone for the silent-network fault.
type silentOrder struct {
	done chan silentResult
}

// silentResult is how the fault went for the phone.
type silentResult struct {
	ok   bool // ready came through the blackhole, then silence, then ready on another edge
	hole *blackhole
	what string
}

// sending says whether a phone still sends new texts (the fault phase); it
// stops sending but keeps resending in the quiet phase.
type phase struct {
	mu      sync.Mutex
	sending bool
}

func (p *phase) isSending() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sending
}

func (p *phase) quiet() {
	p.mu.Lock()
	p.sending = false
	p.mu.Unlock()
}

func (ph *phone) pending() int {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	return len(ph.unanswered)
}

// answered marks the text text answered when it is one of this phone's.
func (ph *phone) answered(text string) {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	for i, id := range ph.order {
		if EchoPrefix+ph.unanswered[id] == text {
			delete(ph.unanswered, id)
			ph.order = append(ph.order[:i], ph.order[i+1:]...)
			return
		}
	}
}

// resendAll sends every unanswered text again, in order.
func (ph *phone) resendAll(c *client.Conn) error {
	ph.mu.Lock()
	type pair struct{ id, text string }
	var all []pair
	for _, id := range ph.order {
		all = append(all, pair{id, ph.unanswered[id]})
	}
	ph.mu.Unlock()
	for _, p := range all {
		if err := c.Text(p.id, p.text); err != nil {
			return err
		}
	}
	return nil
}

// newText sends a new text.
func (ph *phone) newText(c *client.Conn) error {
	ph.sent++
	id := fmt.Sprintf("%s-t%d", ph.dev, ph.sent)
	text := fmt.Sprintf("%s t%d", ph.dev, ph.sent)
	ph.mu.Lock()
	ph.unanswered[id] = text
	ph.order = append(ph.order, id)
	ph.mu.Unlock()
	ph.rec.text(Text{Device: ph.dev, ID: id, Text: text})
	return c.Text(id, text)
}

// run connects again and again until ctx ends.
func (ph *phone) run(ctx context.Context, ph2 *phase) {
	defer func() {
		if o := ph.goingSilent; o != nil {
			o.done <- silentResult{what: "the run ended first"}
		}
		if ph.report != nil {
			ph.result.ok = false
			ph.result.what += "; the run ended before ready on another edge"
			ph.report.done <- ph.result
		}
	}()
	for ctx.Err() == nil {
		if o := ph.goingSilent; o != nil {
			ph.goingSilent = nil
			ph.goSilent(ctx, ph2, o)
			continue
		}
		url := ph.w.edgeURLExcept(ph.rng, ph.avoid)
		if url == "" {
			sleepCtx(ctx, 200*time.Millisecond)
			continue
		}
		err := ph.session(ctx, url, ph2)
		if errors.Is(err, errNoPong) {
			ph.gaveUp++
		}
		if errors.Is(err, errAsleep) {
			sleepCtx(ctx, ph.stretch) // asleep: the time the test is about
			if ph.abandoned != nil {
				ph.abandoned.CloseNow()
				ph.abandoned = nil
			}
			continue
		}
		if err != nil && !errors.Is(err, errSilenced) {
			sleepCtx(ctx, time.Duration(100+ph.rng.IntN(400))*time.Millisecond)
		}
	}
}

var (
	errNoPong   = errors.New("no pong: giving the socket up")
	errSilenced = errors.New("left the socket for the silent-network fault")
	errAsleep   = errors.New("asleep")
)

// sleep is the phone going to sleep at the end of a session: a text or two
// whose answers will find it gone, then the socket closed cleanly or left
// open and unread, and errAsleep for run, which waits out the stretch.
func (ph *phone) sleep(c *client.Conn) error {
	for range 1 + ph.rng.IntN(2) {
		if err := ph.newText(c); err != nil {
			return err
		}
	}
	ph.sleeps++
	ph.stretch = sleepMin + time.Duration(ph.rng.Int64N(int64(ph.sleepFor-sleepMin)+1))
	if ph.rng.IntN(2) == 0 {
		c.Close()
	} else {
		ph.abandoned = c // session's deferred CloseNow must not close it
	}
	return errAsleep
}

// sleepMin is the shortest a phone sleeps: longer than the edge's 10 s
// wait for an ack, so that what was written to an abandoned socket is
// kept before the phone wakes.
const sleepMin = 12 * time.Second

// goSilent is the phone's part of the silent-network fault, once it left
// its socket with texts unanswered: it waits until their answers are in
// its outbox, connects to a live edge through a blackhole, and, once it
// gave that socket up for want of a pong, leaves run to connect to another
// edge and report there.
func (ph *phone) goSilent(ctx context.Context, ph2 *phase, o *silentOrder) {
	// Not fatal when it never comes (the answers may have reached the
	// socket it left): silent= counts only what went through.
	outbox := testsvc.Eventually(5*time.Second, func() bool { return ph.w.hasOutbox(ph.key) })
	edge := ""
	for ctx.Err() == nil {
		if edge = ph.w.edgeURL(ph.rng); edge != "" {
			break
		}
		sleepCtx(ctx, 200*time.Millisecond) // no edge is up: wait for one
	}
	u, err := url.Parse(edge)
	if err != nil || ctx.Err() != nil {
		o.done <- silentResult{what: fmt.Sprintf("no edge: %v", err)}
		return
	}
	hole, err := newBlackhole(u.Host)
	if err != nil {
		o.done <- silentResult{what: "blackhole: " + err.Error()}
		return
	}
	u.Host = hole.addr()
	err = ph.session(ctx, u.String(), ph2)
	if errors.Is(err, errNoPong) {
		ph.gaveUp++
	}
	ph.result = silentResult{hole: hole, ok: hole.silent() && errors.Is(err, errNoPong),
		what: fmt.Sprintf("outbox before=%v, through a blackhole to %s: %v", outbox, edge, err)}
	ph.avoid, ph.report = edge, o
}

// session is one connection: hello, resend, then texts, pings and frames
// until the socket ends or its patience does.
func (ph *phone) session(ctx context.Context, url string, ph2 *phase) error {
	dctx, cancel := context.WithTimeout(ctx, patience)
	defer cancel()
	c, err := client.Dial(dctx, url, client.Options{Timeout: patience, WriteTimeout: patience})
	if err != nil {
		return err
	}
	defer func() {
		if ph.abandoned != c {
			c.CloseNow()
		}
	}()
	ready, err := c.Hello(dctx, ph.token, protocol.Device{ID: ph.wire, Name: "Phone " + ph.wire, Platform: "android", AppVersion: "1.0.0"},
		protocol.User{ID: "u-" + ph.dev, Name: "Owner"})
	if err != nil {
		return err
	}
	ph.conn++
	ph.rec.frame(Frame{Device: ph.dev, Conn: ph.conn, T: ready.T(), Session: ready.Str("session")})
	if o := ph.report; o != nil {
		ph.report, ph.avoid = nil, ""
		ph.result.what += fmt.Sprintf("; ready again on %s", url)
		o.done <- ph.result
	}
	if err := ph.resendAll(c); err != nil {
		return err
	}
	now := time.Now()
	lastPong, nextPing, lastResend := now, now.Add(pingEvery), now
	nextText := now.Add(time.Duration(ph.rng.IntN(2000)) * time.Millisecond)
	var resendAt time.Time
	pings := 0
	// The app goes to the background now and then: the socket closes, and
	// the next one goes to any edge.
	leave := now.Add(time.Duration(5000+ph.rng.IntN(15000)) * time.Millisecond)
	for ctx.Err() == nil {
		select {
		case o := <-ph.silentReq:
			// A few texts whose answers will find the phone gone, then
			// away: the answers wait in the outbox.
			for range 3 {
				if err := ph.newText(c); err != nil {
					o.done <- silentResult{what: "sending before leaving: " + err.Error()}
					return err
				}
			}
			c.Close()
			ph.goingSilent = o
			return errSilenced
		default:
		}
		rctx, rcancel := context.WithTimeout(ctx, 100*time.Millisecond)
		f, err := c.Next(rctx)
		rcancel()
		switch {
		case err == nil:
			if ci := f.Close(); ci != nil {
				return errors.New("closed: " + ci.String())
			}
			rf := Frame{Device: ph.dev, Conn: ph.conn, T: f.T(), ID: f.Str("id"), Text: f.Str("text"), Final: f.Bool("final"), Session: f.Str("session")}
			if rf.T == protocol.TypeError {
				rf.Text = f.Str("code") + ": " + f.Str("message")
			}
			ph.rec.frame(rf)
			switch f.T() {
			case protocol.TypePong:
				lastPong = time.Now()
			case protocol.TypeMessage, protocol.TypeMedia:
				if f.Bool("final") {
					ph.answered(f.Str("text"))
					// Displayed: ack it, as the app does.
					if err := c.Ack(f.Str("id")); err != nil {
						return err
					}
					ph.acked.Store(true)
				}
			case protocol.TypeError:
				if f.Str("code") == string(protocol.CodeInternalError) && resendAt.IsZero() {
					resendAt = time.Now().Add(500 * time.Millisecond)
				}
			}
		case rctx.Err() != nil && ctx.Err() == nil:
			// No frame for a moment.
		default:
			return err
		}
		now := time.Now()
		if now.After(leave) {
			if ph.sleepFor > 0 && ph2.isSending() && ph.rng.IntN(3) == 0 {
				return ph.sleep(c)
			}
			c.Close()
			return nil
		}
		if now.Sub(lastPong) > patience {
			return errNoPong
		}
		if now.After(nextPing) {
			pings++
			if err := c.Ping(strconv.Itoa(pings)); err != nil {
				return err
			}
			nextPing = now.Add(pingEvery)
		}
		sending := ph2.isSending()
		if sending && now.After(nextText) {
			if err := ph.newText(c); err != nil {
				return err
			}
			nextText = now.Add(time.Duration(500+ph.rng.IntN(2000)) * time.Millisecond)
		}
		if (!resendAt.IsZero() && now.After(resendAt)) || (!sending && now.Sub(lastResend) > resendEvery) {
			resendAt, lastResend = time.Time{}, now
			if err := ph.resendAll(c); err != nil {
				return err
			}
		}
	}
	return ctx.Err()
}

// target is a phone as cron names it: by its wire id, with its owner's
// deliver key.
type target struct{ dev, wire, deliver string }

// cron delivers texts to random phones through a random live router, as
// Hermes's cron does, until ctx ends. Half its deliveries carry a ttl of
// 10 minutes: one to a phone that sleeps is queued (202 {"queued":true})
// and must reach the phone when it wakes.
func cron(ctx context.Context, w *world, rec *recorder, rng *mrand.Rand, targets []target, n *atomic.Int64) {
	hc := &http.Client{Timeout: 20 * time.Second}
	for ctx.Err() == nil {
		sleepCtx(ctx, time.Duration(50+rng.IntN(150))*time.Millisecond)
		url := w.routerURL(rng)
		if url == "" || ctx.Err() != nil {
			continue
		}
		to := targets[rng.IntN(len(targets))]
		id := fmt.Sprintf("%s.d%d", to.dev, n.Add(1))
		d := Delivery{Device: to.dev, ID: id, Text: "cron " + id}
		// "wait":"ack": 200 only once the phone acked it (it has it); 202
		// when written but not acked in time (with a ttl: kept, queued).
		req := map[string]any{"target": protocol.Session(to.wire), "id": id, "text": d.Text, "wait": "ack"}
		if rng.IntN(2) == 0 {
			req["ttl"] = 600
		}
		d.Status, d.Queued = deliver(hc, url, to.deliver, req)
		rec.delivery(d)
	}
}

// deliver is one POST /v1/deliver: the status (0 when the request failed)
// and whether the answer says queued.
func deliver(hc *http.Client, url, token string, req map[string]any) (int, bool) {
	body, _ := json.Marshal(req)
	hreq, _ := http.NewRequest(http.MethodPost, url+"/v1/deliver", bytes.NewReader(body))
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(hreq)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	var answer struct {
		Queued bool `json:"queued"`
	}
	json.NewDecoder(resp.Body).Decode(&answer) //nolint:errcheck // an answer without a body is not queued
	return resp.StatusCode, answer.Queued
}

// flood is the flooding owner's deliver key filling its outbox share:
// deliveries of floodBytes with a ttl to floodDevices made-up devices that
// never connect, 40 a second (440 KB/s: the flood is the bytes, not the
// rate) through a random live router, until ctx ends. It counts the ones
// queued.
func flood(ctx context.Context, w *world, rng *mrand.Rand, o owner, queued *atomic.Int64) {
	hc := &http.Client{Timeout: 20 * time.Second}
	text := strings.Repeat("f", floodBytes)
	for i := 0; ctx.Err() == nil; i++ {
		sleepCtx(ctx, 25*time.Millisecond)
		url := w.routerURL(rng)
		if url == "" {
			sleepCtx(ctx, 200*time.Millisecond) // no router is up: wait for one
			continue
		}
		req := map[string]any{"target": protocol.Session(fmt.Sprintf("flood-%d", i%floodDevices)), "id": fmt.Sprintf("flood.%d", i), "text": text, "ttl": 600}
		if status, q := deliver(hc, url, o.deliver, req); status == http.StatusAccepted && q {
			queued.Add(1)
		}
	}
}

// sleepCtx waits d or until ctx ends: the pace of a phone or of cron, not a
// synchronisation.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
