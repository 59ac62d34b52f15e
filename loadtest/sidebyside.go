package main

// loadtest sidebyside: the same paths, with the same pacing and the same
// clocks, against this gateway and against Centrifugo, one target after the
// other, and the gateway's figures as ratios of each other target's:
//
//	hello      N sockets opened at once (at most -dial-concurrency in
//	           flight): dial → hello → ready on the gateway and on the
//	           floor (a bare gobwas server, loadtest floor), dial → connect
//	           → subscribe to a channel of its own on Centrifugo
//	single     -held of them kept; at each of -rates one request per
//	           message, paced open-loop: POST /v1/deliver to the socket's
//	           device, POST /api/publish to its channel
//	batch      at each of -batch-rates, -batch messages per request: POST
//	           /v1/deliver/batch, POST /api/batch (parallel)
//
// A message is timed twice from its request: to the socket's receipt of it
// and to the HTTP response. With the target's process ids (-target's
// fourth field), each step also counts the CPU those processes used per
// message received: a figure that other work on the machine moves far less
// than a latency.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/gobwas/ws"

	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/config"
	"github.com/hermes-mobile/gateway/pkg/secret"
)

// sbsTarget is one server of the comparison.
type sbsTarget struct {
	Name string `json:"name"`
	Kind string `json:"kind"` // "gateway", "centrifugo" or "floor" (the hello path only)
	WS   string `json:"ws"`
	API  string `json:"api"`
	Pids []int  `json:"pids,omitempty"` // its server processes, for the CPU per message
}

// parseTarget reads NAME=KIND,WS_URL,API_URL[,PID+PID…]; a floor has no
// API (-).
func parseTarget(s string) (sbsTarget, error) {
	name, rest, ok := strings.Cut(s, "=")
	f := strings.Split(rest, ",")
	if !ok || name == "" || len(f) < 3 || len(f) > 4 {
		return sbsTarget{}, fmt.Errorf("-target %q: want NAME=KIND,WS_URL,API_URL[,PID+PID…]", s)
	}
	t := sbsTarget{Name: name, Kind: f[0], WS: f[1], API: strings.TrimRight(f[2], "/")}
	if len(f) == 4 {
		for p := range strings.SplitSeq(f[3], "+") {
			pid, err := strconv.Atoi(p)
			if err != nil || pid <= 0 {
				return t, fmt.Errorf("-target %s: %q is not a process id", name, p)
			}
			t.Pids = append(t.Pids, pid)
		}
	}
	if t.Kind != "gateway" && t.Kind != "centrifugo" && t.Kind != "floor" {
		return t, fmt.Errorf("-target %s: kind %q is not gateway, centrifugo or floor", name, t.Kind)
	}
	if err := checkLoopback(t.WS, "ws"); err != nil {
		return t, fmt.Errorf("-target %s: %w", name, err)
	}
	if t.Kind == "floor" {
		if t.API != "-" {
			return t, fmt.Errorf("-target %s: a floor has no API: give - for it", name)
		}
		return t, nil
	}
	if err := checkLoopback(t.API, "http"); err != nil {
		return t, fmt.Errorf("-target %s: %w", name, err)
	}
	return t, nil
}

// maxSideConns bounds the hello path's sockets: they are held together
// until the last is ready, in one process of at most 20,000 open files
// (MaxConns is lower: the message phase runs longer and keeps more).
const maxSideConns = 18000

// sbsConfig is one side-by-side run.
type sbsConfig struct {
	Targets          []sbsTarget
	Token            string // the gateway's app token
	DeliverToken     string // the gateway router's deliver token
	CentrifugoKey    string // Centrifugo's http_api.key
	CentrifugoSecret string // Centrifugo's client.token.hmac_secret_key
	Conns, Held      int
	Rates            []float64
	BatchRates       []float64
	Batch            int
	Step             time.Duration
	MissAfter        time.Duration
	InFlight         int
	DialConcurrency  int
	Sources          int
	RunID            string
	JSONPath         string
}

func (c sbsConfig) validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if len(c.Targets) == 0 {
		bad("-target: at least one")
	}
	for _, t := range c.Targets {
		switch {
		case t.Kind == "gateway" && (c.Token == "" || c.DeliverToken == ""):
			bad("-target %s: a gateway needs -token and -deliver-token", t.Name)
		case t.Kind == "floor" && c.Token == "":
			bad("-target %s: a floor needs -token (the floor's)", t.Name)
		case t.Kind == "centrifugo" && (c.CentrifugoKey == "" || c.CentrifugoSecret == ""):
			bad("-target %s: Centrifugo needs -centrifugo-key and -centrifugo-secret", t.Name)
		}
	}
	if c.Conns < 1 || c.Conns > maxSideConns {
		bad("-conns: %d is not in [1, %d]", c.Conns, maxSideConns)
	}
	if c.Held < 1 || c.Held > c.Conns {
		bad("-held: %d is not in [1, -conns]", c.Held)
	}
	for _, r := range append(append([]float64{}, c.Rates...), c.BatchRates...) {
		if !(r > 0 && r <= MaxStepRate) {
			bad("-rates, -batch-rates: %g is not in (0, %d]", r, MaxStepRate)
		}
	}
	if c.Batch < 1 || c.Batch > MaxBatch {
		bad("-batch: %d is not in [1, %d]", c.Batch, MaxBatch)
	}
	if c.Step <= 0 || c.Step > MaxStep {
		bad("-step: %s is not in (0, %s]", c.Step, MaxStep)
	}
	if c.MissAfter <= 0 || c.MissAfter > MaxAnswerWait {
		bad("-miss-after: %s is not in (0, %s]", c.MissAfter, MaxAnswerWait)
	}
	if c.InFlight < 1 || c.InFlight > MaxInFlight {
		bad("-in-flight: %d is not in [1, %d]", c.InFlight, MaxInFlight)
	}
	if c.DialConcurrency < 1 || c.DialConcurrency > MaxDialConcurrency {
		bad("-dial-concurrency: %d is not in [1, %d]", c.DialConcurrency, MaxDialConcurrency)
	}
	if c.Sources < 1 || c.Sources > sourceCount {
		bad("-sources: %d is not in [1, %d]", c.Sources, sourceCount)
	}
	return errors.Join(errs...)
}

// sbsHello is the hello path of one target.
type sbsHello struct {
	Conns     int            `json:"conns"`
	OK        int            `json:"ok"`
	Seconds   float64        `json:"seconds"` // first dial to the last socket ready
	Rate      float64        `json:"per_s"`   // OK / Seconds
	Handshake Summary        `json:"handshake"`
	Errors    map[string]int `json:"errors,omitempty"`
}

// sbsStep is one rate of the single or the batch path: StepResult's
// latency is the request to the socket's receipt, Response the request to
// the HTTP response.
type sbsStep struct {
	StepResult
	Batch    int     `json:"batch"`
	Response Summary `json:"response"`
	// CPUPerMsg is the CPU the target's processes used during the step
	// (from its first request until its last answer or miss) over the
	// messages received, in µs; -1 without process ids.
	CPUPerMsg float64 `json:"cpu_us_per_msg"`
}

// sbsResult is what one target did.
type sbsResult struct {
	Target sbsTarget `json:"target"`
	Hello  sbsHello  `json:"hello"`
	Single []sbsStep `json:"single"`
	Batch  []sbsStep `json:"batch"`
	Failed string    `json:"failed,omitempty"`
}

// sbsSocket is one connection held: a gateway phone or a Centrifugo
// client subscribed to a channel of its own.
type sbsSocket interface {
	addr() string // the device id, or the channel
	close()
}

// sbsSide opens sockets on one target and sends messages to them.
type sbsSide interface {
	// dial opens socket i; a message it receives completes its operation
	// on the tracker.
	dial(ctx context.Context, i int) (sbsSocket, error)
	// send posts the messages seqs to the sockets to in one request (the
	// single endpoint unless batch) and returns per message "" or the kind
	// of failure.
	send(ctx context.Context, to []sbsSocket, seqs []uint64, batch bool) []string
}

// gatewaySide is the gateway: phones on its edge, deliveries at its router.
type gatewaySide struct {
	cfg stepConfig
	url string
	tag string
	tr  *tracker
	hc  *http.Client
}

type gatewaySocket struct{ ph *phone }

func (s gatewaySocket) addr() string { return s.ph.id }
func (s gatewaySocket) close() {
	s.ph.closing.Store(true)
	s.ph.c.Close()
}

func (g *gatewaySide) dial(ctx context.Context, i int) (sbsSocket, error) {
	ph, err := dialPhone(ctx, g.cfg, g.url, fmt.Sprintf("lt-%s-%s%d", g.cfg.RunID, g.tag, i), sourceFor(i, g.cfg.Sources, g.url))
	if err != nil {
		return nil, err
	}
	go consumePhone(ph, g.tr, gatewayFrame(g.tr, g.cfg.RunID))
	return gatewaySocket{ph}, nil
}

func (g *gatewaySide) send(ctx context.Context, to []sbsSocket, seqs []uint64, batch bool) []string {
	if !batch {
		return []string{postDeliver(ctx, g.hc, g.cfg, "mobile:"+to[0].addr(), seqs[0])}
	}
	devs := make([]string, len(to))
	for i, s := range to {
		devs[i] = "mobile:" + s.addr()
	}
	return postBatch(ctx, g.hc, g.cfg, devs, seqs)
}

// centrifugoSide is Centrifugo: a client per channel, publications through
// its HTTP API.
type centrifugoSide struct {
	url, secret, run, tag string
	sources               int
	tr                    *tracker
	api                   *centrifugoAPI
}

type centrifugoSocket struct {
	c       *centrifugoConn
	channel string
}

func (s centrifugoSocket) addr() string { return s.channel }
func (s centrifugoSocket) close()       { s.c.close() }

func (c *centrifugoSide) dial(ctx context.Context, i int) (sbsSocket, error) {
	user := fmt.Sprintf("lt-%s-%s%d", c.run, c.tag, i)
	token := hs256(c.secret, map[string]any{"sub": user, "exp": time.Now().Add(time.Hour).Unix()})
	channel := "sbs:" + user
	conn, err := dialCentrifugo(ctx, c.url, token, channel, sourceFor(i, c.sources, c.url))
	if err != nil {
		return nil, err
	}
	go conn.consume(func(text string) {
		if seq, ok := opSeq(text, deliverPrefix, c.run); ok {
			c.tr.done(seq, time.Now())
		}
	}, func() { c.tr.note("lost") })
	return centrifugoSocket{conn, channel}, nil
}

func (c *centrifugoSide) send(ctx context.Context, to []sbsSocket, seqs []uint64, batch bool) []string {
	if !batch {
		return []string{c.api.publish(ctx, to[0].addr(), opText(deliverPrefix, c.run, seqs[0]))}
	}
	channels, texts := make([]string, len(to)), make([]string, len(to))
	for i, s := range to {
		channels[i], texts[i] = s.addr(), opText(deliverPrefix, c.run, seqs[i])
	}
	return c.api.batch(ctx, channels, texts)
}

// dialKind names a failed dial for the errors.
func dialKind(err error) string {
	var (
		se *client.ServerError
		he *client.HandshakeError
		ce *centrifugoError
		ws ws.StatusError
	)
	switch {
	case errors.As(err, &se):
		return "error:" + string(se.Code)
	case errors.As(err, &ce):
		return "error:" + strconv.Itoa(ce.Code)
	case errors.As(err, &he):
		return fmt.Sprintf("dial:http %d", he.Status)
	case errors.As(err, &ws):
		return fmt.Sprintf("dial:http %d", int(ws))
	}
	return "dial"
}

// hello opens n sockets, at most conc at once, and keeps those that
// opened, in order.
func sbsHelloPath(ctx context.Context, side sbsSide, n, conc int) ([]sbsSocket, sbsHello) {
	res := sbsHello{Conns: n, Errors: map[string]int{}}
	socks := make([]sbsSocket, n)
	var (
		h    Histogram
		mu   sync.Mutex
		next atomic.Int64
		wg   sync.WaitGroup
		last time.Time
	)
	start := time.Now()
	for range min(conc, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				t0 := time.Now()
				s, err := side.dial(ctx, i)
				now := time.Now()
				mu.Lock()
				if err != nil {
					res.Errors[dialKind(err)]++
				} else {
					socks[i] = s
					h.Record(now.Sub(t0))
					last = now
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	var ok []sbsSocket
	for _, s := range socks {
		if s != nil {
			ok = append(ok, s)
		}
	}
	res.OK = len(ok)
	if res.OK > 0 {
		res.Seconds = last.Sub(start).Seconds()
		res.Rate = perSecond(res.OK, last.Sub(start))
	}
	res.Handshake = h.Summary()
	if len(res.Errors) == 0 {
		res.Errors = nil
	}
	return ok, res
}

// closeSockets closes socks, closeConcurrency at once.
func closeSockets(socks []sbsSocket) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, closeConcurrency)
	for _, s := range socks {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			s.close()
		})
	}
	wg.Wait()
}

// runPaced offers rate messages a second for d in requests of per
// messages each, paced open-loop, then waits for them as runStep does.
func (t *tracker) runPaced(ctx context.Context, rate float64, per int, d time.Duration, offer func(seqs []uint64, at time.Time)) StepResult {
	t.begin(rate)
	start := time.Now()
	pace(ctx, rate/float64(per), d, func() bool {
		seqs := make([]uint64, per)
		var at time.Time
		for i := range seqs {
			seqs[i], at = t.start()
		}
		offer(seqs, at)
		return true
	})
	return t.settle(ctx, start, d)
}

// sbsRate runs one rate of the single (per 1) or the batch path against
// the sockets held, counting the CPU of pids meanwhile.
func sbsRate(ctx context.Context, cfg sbsConfig, side sbsSide, tr *tracker, held []sbsSocket, rate float64, per int, pids []int) sbsStep {
	var (
		resp Histogram
		wg   sync.WaitGroup
		next int
	)
	cpu0, cpuErr := cpuSeconds(pids)
	sem := make(chan struct{}, cfg.InFlight)
	s := tr.runPaced(ctx, rate, per, cfg.Step, func(seqs []uint64, at time.Time) {
		to := make([]sbsSocket, len(seqs))
		for i := range to {
			to[i] = held[next%len(held)]
			next++
		}
		select {
		case sem <- struct{}{}:
		default:
			for _, seq := range seqs {
				tr.fail(seq, "client_busy")
			}
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			kinds := side.send(ctx, to, seqs, per > 1)
			resp.Record(time.Since(at))
			for i, kind := range kinds {
				if kind != "" {
					tr.fail(seqs[i], kind)
				}
			}
		})
	})
	wg.Wait()
	step := sbsStep{StepResult: s, Batch: per, Response: resp.Summary(), CPUPerMsg: -1}
	if cpu1, err := cpuSeconds(pids); len(pids) > 0 && cpuErr == nil && err == nil && s.Done > 0 {
		step.CPUPerMsg = (cpu1 - cpu0) / float64(s.Done) * 1e6
	}
	return step
}

// clockTicks is Linux's USER_HZ, the unit of /proc/<pid>/stat's times.
const clockTicks = 100

// cpuSeconds is the user and system CPU the processes pids used so far,
// from /proc/<pid>/stat; 0 for none.
func cpuSeconds(pids []int) (float64, error) {
	var ticks int64
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, err
		}
		// The command (field 2) is in parentheses and may hold spaces:
		// the fields counted are those after its closing one.
		i := bytes.LastIndexByte(b, ')')
		f := strings.Fields(string(b[i+1:]))
		if i < 0 || len(f) < 13 {
			return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
		}
		for _, v := range f[11:13] { // utime, stime: fields 14 and 15
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
			}
			ticks += n
		}
	}
	return float64(ticks) / clockTicks, nil
}

// runTarget runs every path against one target.
func runTarget(ctx context.Context, cfg sbsConfig, t sbsTarget, tag string, tr *tracker, logf func(string, ...any)) sbsResult {
	res := sbsResult{Target: t}
	hc := &http.Client{Timeout: deliverTimeout, Transport: &http.Transport{
		MaxIdleConns: cfg.InFlight, MaxIdleConnsPerHost: cfg.InFlight, IdleConnTimeout: time.Minute,
	}}
	defer hc.CloseIdleConnections()
	var side sbsSide
	if t.Kind == "gateway" || t.Kind == "floor" {
		side = &gatewaySide{tag: tag, url: t.WS, tr: tr, hc: hc, cfg: stepConfig{
			Token: cfg.Token, DeliverURL: t.API, DeliverToken: cfg.DeliverToken, Sources: cfg.Sources, RunID: cfg.RunID,
		}}
	} else {
		side = &centrifugoSide{url: t.WS, secret: cfg.CentrifugoSecret, run: cfg.RunID, tag: tag, sources: cfg.Sources, tr: tr,
			api: &centrifugoAPI{base: t.API, key: cfg.CentrifugoKey, hc: hc}}
	}

	logf("%s: hello, %d sockets", t.Name, cfg.Conns)
	socks, hello := sbsHelloPath(ctx, side, cfg.Conns, cfg.DialConcurrency)
	res.Hello = hello
	logf("%s: %d of %d ready in %.1fs (%.0f/s) %s", t.Name, hello.OK, hello.Conns, hello.Seconds, hello.Rate, errorList(hello.Errors))
	if len(socks) < cfg.Held {
		res.Failed = fmt.Sprintf("%d sockets opened, %d to hold", len(socks), cfg.Held)
		closeSockets(socks)
		return res
	}
	if t.Kind == "floor" {
		closeSockets(socks) // it takes no deliveries
		return res
	}
	held := socks[:cfg.Held]
	closeSockets(socks[cfg.Held:])
	defer closeSockets(held)

	for _, rate := range cfg.Rates {
		s := sbsRate(ctx, cfg, side, tr, held, rate, 1, t.Pids)
		logf("%s: single at %g/s: achieved %.0f/s, p99 %s ms to the socket, %.1f ms to the response; %d missed, %d failed %s",
			t.Name, rate, s.Achieved, msCell(s.P99), s.Response.P99, s.Missed, s.Failed, errorList(s.Errors))
		res.Single = append(res.Single, s)
	}
	for _, rate := range cfg.BatchRates {
		s := sbsRate(ctx, cfg, side, tr, held, rate, cfg.Batch, t.Pids)
		logf("%s: batches of %d at %g/s: achieved %.0f/s, p99 %s ms to the socket, %.1f ms to the response; %d missed, %d failed %s",
			t.Name, cfg.Batch, rate, s.Achieved, msCell(s.P99), s.Response.P99, s.Missed, s.Failed, errorList(s.Errors))
		res.Batch = append(res.Batch, s)
	}
	return res
}

// sbsMain is `loadtest sidebyside`.
func sbsMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("loadtest sidebyside", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg                          sbsConfig
		targets                      []string
		rates, batchRates, jsonPath  string
		token, deliverToken, key, hs secret.Secret
	)
	fs.Func("target", "NAME=KIND,WS_URL,API_URL, KIND gateway, centrifugo or floor (API_URL -) (repeated; the first is compared with each other)", func(s string) error {
		targets = append(targets, s)
		return nil
	})
	config.Secret(fs, &token, "token", "MOBILE_TOKEN", "the gateway's app token")
	config.Secret(fs, &deliverToken, "deliver-token", "LOADTEST_DELIVER_TOKEN", "a deliver token of the gateway's router")
	config.Secret(fs, &key, "centrifugo-key", "CENTRIFUGO_API_KEY", "Centrifugo's http_api.key")
	config.Secret(fs, &hs, "centrifugo-secret", "CENTRIFUGO_SECRET", "Centrifugo's client.token.hmac_secret_key (HS256)")
	fs.IntVar(&cfg.Conns, "conns", 10000, "sockets opened by the hello path")
	fs.IntVar(&cfg.Held, "held", 1000, "of them, sockets held for the deliveries")
	fs.StringVar(&rates, "rates", "2k,5k,10k", "single deliveries per second offered, one step each")
	fs.StringVar(&batchRates, "batch-rates", "50k,100k", "deliveries per second offered in batches, one step each")
	fs.IntVar(&cfg.Batch, "batch", 500, "deliveries per batch request")
	fs.DurationVar(&cfg.Step, "step", 10*time.Second, "how long each rate is offered")
	fs.DurationVar(&cfg.MissAfter, "miss-after", 5*time.Second, "a message not received this long after its request is missed")
	fs.IntVar(&cfg.InFlight, "in-flight", 1000, "HTTP requests in flight at most; one beyond fails as client_busy")
	fs.IntVar(&cfg.DialConcurrency, "dial-concurrency", 100, "handshakes in flight in the hello path")
	fs.IntVar(&cfg.Sources, "sources", sourceCount, "source addresses, from 127.0.0.2 on (1-253)")
	fs.StringVar(&cfg.RunID, "run", "", "run id, part of every device id and channel; random when empty")
	fs.StringVar(&jsonPath, "json", "", "also write the results as JSON to this file")
	if err := config.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "loadtest sidebyside:", err)
		return exitUsage
	}
	var err error
	for _, s := range targets {
		t, terr := parseTarget(s)
		err = errors.Join(err, terr)
		cfg.Targets = append(cfg.Targets, t)
	}
	cfg.Token, cfg.DeliverToken, cfg.CentrifugoKey, cfg.CentrifugoSecret = string(token), string(deliverToken), string(key), string(hs)
	cfg.JSONPath = jsonPath
	if cfg.RunID == "" {
		cfg.RunID = randomHex(3)
	}
	if err == nil {
		cfg.Rates, err = parseRates(rates)
	}
	if err == nil {
		cfg.BatchRates, err = parseRates(batchRates)
	}
	if err == nil {
		err = cfg.validate()
	}
	if err == nil {
		err = checkFiles(cfg.Conns + cfg.InFlight)
	}
	if err != nil {
		fmt.Fprintln(stderr, "loadtest sidebyside:", err)
		return exitUsage
	}

	logf := func(format string, a ...any) {
		fmt.Fprintf(stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, a...)...)
	}
	// One tracker for every target: the message numbers never repeat.
	tr := newTracker(stepRule{MinAchieved: 0.9, P99Max: cfg.MissAfter, MissAfter: cfg.MissAfter})
	var results []sbsResult
	status := 0
	for i, t := range cfg.Targets {
		r := runTarget(ctx, cfg, t, string(rune('a'+i)), tr, logf)
		if r.Failed != "" {
			logf("%s: %s", t.Name, r.Failed)
			status = exitFailed
		}
		results = append(results, r)
	}
	writeSideBySide(stdout, cfg, results)
	if cfg.JSONPath != "" {
		b, _ := json.MarshalIndent(map[string]any{"run": cfg.RunID, "results": results}, "", "  ")
		if err := os.WriteFile(cfg.JSONPath, append(b, '\n'), 0o644); err != nil {
			fmt.Fprintln(stderr, "loadtest sidebyside:", err)
			return exitUsage
		}
	}
	if ctx.Err() != nil {
		return exitFailed
	}
	return status
}

// ratioOf is a / b as a cell, "–" when either is unknown (not above 0).
func ratioOf(a, b float64) string {
	if !(a > 0 && b > 0) || math.IsInf(a, 0) || math.IsInf(b, 0) {
		return "–"
	}
	return fmt.Sprintf("%.2f", a/b)
}

// sbsRow is one row of the table: a label and, per target, its values
// (one or two: "p50 / p99").
type sbsRow struct {
	label  string
	values [][]float64 // per target
	cell   func(float64) string
}

// ratios is the first target's values over each other target's, a cell
// per other target.
func (r sbsRow) ratios() []string {
	var out []string
	for _, v := range r.values[1:] {
		var parts []string
		for k := range v {
			parts = append(parts, ratioOf(r.values[0][k], v[k]))
		}
		out = append(out, strings.Join(parts, " / "))
	}
	return out
}

// sbsRows are the rows of the table, one set per path and rate.
func sbsRows(cfg sbsConfig, results []sbsResult) []sbsRow {
	// NaN is a figure of a step the target did not run (a floor takes no
	// deliveries; a target that failed stopped).
	rate := func(v float64) string {
		if math.IsNaN(v) {
			return "–"
		}
		return fmt.Sprintf("%.0f", v)
	}
	count := rate
	ms := func(v float64) string {
		if math.IsNaN(v) {
			return "–"
		}
		return msCell(v)
	}
	cpu := func(v float64) string { // below 0: no process ids
		if math.IsNaN(v) || v < 0 {
			return "–"
		}
		return fmt.Sprintf("%.1f", v)
	}
	rows := []sbsRow{
		{label: fmt.Sprintf("hello → ready, %d sockets: /s", cfg.Conns), cell: rate},
		{label: "  handshake p50 / p99 ms", cell: ms},
		{label: "  failed", cell: count},
	}
	for _, r := range results {
		h := r.Hello
		rows[0].values = append(rows[0].values, []float64{h.Rate})
		rows[1].values = append(rows[1].values, []float64{h.Handshake.P50, h.Handshake.P99})
		rows[2].values = append(rows[2].values, []float64{float64(h.Conns - h.OK)})
	}
	steps := func(label string, rates []float64, of func(sbsResult) []sbsStep) {
		for i, offered := range rates {
			n := len(rows)
			rows = append(rows,
				sbsRow{label: fmt.Sprintf(label, offered), cell: rate},
				sbsRow{label: "  to the socket p50 / p99 ms", cell: ms},
				sbsRow{label: "  to the response p50 / p99 ms", cell: ms},
				sbsRow{label: "  missed / failed", cell: count},
				sbsRow{label: "  server CPU µs a message", cell: cpu})
			for _, r := range results {
				st := of(r)
				if i >= len(st) {
					nan := math.NaN()
					rows[n].values = append(rows[n].values, []float64{nan})
					for k := 1; k <= 3; k++ {
						rows[n+k].values = append(rows[n+k].values, []float64{nan, nan})
					}
					rows[n+4].values = append(rows[n+4].values, []float64{nan})
					continue
				}
				s := st[i]
				rows[n].values = append(rows[n].values, []float64{s.Achieved})
				rows[n+1].values = append(rows[n+1].values, []float64{s.P50, s.P99})
				rows[n+2].values = append(rows[n+2].values, []float64{s.Response.P50, s.Response.P99})
				rows[n+3].values = append(rows[n+3].values, []float64{float64(s.Missed), float64(s.Failed)})
				rows[n+4].values = append(rows[n+4].values, []float64{s.CPUPerMsg})
			}
		}
	}
	steps("single at %g/s: achieved /s", cfg.Rates, func(r sbsResult) []sbsStep { return r.Single })
	steps(fmt.Sprintf("batches of %d at %%g/s: achieved /s", cfg.Batch), cfg.BatchRates, func(r sbsResult) []sbsStep { return r.Batch })
	return rows
}

// writeSideBySide prints the table: a column per target, then the first
// target's figures over each other's.
func writeSideBySide(w io.Writer, cfg sbsConfig, results []sbsResult) {
	fmt.Fprintf(w, "side by side, run %s: %d sockets opened, %d held, each rate for %s, a message missed after %s\n",
		cfg.RunID, cfg.Conns, cfg.Held, cfg.Step, cfg.MissAfter)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := []string{"path"}
	for _, r := range results {
		head = append(head, r.Target.Name)
	}
	for _, r := range results[1:] {
		head = append(head, results[0].Target.Name+" ÷ "+r.Target.Name)
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	for _, row := range sbsRows(cfg, results) {
		cells := []string{row.label}
		for _, v := range row.values {
			var parts []string
			for _, x := range v {
				parts = append(parts, row.cell(x))
			}
			cells = append(cells, strings.Join(parts, " / "))
		}
		cells = append(cells, row.ratios()...)
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	_ = tw.Flush() // stdout: nothing to do about a failed write
	fmt.Fprintln(w, "÷: the first target's figure over the other's (a rate above 1 and a latency below 1 are the first's lead).")
	for _, r := range results {
		if r.Failed != "" {
			fmt.Fprintf(w, "%s: %s\n", r.Target.Name, r.Failed)
		}
		for _, s := range append(append([]sbsStep{}, r.Single...), r.Batch...) {
			if len(s.Errors) > 0 {
				fmt.Fprintf(w, "%s at %g/s (batch %d): %s\n", r.Target.Name, s.Offered, s.Batch, errorList(s.Errors))
			}
		}
		if len(r.Hello.Errors) > 0 {
			fmt.Fprintf(w, "%s hello: %s\n", r.Target.Name, errorList(r.Hello.Errors))
		}
	}
}
