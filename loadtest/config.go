package main

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/hermes-mobile/gateway/pkg/config"
	"github.com/hermes-mobile/gateway/pkg/secret"
)

// Hard caps of one run. A flag above its cap is refused, so a typo cannot
// turn a load test into a denial of service of the machine.
const (
	// MaxConns bounds the connections of one process. A process may hold
	// 20,000 open files; each connection is one of them (the server's end is
	// in another process), and the rest is headroom. Larger runs are several
	// processes whose JSON reports are merged (see README).
	MaxConns = 9000
	// MaxRate bounds the messages per second sent by one process.
	MaxRate = 20000
	// MaxDeliverRate bounds the router deliveries per second of one process.
	MaxDeliverRate = 2000
	// MaxPhase bounds the soak and the message phase, each.
	MaxPhase = time.Hour
	// MaxAnswerWait bounds how long an answer may take before its message
	// counts as lost.
	MaxAnswerWait = time.Minute
	// MaxRetry bounds how long a phone keeps trying to connect.
	MaxRetry = 10 * time.Minute
	// MaxDeliverTTL is the router's default MOBILE_OUTBOX_TTL (a day).
	MaxDeliverTTL = 86400
	// MaxDialConcurrency bounds the handshakes in flight at once.
	MaxDialConcurrency = 1000
	// sourceFirst and sourceCount: the source addresses 127.0.0.2 to
	// 127.0.0.254 that connections are spread over, so that many sockets do
	// not exhaust one address's ephemeral ports.
	sourceFirst = 2
	sourceCount = 253
)

// Config is one run of the load generator.
type Config struct {
	URLs            []string      // WebSocket URLs; connections are split over them in turn
	Token           string        // the app token (MOBILE_TOKEN)
	Conns           int           // connections to open and hold
	Soak            time.Duration // how long they are held idle before messages
	Duration        time.Duration // how long messages are sent
	Rate            float64       // messages per second, all connections together
	AnswerWait      time.Duration // how long after its send an answer may come
	Storm           float64       // fraction of connections dropped at once and reconnected; 0 skips
	DialConcurrency int           // handshakes in flight at once
	DialRate        float64       // handshakes per second at most; 0 means as fast as DialConcurrency allows
	Sources         int           // how many source addresses (127.0.0.2 on) connections are spread over
	RunID           string        // part of every device id and message, so runs never mix
	DeliverURL      string        // the router API (POST /v1/deliver); empty sends no deliveries
	DeliverToken    string        // a token of MOBILE_DELIVER_TOKENS
	DeliverRate     float64       // deliveries per second during the message phase
	MetricsURLs     []string      // Prometheus /metrics of the servers, read after the soak and at the end
	RequireMetrics  bool          // fail the run when a metrics URL cannot be read
	JSONPath        string        // also write the report here as JSON
	Progress        time.Duration // during the message phase, log what was answered and what is pending this often; 0 never
	Pace            string        // pacePhone: every phone sends on a timer of its own; paceCentral: one pacer, round-robin
	// Retry is how long a phone that could not connect keeps trying, as
	// the SDKs do: after a 503 or 429 at least its Retry-After, with
	// jitter; after any other failure full jitter (see backoff). 0 gives
	// each phone one attempt.
	Retry time.Duration
	// Reconnect: a phone whose connection ends without the run closing it
	// (a drop, or a close other than 1000) connects again, as the SDKs
	// do, to the next of URLs in turn (as a load balancer would send it
	// to a live edge), with the same device id and for as long as Retry
	// allows; it acks what it shows and sends its unanswered texts again
	// with the same ids. Retry applies to every attempt, the first
	// connection's included, and each moves on to the next URL.
	Reconnect bool
	// DeliverTTL is the ttl (seconds) of every delivery; 0 sends none. With
	// a ttl, deliveries go to every device in turn, connected or not: the
	// router keeps what an away phone cannot take in its outbox.
	DeliverTTL int
}

// The ways texts are paced in the message phase.
const (
	// paceCentral: one pacer sends Rate texts a second, round-robin over
	// the phones, each timed from its write.
	paceCentral = "central"
	// pacePhone: every phone sends Rate/Conns texts a second on a timer
	// of its own, from a random phase, as the app does; each text is
	// timed from when it was due, so a phone held up counts its wait.
	pacePhone = "phone"
)

// flagSet holds the flags before they become a Config.
type flagSet struct {
	urls, metrics, deliverURL, runID, jsonPath string
	token, deliverToken                        secret.Secret
	cfg                                        Config
}

// RegisterFlags defines the flags of a run on fs.
func (f *flagSet) RegisterFlags(fs *flag.FlagSet) {
	c := &f.cfg
	fs.StringVar(&f.urls, "url", "ws://127.0.0.1:8787/ws", "WebSocket URLs of the edges, comma-separated; connections are split over them (loopback only)")
	config.Secret(fs, &f.token, "token", "MOBILE_TOKEN", "the app token")
	fs.IntVar(&c.Conns, "conns", 1000, fmt.Sprintf("connections to open and hold (at most %d per process)", MaxConns))
	fs.DurationVar(&c.Soak, "soak", 10*time.Second, "how long the connections are held idle before messages (at most 1h)")
	fs.DurationVar(&c.Duration, "duration", 30*time.Second, "how long messages are sent (at most 1h)")
	fs.Float64Var(&c.Rate, "rate", 100, fmt.Sprintf("messages per second, all connections together (at most %d; 0 sends none)", MaxRate))
	fs.DurationVar(&c.AnswerWait, "answer-wait", 10*time.Second, "how long an answer may take before its message counts as lost (at most 1m)")
	fs.Float64Var(&c.Storm, "storm", 0.25, "fraction of the connections dropped at once and reconnected at the end (0 skips the storm)")
	fs.IntVar(&c.DialConcurrency, "dial-concurrency", 100, fmt.Sprintf("handshakes in flight at once (at most %d)", MaxDialConcurrency))
	fs.Float64Var(&c.DialRate, "dial-rate", 0, "handshakes per second at most (0: as fast as -dial-concurrency allows)")
	fs.IntVar(&c.Sources, "sources", sourceCount, "how many source addresses, from 127.0.0.2 on, the connections are spread over (1-253)")
	fs.StringVar(&f.runID, "run", "", "run id, part of every device id (lt-<run>-<n>); random when empty")
	fs.StringVar(&f.deliverURL, "deliver", "", "router API base URL (e.g. http://127.0.0.1:8788): also time POST /v1/deliver to the phones (loopback only)")
	config.Secret(fs, &f.deliverToken, "deliver-token", "LOADTEST_DELIVER_TOKEN", "a deliver token of the router (MOBILE_DELIVER_TOKENS)")
	fs.Float64Var(&c.DeliverRate, "deliver-rate", 10, fmt.Sprintf("deliveries per second with -deliver (at most %d)", MaxDeliverRate))
	fs.StringVar(&f.metrics, "metrics", "", "Prometheus /metrics URLs of the servers, comma-separated, each optionally name=url (loopback only); unreadable ones show n/a")
	fs.BoolVar(&c.RequireMetrics, "require-metrics", false, "fail the run when a -metrics URL cannot be read or lacks process_resident_memory_bytes or go_goroutines")
	fs.StringVar(&f.jsonPath, "json", "", "also write the report as JSON to this file")
	fs.StringVar(&c.Pace, "pace", paceCentral, "how texts are paced: central (one pacer, round-robin over the phones, timed from the write) or phone (each phone on a timer of its own at -rate/-conns a second, from a random phase, timed from when the text was due)")
	fs.DurationVar(&c.Retry, "retry", 0, "how long a phone that could not connect keeps trying, waiting as the SDKs do: at least a 503's Retry-After, with full jitter (at most 10m; 0: one attempt)")
	fs.BoolVar(&c.Reconnect, "reconnect", false, "a phone whose connection ends unasked connects again with the same backoff (for as long as -retry allows) to the next -url in turn, keeps its device id, acks what it shows and sends its unanswered texts again")
	fs.IntVar(&c.DeliverTTL, "deliver-ttl", 0, fmt.Sprintf("ttl in seconds of every delivery (at most %d; 0: none); with a ttl, deliveries go to every device in turn, connected or not", MaxDeliverTTL))
	fs.DurationVar(&c.Progress, "progress", 0, "log the texts and deliveries answered and pending this often during the message phase (0: never)")
}

// Config turns the flags into a validated Config.
func (f *flagSet) Config() (Config, error) {
	c := f.cfg
	c.URLs = config.List(f.urls)
	c.MetricsURLs = config.List(f.metrics)
	c.Token = string(f.token)
	c.DeliverURL = strings.TrimRight(f.deliverURL, "/")
	c.DeliverToken = string(f.deliverToken)
	c.RunID = f.runID
	c.JSONPath = f.jsonPath
	if c.RunID == "" {
		c.RunID = randomHex(3)
	}
	return c, c.Validate()
}

// Validate checks every bound and that every target is on loopback.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if len(c.URLs) == 0 {
		bad("-url: at least one WebSocket URL")
	}
	for _, u := range c.URLs {
		if err := checkLoopback(u, "ws"); err != nil {
			bad("-url: %w", err)
		}
	}
	for _, m := range c.MetricsURLs {
		_, u := metricsTarget(m)
		if err := checkLoopback(u, "http"); err != nil {
			bad("-metrics: %w", err)
		}
	}
	if c.DeliverURL != "" {
		if err := checkLoopback(c.DeliverURL, "http"); err != nil {
			bad("-deliver: %w", err)
		}
		if c.DeliverToken == "" {
			bad("-deliver needs -deliver-token")
		}
		if c.DeliverRate <= 0 || c.DeliverRate > MaxDeliverRate {
			bad("-deliver-rate: %g is not in (0, %d]", c.DeliverRate, MaxDeliverRate)
		}
	}
	if c.Token == "" {
		bad("-token (or MOBILE_TOKEN) is required")
	}
	if c.Conns < 1 || c.Conns > MaxConns {
		bad("-conns: %d is not in [1, %d]; run several processes for more (see loadtest/README.md)", c.Conns, MaxConns)
	}
	if c.Soak < 0 || c.Soak > MaxPhase {
		bad("-soak: %s is not in [0, %s]", c.Soak, MaxPhase)
	}
	if c.Duration < 0 || c.Duration > MaxPhase {
		bad("-duration: %s is not in [0, %s]", c.Duration, MaxPhase)
	}
	if c.Rate < 0 || c.Rate > MaxRate {
		bad("-rate: %g is not in [0, %d]", c.Rate, MaxRate)
	}
	if c.AnswerWait <= 0 || c.AnswerWait > MaxAnswerWait {
		bad("-answer-wait: %s is not in (0, %s]", c.AnswerWait, MaxAnswerWait)
	}
	if c.Storm < 0 || c.Storm > 1 {
		bad("-storm: %g is not a fraction in [0, 1]", c.Storm)
	}
	if c.DialConcurrency < 1 || c.DialConcurrency > MaxDialConcurrency {
		bad("-dial-concurrency: %d is not in [1, %d]", c.DialConcurrency, MaxDialConcurrency)
	}
	if c.Pace != "" && c.Pace != paceCentral && c.Pace != pacePhone { // "" is central
		bad("-pace: %q is neither %s nor %s", c.Pace, paceCentral, pacePhone)
	}
	if c.Retry < 0 || c.Retry > MaxRetry {
		bad("-retry: %s is not in [0, %s]", c.Retry, MaxRetry)
	}
	if c.Reconnect && c.Retry <= 0 {
		bad("-reconnect needs -retry: how long a phone keeps trying")
	}
	if c.DeliverTTL < 0 || c.DeliverTTL > MaxDeliverTTL {
		bad("-deliver-ttl: %d is not in [0, %d]", c.DeliverTTL, MaxDeliverTTL)
	}
	if c.Progress < 0 {
		bad("-progress: %s is negative", c.Progress)
	}
	if c.DialRate < 0 {
		bad("-dial-rate: %g is negative", c.DialRate)
	}
	if c.Sources < 1 || c.Sources > sourceCount {
		bad("-sources: %d is not in [1, %d]", c.Sources, sourceCount)
	}
	if strings.ContainsAny(c.RunID, " \t\n") || len(c.RunID) > 32 {
		bad("-run: %q must be a word of at most 32 characters", c.RunID)
	}
	return errors.Join(errs...)
}

// checkLoopback refuses a URL whose host is not a loopback address (or
// localhost), or whose scheme is not scheme or its TLS twin.
func checkLoopback(raw, scheme string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	if u.Scheme != scheme && u.Scheme != scheme+"s" {
		return fmt.Errorf("%q: the scheme must be %s:// or %ss://", raw, scheme, scheme)
	}
	host := u.Hostname()
	if host == "localhost" {
		return nil
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || !ip.IsLoopback() {
		return fmt.Errorf("%q: the load generator only targets loopback (127.0.0.0/8, ::1, localhost)", raw)
	}
	return nil
}

// sourceAddr is the source address of connection i to target, or the zero
// Addr when the target is not an IPv4 address (the system then chooses).
func (c Config) sourceAddr(i int, target string) netip.Addr { return sourceFor(i, c.Sources, target) }

// sourceFor is the source address of connection i to target when they are
// spread over sources addresses from 127.0.0.2 on, or the zero Addr when the
// target is not an IPv4 address (the system then chooses).
func sourceFor(i, sources int, target string) netip.Addr {
	u, err := url.Parse(target)
	if err != nil {
		return netip.Addr{}
	}
	ip, err := netip.ParseAddr(u.Hostname())
	if err != nil || !ip.Is4() {
		return netip.Addr{}
	}
	return netip.AddrFrom4([4]byte{127, 0, 0, byte(sourceFirst + i%sources)})
}
