package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

const (
	// connectTimeout bounds one dial, WebSocket handshake and hello.
	connectTimeout = 15 * time.Second
	// writeTimeout bounds one frame written to a server.
	writeTimeout = 10 * time.Second
	// frameBuffer is how many received frames wait for a connection's
	// consumer (the client's default of 1,024 costs 8 KiB per connection).
	frameBuffer = 64
	// closeConcurrency bounds the closing handshakes at the end of a run.
	closeConcurrency = 200
	// runSlack is what a run may take beyond its soak and message phase
	// (connecting, waiting for answers, the storm, closing) before it is
	// cut short.
	runSlack = 10 * time.Minute
)

// The texts a run sends. The demo agent answers a text with its final edit
// "You said: <text>"; a delivery arrives as it was sent. Both carry the run
// id, a sequence number and the send time in Unix nanoseconds.
const (
	msgPrefix     = "lt "
	answerPrefix  = "You said: " + msgPrefix
	deliverPrefix = "ld "
)

// runner is one run: its devices and what it counts.
type runner struct {
	cfg      Config
	progress io.Writer
	logMu    sync.Mutex // one line at a time on progress
	rep      *Report
	errs     errCounter
	devs     []*device
	seq      atomic.Uint64

	// texts of the message phase, texts after the storm, and deliveries;
	// guarded by mu, as is lastSend.
	mu                     sync.Mutex
	texts, stormTexts, dlv *flow
	lastSend               time.Time
	consumers              sync.WaitGroup

	// With -reconnect: what the reconnects did, the load balancer's turn,
	// and quit, which ends the reconnects when the run closes.
	reconn reconnects
	turn   atomic.Uint64
	quit   context.Context
	stop   context.CancelFunc
}

// flow is one kind of traffic whose arrival is awaited: what was sent and
// has not arrived yet, what arrived, what was given up as lost.
type flow struct {
	pending map[uint64]struct{}
	arrived int
	lost    int
	latency *Histogram // from the timestamp inside the text to the arrival
}

func newFlow(h *Histogram) *flow { return &flow{pending: map[uint64]struct{}{}, latency: h} }

// device is one phone: its id, the edge it talks to and its current
// connection (nil while it has none).
type device struct {
	id   string
	url  string // changed only by whoever connects the device
	src  netip.Addr
	link atomic.Pointer[link]
	// texts of the message phase sent on this device and not answered yet
	inFlight atomic.Int32

	// With -reconnect: the texts not answered yet by sequence number
	// (guarded by mu), sent again on the next connection; whether the
	// phone is away after a drop; a resend waiting and how many there were.
	mu         sync.Mutex
	unanswered map[uint64]string
	away       atomic.Bool
	resending  atomic.Bool
	resends    atomic.Int32
}

// link is one connection of a device.
type link struct {
	c *client.Conn
	// closing is set before the run closes the connection itself, so its
	// end is not counted as an error.
	closing atomic.Bool
}

func newRunner(cfg Config, progress io.Writer) *runner {
	r := &runner{cfg: cfg, progress: progress, rep: newReport()}
	r.quit, r.stop = context.WithCancel(context.Background())
	r.texts = newFlow(r.rep.Messages.Latency)
	r.stormTexts = newFlow(r.rep.Storm.Latency)
	r.dlv = newFlow(r.rep.Deliveries.Latency)
	for i := range cfg.Conns {
		u := cfg.URLs[i%len(cfg.URLs)]
		r.devs = append(r.devs, &device{id: fmt.Sprintf("lt-%s-%d", cfg.RunID, i), url: u, src: cfg.sourceAddr(i, u)})
	}
	return r
}

func (r *runner) logf(format string, a ...any) {
	r.logMu.Lock()
	defer r.logMu.Unlock()
	fmt.Fprintf(r.progress, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, a...)...)
}

// run connects, soaks, sends messages (and deliveries), runs the storm and
// closes, and returns the judged report. An error means the run could not
// start; what goes wrong during it is in the report.
func run(ctx context.Context, cfg Config, progress io.Writer) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := checkFiles(cfg.Conns); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Soak+cfg.Duration+runSlack)
	defer cancel()
	r := newRunner(cfg, progress)
	rep := r.rep
	rep.Runs, rep.Started, rep.Targets = []string{cfg.RunID}, time.Now(), cfg.URLs
	s := &rep.Settings
	s.Conns, s.SoakSec, s.DurationSec, s.Rate, s.Storm = cfg.Conns, cfg.Soak.Seconds(), cfg.Duration.Seconds(), cfg.Rate, cfg.Storm
	s.Pace = cfg.Pace
	if cfg.DeliverURL != "" {
		s.DeliverRate = cfg.DeliverRate
	}
	rep.RequireMetrics = cfg.RequireMetrics

	rep.Server = append(rep.Server, r.scrapeAll(ctx, "start")...)
	r.logf("connecting %d devices (run %s) to %s", cfg.Conns, cfg.RunID, strings.Join(cfg.URLs, ", "))
	ok, took := r.connectAll(ctx, r.devs, rep.Connect.Handshake)
	c := &rep.Connect
	c.Wanted, c.Failed, c.Seconds, c.Rate = cfg.Conns, cfg.Conns-ok, took.Seconds(), perSecond(ok, took)
	r.logf("%d connected in %.2fs (%.0f/s); holding them idle for %s", ok, took.Seconds(), c.Rate, cfg.Soak)

	sleep(ctx, cfg.Soak)
	c.Held = r.held()
	rep.Server = append(rep.Server, r.scrapeAll(ctx, "idle")...)

	r.logf("%d held; sending %g messages/s for %s", c.Held, cfg.Rate, cfg.Duration)
	r.messagePhase(ctx)
	r.drain(ctx)

	if cfg.Storm > 0 && ctx.Err() == nil {
		r.storm(ctx)
	}

	rep.Held = r.held()
	if cfg.Reconnect {
		r.reconnectReport()
	}
	rep.Server = append(rep.Server, r.scrapeAll(ctx, "end")...)
	r.closeAll()
	r.mu.Lock()
	rep.Messages.Answered, rep.Messages.Lost = r.texts.arrived, r.texts.lost
	rep.Storm.Answered, rep.Storm.Lost = r.stormTexts.arrived, r.stormTexts.lost
	rep.Deliveries.Received, rep.Deliveries.Lost = r.dlv.arrived, r.dlv.lost
	r.mu.Unlock()
	rep.Errors = r.errs.snapshot()
	rep.judge()
	return rep, nil
}

func perSecond(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// held counts the devices that have a connection.
func (r *runner) held() int {
	n := 0
	for _, d := range r.devs {
		if d.link.Load() != nil {
			n++
		}
	}
	return n
}

// connectAll connects devs, DialConcurrency at a time and at most DialRate
// per second, recording each handshake in h. It returns how many connected
// and how long it took until the last one did.
func (r *runner) connectAll(ctx context.Context, devs []*device, h *Histogram) (int, time.Duration) {
	var (
		wg   sync.WaitGroup
		ok   atomic.Int64
		last atomic.Int64 // nanoseconds from start to the last success
		next atomic.Int64
	)
	start := time.Now()
	for range min(r.cfg.DialConcurrency, len(devs)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(devs) || ctx.Err() != nil {
					return
				}
				if r.cfg.DialRate > 0 {
					sleep(ctx, time.Until(start.Add(time.Duration(float64(i)/r.cfg.DialRate*float64(time.Second)))))
				}
				if r.connect(ctx, devs[i], h) == nil {
					ok.Add(1)
					last.Store(int64(time.Since(start)))
				}
			}
		})
	}
	wg.Wait()
	return int(ok.Load()), time.Duration(last.Load())
}

// connect connects d (connectOnce), and while -retry allows, tries again
// after each failure as the SDKs do (see backoff). h records the time from
// the first attempt to ready.
func (r *runner) connect(ctx context.Context, d *device, h *Histogram) error {
	start := time.Now()
	var b backoff
	for {
		retryAfter, err := r.connectOnce(ctx, d)
		if err == nil {
			h.Record(time.Since(start))
			return nil
		}
		if r.cfg.Retry <= 0 || ctx.Err() != nil || fatalRefusal(err) {
			return err
		}
		pause := b.next(retryAfter)
		if time.Since(start)+pause > r.cfg.Retry {
			return err
		}
		r.errs.add("retried")
		if r.cfg.Reconnect {
			d.url = balance(r.cfg.URLs, &r.turn, d.url)
		}
		sleep(ctx, pause)
	}
}

// fatalRefusal: the SDKs stop at auth_failed and forbidden.
func fatalRefusal(err error) bool {
	var se *client.ServerError
	return errors.As(err, &se) && (se.Code == protocol.CodeAuthFailed || se.Code == protocol.CodeForbidden)
}

// connectOnce dials d's edge, says hello and starts the connection's
// consumer. A refused upgrade's Retry-After comes back with its error.
func (r *runner) connectOnce(ctx context.Context, d *device) (retryAfter time.Duration, err error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	c, err := client.Dial(ctx, d.url, client.Options{LocalAddr: d.src, Timeout: connectTimeout,
		WriteTimeout: writeTimeout, Buffer: frameBuffer, AutoAck: r.cfg.Reconnect})
	if err != nil {
		var refused *client.HandshakeError
		if errors.As(err, &refused) {
			r.errs.add(fmt.Sprintf("dial:http %d", refused.Status))
			if refused.Status == 503 || refused.Status == 429 {
				retryAfter = parseRetryAfter(refused.Header.Get("Retry-After"))
			}
		} else if ctx.Err() == nil || time.Since(start) >= connectTimeout {
			r.errs.add("dial")
		}
		return retryAfter, err
	}
	_, err = c.Hello(ctx, r.cfg.Token, protocol.Device{ID: d.id, Name: "Load " + d.id, Platform: "loadtest", AppVersion: "1"},
		protocol.User{ID: "lt-" + r.cfg.RunID, Name: "Load test"})
	if err != nil {
		var se *client.ServerError
		if errors.As(err, &se) {
			r.errs.add("error:" + string(se.Code))
		} else {
			r.errs.add("hello")
		}
		c.CloseNow()
		return 0, err
	}
	l := &link{c: c}
	d.link.Store(l)
	r.consumers.Add(1)
	go r.consume(d, l)
	if r.quit.Err() != nil { // closeAll has begun and may have missed l
		l.closing.Store(true)
		d.link.CompareAndSwap(l, nil)
		c.CloseNow()
	}
	return 0, nil
}

// consume reads l's frames until the connection ends, counting answers,
// deliveries, error frames and ends the run did not ask for.
func (r *runner) consume(d *device, l *link) {
	defer r.consumers.Done()
	defer d.link.CompareAndSwap(l, nil)
	for {
		f, err := l.c.Next(context.Background())
		if f.IsZero() {
			if !l.closing.Load() {
				r.lostLink(d, l, "lost")
			}
			return
		}
		if err != nil {
			r.errs.add("bad_frame_from_server")
			continue
		}
		if ci := f.Close(); ci != nil {
			asked := l.closing.Swap(true)
			d.link.CompareAndSwap(l, nil)
			l.c.CloseNow()
			kind := fmt.Sprintf("close:%d", ci.Code)
			switch {
			case asked:
			case ci.Code == 1000: // another connection of the device took over: the SDKs stay away
				r.errs.add(kind)
			default:
				r.lostLink(d, l, kind)
			}
			return
		}
		r.handle(d, f)
	}
}

// handle reads one frame: a final answer, a delivery, or an error.
func (r *runner) handle(d *device, f client.Frame) {
	switch f.T() {
	case protocol.TypeMessage:
		if !f.Bool("final") {
			return
		}
		text := f.Str("text")
		if rest, ok := strings.CutPrefix(text, answerPrefix); ok {
			if fl, seq := r.arrived(rest, r.texts, r.stormTexts); fl == r.texts {
				d.inFlight.Add(-1)
				d.answered(seq)
			}
		} else if rest, ok := strings.CutPrefix(text, deliverPrefix); ok {
			r.arrived(rest, r.dlv)
		}
	case protocol.TypeError:
		code := f.Str("code")
		r.errs.add("error:" + code)
		if r.cfg.Reconnect && code == string(protocol.CodeInternalError) {
			r.resendLater(d) // a text was not taken: send it again
		}
	}
}

// arrived takes "<run> <seq> <unix ns>[ <write unix ns>]" of an answer or
// a delivery off the flow where it is pending and records its latency from
// the first time, and from the second when there is one (the texts of
// -pace phone: the first is when the text was due). Texts of other runs
// are ignored; one that is not pending (twice, or after it counted as lost)
// is an error ("unexpected"), or with -reconnect, where outputs come at
// least once, counted as again (or late) when this run sent it. It returns
// the flow the answer was pending on, or nil, and its sequence number.
func (r *runner) arrived(s string, flows ...*flow) (*flow, uint64) {
	now := time.Now()
	fields := strings.Fields(s)
	if (len(fields) != 3 && len(fields) != 4) || fields[0] != r.cfg.RunID {
		return nil, 0
	}
	seq, err1 := strconv.ParseUint(fields[1], 10, 64)
	ts, err2 := strconv.ParseInt(fields[2], 10, 64)
	var written int64
	var err3 error
	if len(fields) == 4 {
		written, err3 = strconv.ParseInt(fields[3], 10, 64)
	}
	if err1 != nil || err2 != nil || err3 != nil {
		r.errs.add("garbled")
		return nil, 0
	}
	var found *flow
	r.mu.Lock()
	for _, f := range flows {
		if _, ok := f.pending[seq]; ok {
			delete(f.pending, seq)
			f.arrived++
			found = f
			break
		}
	}
	r.mu.Unlock()
	if found == nil {
		if r.cfg.Reconnect && seq != 0 && seq <= r.seq.Load() {
			r.mu.Lock()
			r.rep.Reconnects.Again++
			r.mu.Unlock()
		} else {
			r.errs.add("unexpected")
		}
		return nil, seq
	}
	found.latency.Record(now.Sub(time.Unix(0, ts)))
	if written != 0 && found == r.texts {
		r.rep.Messages.FromWrite.Record(now.Sub(time.Unix(0, written)))
	}
	return found, seq
}

// text is what a run sends: prefix, run id, sequence number, time.
func (r *runner) text(prefix string, seq uint64, at time.Time) string {
	return prefix + r.cfg.RunID + " " + strconv.FormatUint(seq, 10) + " " + strconv.FormatInt(at.UnixNano(), 10)
}

// messagePhase sends texts at cfg.Rate, round-robin over the connected
// devices, for cfg.Duration, with deliveries beside it when configured.
func (r *runner) messagePhase(ctx context.Context) {
	var wg sync.WaitGroup
	if r.cfg.DeliverURL != "" && r.cfg.Duration > 0 {
		wg.Go(func() { r.deliveries(ctx) })
	}
	pctx, stopProgress := context.WithCancel(ctx)
	defer stopProgress()
	if r.cfg.Progress > 0 && r.cfg.Duration > 0 {
		wg.Go(func() { r.progressLog(pctx, time.Now()) })
	}
	m := &r.rep.Messages
	start := time.Now()
	if r.cfg.Pace == pacePhone {
		m.Sent = r.phonesPace(ctx, start)
	} else {
		next := 0
		pace(ctx, r.cfg.Rate, r.cfg.Duration, func() bool {
			d, l := r.pick(&next)
			if l == nil {
				return false
			}
			if r.send(d, l, r.texts, time.Time{}) {
				m.Sent++
			}
			return true
		})
	}
	took := time.Since(start)
	m.Seconds, m.Rate = took.Seconds(), perSecond(m.Sent, took)
	stopProgress()
	wg.Wait()
}

// progressLog logs, every cfg.Progress from start until ctx ends, the texts
// and deliveries answered so far and those sent but not answered yet, and
// the errors: a long run shows whether it is keeping up while it runs.
func (r *runner) progressLog(ctx context.Context, start time.Time) {
	tick := time.NewTicker(r.cfg.Progress)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		r.mu.Lock()
		ta, tp := r.texts.arrived, len(r.texts.pending)
		da, dp := r.dlv.arrived, len(r.dlv.pending)
		r.mu.Unlock()
		errs := 0
		for _, n := range r.errs.snapshot() {
			errs += n
		}
		r.logf("progress %.0fs: texts answered=%d pending=%d, deliveries received=%d pending=%d, errors=%d, held=%d",
			time.Since(start).Seconds(), ta, tp, da, dp, errs, r.held())
	}
}

// pace calls send rate times a second for d (or until ctx ends, or send
// says there is nothing to send with), catching up after a slow call.
func pace(ctx context.Context, rate float64, d time.Duration, send func() bool) {
	if rate <= 0 || d <= 0 {
		return
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	done := 0
	for {
		elapsed := min(time.Since(start), d)
		due := int(rate * elapsed.Seconds())
		for ; done < due; done++ {
			if ctx.Err() != nil || !send() {
				return
			}
		}
		if elapsed >= d {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// phonesPace sends the texts of the message phase from every device on a
// timer of its own, Rate/Conns a second from a random phase, as phones do:
// none waits for another's write, and each text is timed from when it was
// due (see selfPace). It returns how many were sent.
func (r *runner) phonesPace(ctx context.Context, start time.Time) int {
	if r.cfg.Rate <= 0 || r.cfg.Duration <= 0 {
		return 0
	}
	every := time.Duration(float64(len(r.devs)) / r.cfg.Rate * float64(time.Second))
	var (
		wg   sync.WaitGroup
		sent atomic.Int64
	)
	for _, d := range r.devs {
		phase := time.Duration(rand.Int64N(int64(every)))
		wg.Go(func() {
			selfPace(ctx, start, phase, every, r.cfg.Duration, func(due time.Time) {
				// A phone without a connection (it was lost) sends nothing.
				if l := d.link.Load(); l != nil && r.send(d, l, r.texts, due) {
					sent.Add(1)
				}
			})
		})
	}
	wg.Wait()
	return int(sent.Load())
}

// selfPace calls send(due) for every due = start + phase + k·every before
// start + d, each once its time has come, until ctx ends. A call that comes
// late, because the one before took longer than every or the timer fired
// late, still gets its own due time from the schedule, which does not
// shift: whoever times from due counts the wait, and a phone held up
// catches up rather than sending fewer texts. It returns the calls made.
func selfPace(ctx context.Context, start time.Time, phase, every, d time.Duration, send func(due time.Time)) int {
	if every <= 0 {
		return 0
	}
	t := time.NewTimer(0)
	defer t.Stop()
	<-t.C
	n := 0
	for due := phase; due < d; due += every {
		at := start.Add(due)
		if wait := time.Until(at); wait > 0 {
			t.Reset(wait)
			select {
			case <-ctx.Done():
				return n
			case <-t.C:
			}
		} else if ctx.Err() != nil {
			return n
		}
		send(at)
		n++
	}
	return n
}

// pick returns the next device with a connection after *next.
func (r *runner) pick(next *int) (*device, *link) {
	for range len(r.devs) {
		d := r.devs[*next%len(r.devs)]
		*next++
		if l := d.link.Load(); l != nil {
			return d, l
		}
	}
	return nil, nil
}

// send sends one text of flow f on d's link l; false when the write failed.
// A text of the message phase counts the texts of d still unanswered. The
// text is timed from its write, or, when due is set, from due: it then
// also carries the time of its write, and how late that was is recorded.
func (r *runner) send(d *device, l *link, f *flow, due time.Time) bool {
	seq := r.seq.Add(1)
	now := time.Now()
	r.mu.Lock()
	f.pending[seq] = struct{}{}
	r.lastSend = now
	if f == r.texts {
		r.rep.Messages.InFlight.add(int(d.inFlight.Add(1) - 1))
	}
	r.mu.Unlock()
	text := r.text(msgPrefix, seq, now)
	if !due.IsZero() {
		text = r.text(msgPrefix, seq, due) + " " + strconv.FormatInt(now.UnixNano(), 10)
		r.rep.Messages.WriteLag.Record(now.Sub(due))
	}
	if r.cfg.Reconnect && f == r.texts {
		d.remember(seq, text)
	}
	if err := l.c.Text("m"+strconv.FormatUint(seq, 10), text); err != nil {
		if r.cfg.Reconnect && f == r.texts {
			return true // pending, as in the SDKs: the next connection sends it
		}
		r.mu.Lock()
		delete(f.pending, seq)
		r.mu.Unlock()
		if f == r.texts {
			d.inFlight.Add(-1)
		}
		if !l.closing.Load() {
			r.errs.add("write")
		}
		return false
	}
	return true
}

// drain waits until every message and delivery has arrived, or until
// AnswerWait has passed since the last send; what is still missing then is
// lost.
func (r *runner) drain(ctx context.Context) {
	for {
		r.mu.Lock()
		left := len(r.texts.pending) + len(r.stormTexts.pending) + len(r.dlv.pending)
		since := time.Since(r.lastSend)
		r.mu.Unlock()
		if left == 0 || since > r.cfg.AnswerWait || ctx.Err() != nil {
			break
		}
		sleep(ctx, 20*time.Millisecond)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range []*flow{r.texts, r.stormTexts, r.dlv} {
		f.lost += len(f.pending)
		clear(f.pending)
	}
}

// storm drops a fraction of the connections at once, without a close frame
// as a network loss would, reconnects them all and sends one text on each
// at once, which must be answered like any other (their latency is that of
// a burst, so it is kept apart from the message phase's).
func (r *runner) storm(ctx context.Context) {
	st := &r.rep.Storm
	n := int(math.Round(r.cfg.Storm * float64(len(r.devs))))
	var dropped []*device
	for _, d := range r.devs {
		if len(dropped) == n {
			break
		}
		if l := d.link.Swap(nil); l != nil {
			l.closing.Store(true)
			l.c.CloseNow()
			dropped = append(dropped, d)
		}
	}
	st.Dropped = len(dropped)
	r.logf("storm: dropped %d connections; reconnecting", st.Dropped)
	ok, took := r.connectAll(ctx, dropped, st.Handshake)
	st.Back, st.Seconds, st.Rate = ok, took.Seconds(), perSecond(ok, took)
	r.logf("storm: %d back in %.2fs (%.0f/s); one message on each", ok, took.Seconds(), st.Rate)
	for _, d := range dropped {
		if l := d.link.Load(); l != nil && r.send(d, l, r.stormTexts, time.Time{}) {
			st.Sent++
		}
	}
	r.drain(ctx)
}

// closeAll closes every connection with a closing handshake and waits for
// the consumers.
func (r *runner) closeAll() {
	r.stop() // no more reconnects
	var wg sync.WaitGroup
	sem := make(chan struct{}, closeConcurrency)
	for _, d := range r.devs {
		l := d.link.Swap(nil)
		if l == nil {
			continue
		}
		l.closing.Store(true)
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			l.c.Close()
		})
	}
	wg.Wait()
	r.consumers.Wait()
}

// scrapeAll reads every metrics URL.
func (r *runner) scrapeAll(ctx context.Context, when string) []ServerSample {
	var out []ServerSample
	for _, u := range r.cfg.MetricsURLs {
		s := scrape(ctx, u, when)
		if s.Error != "" {
			r.logf("metrics %s: %s", u, s.Error)
		}
		out = append(out, s)
	}
	return out
}
