// Package push wakes a phone that sleeps: when the agent's output lands for
// a device that holds no socket, the gateway notifies the push endpoint
// registered for the device, so the app reconnects and reads its outbox.
//
// Three kinds of endpoint are supported, the ones self-hosters run:
//
//   - webhook: a POST of a JSON Notice to any URL, signed with
//     X-Hermes-Signature: sha256=<hex HMAC-SHA256 of the body> under the
//     gateway's push key (MOBILE_PUSH_KEY);
//   - unifiedpush: a POST of the JSON Notice to the endpoint URL the
//     device's distributor handed out (the UnifiedPush server protocol);
//   - ntfy: a message published to https://<host>/<topic> with ntfy's
//     publish API (the body is the message; X-Title, X-Priority, X-Tags;
//     an access token as Authorization: Bearer).
//
// Firebase Cloud Messaging is not built in: no well-kept Go client of it
// is served by the module proxy this project builds from; an FCM relay
// behind the webhook kind does the same.
//
// Notifications are coalesced: one per device per burst (a store claim of
// Config.Every), carry no message content unless Config.Content is set,
// wait in a bounded queue, and never block the delivery that caused them:
// Notify only queues, and drops when the queue is full.
//
// A registered URL is an address the router is told to POST to, so the
// requests are fenced (see Policy): private, loopback, link-local and
// metadata addresses are refused when the dialer resolves the host, not
// only when the URL is registered; redirects are not followed; a request
// has Config.Timeout; at most Config.PerHost requests are in flight to one
// endpoint and Config.Workers in all, so endpoints that hang cannot hold
// back the others. A failed request is retried with full jitter
// (internal/retry), waiting what a 429 or 503 asks in Retry-After up to
// MaxRetryAfter; a refusal (another 4xx, a 3xx) is not retried. Logs name
// an endpoint by scheme and host only: a UnifiedPush URL's path and an
// ntfy topic are secrets, as is a token.
package push

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/hermes-mobile/gateway/internal/retry"
	"github.com/hermes-mobile/gateway/pkg/ids"
	"github.com/hermes-mobile/gateway/pkg/store"
)

// Kinds of push endpoint.
const (
	KindWebhook     = "webhook"
	KindUnifiedPush = "unifiedpush"
	KindNtfy        = "ntfy"
)

// Bounds.
const (
	// MaxURLBytes bounds a registered endpoint URL: browsers' and
	// proxies' common limit, and what the store keeps per device.
	MaxURLBytes = 2048
	// MaxTokenBytes bounds an ntfy access token (ntfy's are 32
	// characters).
	MaxTokenBytes = 256
	// TargetTTL is how long a registration is kept without being renewed.
	TargetTTL = 30 * 24 * time.Hour
	// SignatureHeader carries a webhook body's signature.
	SignatureHeader = "X-Hermes-Signature"
	// MaxRetryAfter is the longest wait a 429's or 503's Retry-After is
	// granted; an endpoint that asks for more is given up on (the burst's
	// claim released), since a wake-up that late is of no use.
	MaxRetryAfter = 5 * time.Minute
)

// ntfyTopic is ntfy's topic name rule (server/server.go, topicRegex).
var ntfyTopic = regexp.MustCompile(`^[-_A-Za-z0-9]{1,64}$`)

// Target is a device's push endpoint, as registered.
type Target struct {
	Kind  string `json:"kind"`
	URL   string `json:"url"`
	Token string `json:"token,omitempty"` // ntfy: an access token
}

// Validate reports what is wrong with t's form: an unknown kind, a URL
// that is not absolute http(s) or longer than MaxURLBytes, an ntfy URL
// that is not https://host/<topic>, a token where none is taken, longer
// than MaxTokenBytes or with a byte a header cannot carry. Where the URL
// leads is the Policy's to judge (Notifier.Check).
func (t Target) Validate() error {
	switch t.Kind {
	case KindWebhook, KindUnifiedPush, KindNtfy:
	case "":
		return errors.New("kind is missing: webhook, unifiedpush or ntfy")
	default:
		return fmt.Errorf("unknown kind %q: webhook, unifiedpush or ntfy", t.Kind)
	}
	if t.URL == "" {
		return errors.New("url is missing")
	}
	if len(t.URL) > MaxURLBytes {
		return fmt.Errorf("url is %d bytes, longer than %d", len(t.URL), MaxURLBytes)
	}
	u, err := url.Parse(t.URL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Hostname() == "" || u.User != nil {
		return errors.New("url must be an absolute http or https URL without credentials")
	}
	if t.Kind == KindNtfy {
		if !ntfyTopic.MatchString(strings.TrimPrefix(u.EscapedPath(), "/")) || u.RawQuery != "" {
			return errors.New("an ntfy url is https://<host>/<topic>, the topic of 1 to 64 letters, digits, - or _")
		}
	} else if t.Token != "" {
		return errors.New("token is taken by ntfy only")
	}
	if len(t.Token) > MaxTokenBytes {
		return fmt.Errorf("token is %d bytes, longer than %d", len(t.Token), MaxTokenBytes)
	}
	// The token becomes the Authorization header: a CR or LF would end
	// it (and Go's client refuses to send it, so every notification
	// would fail), a space or a byte past ASCII is no token's.
	for i := 0; i < len(t.Token); i++ {
		switch c := t.Token[i]; {
		case c < 0x20 || c == 0x7f:
			return fmt.Errorf("token has a control character (byte %d is 0x%02x): a token is printable ASCII, no CR, LF or tab", i, c)
		case c == ' ' || c > 0x7e:
			return fmt.Errorf("token has a space or a non-ASCII byte (byte %d): a token is printable ASCII", i)
		}
	}
	return nil
}

// origin is t's URL as logs may name it: scheme://host[:port], without
// the path (a UnifiedPush endpoint's secret, an ntfy topic) or the query.
// It is also the endpoint requests are bounded per (Config.PerHost).
func origin(u *url.URL) string { return u.Scheme + "://" + strings.ToLower(u.Host) }

// Notice is what a notification says: that output waits for the device.
// Text is the waiting message's text, only with Config.Content.
type Notice struct {
	Device string    `json:"device"`
	What   string    `json:"what"` // message, media, prompt, …: the kind of the output waiting
	Text   string    `json:"text,omitempty"`
	At     time.Time `json:"at"`
}

// Metrics counts notifications; nil counts nothing.
type Metrics interface {
	PushSent()
	PushFailed()
	PushDropped()
}

// Config of a Notifier.
type Config struct {
	// Store keeps the targets (SetPushTarget) and the per-burst claims.
	Store store.Store
	// Key signs webhook bodies (MOBILE_PUSH_KEY); without one, webhooks
	// are sent unsigned.
	Key []byte
	// Every is a burst: at most one notification per device per Every
	// (MOBILE_PUSH_EVERY, 15 min).
	Every time.Duration
	// Content puts the waiting message's text in the notification
	// (MOBILE_PUSH_CONTENT); off, a notification says only that something
	// waits.
	Content bool
	// Policy is where requests may go: by default public addresses only.
	Policy Policy
	// Queue bounds the notifications waiting to be taken up (1024); past
	// it they are dropped (hermes_push_dropped_total). As many again may
	// be in progress (waiting for a request slot, in flight, or waiting to
	// retry); while they are, no more are taken up.
	Queue int
	// Workers bounds the requests in flight at once, to every endpoint
	// together (16); PerHost bounds those to one endpoint,
	// scheme://host:port (2). A notification for an endpoint at its bound
	// waits without taking one of the Workers, so up to Workers/PerHost
	// endpoints that hang leave the others their slots.
	Workers int
	PerHost int
	// Attempts bounds the tries of one notification (5); between them a
	// wait of full jitter, up to Backoff (1 s) doubling to MaxBackoff (1
	// min), or what a 429's or 503's Retry-After asks (at most
	// MaxRetryAfter).
	Attempts   int
	Backoff    time.Duration
	MaxBackoff time.Duration
	// Timeout bounds one request, from dialing to the answer's end (10 s).
	Timeout time.Duration
	// Sleep waits d between attempts, false when ctx ended first; nil is
	// retry.Sleep. Tests record the waits instead of sleeping them.
	Sleep   func(ctx context.Context, d time.Duration) bool
	Log     *slog.Logger
	Metrics Metrics
}

func (c *Config) setDefaults() {
	if c.Every <= 0 {
		c.Every = 15 * time.Minute
	}
	if c.Queue <= 0 {
		c.Queue = 1024
	}
	if c.Workers <= 0 {
		c.Workers = 16
	}
	if c.PerHost <= 0 {
		c.PerHost = 2
	}
	if c.Attempts <= 0 {
		c.Attempts = 5
	}
	if c.Backoff <= 0 {
		c.Backoff = time.Second
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = time.Minute
	}
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
	if c.Sleep == nil {
		c.Sleep = retry.Sleep
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
}

// Notifier sends the notifications. Create it with New; Close stops it.
type Notifier struct {
	cfg       Config
	queue     chan Notice
	active    chan struct{} // a token per notification in progress
	slots     *slots
	transport *http.Transport
	client    *http.Client
	ctx       context.Context
	stop      context.CancelFunc
	wg        sync.WaitGroup
}

// New starts a Notifier.
func New(cfg Config) *Notifier {
	cfg.setDefaults()
	n := &Notifier{
		cfg:    cfg,
		queue:  make(chan Notice, cfg.Queue),
		active: make(chan struct{}, cfg.Queue),
		slots:  newSlots(cfg.Workers, cfg.PerHost),
	}
	dialer := &net.Dialer{Timeout: cfg.Timeout, KeepAlive: 30 * time.Second, Control: cfg.Policy.control}
	n.transport = &http.Transport{
		Proxy:                 nil, // a proxy would connect where the policy cannot look
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   cfg.PerHost,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   cfg.Timeout,
		ResponseHeaderTimeout: cfg.Timeout,
	}
	n.client = &http.Client{
		Transport: n.transport,
		// A redirect is not followed: it would lead past the check of
		// the registered URL, and a 307 would send the body again.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	n.ctx, n.stop = context.WithCancel(context.Background())
	n.wg.Add(1)
	go n.run()
	return n
}

// Close stops the notifications, dropping what waits, and waits for those
// in progress to end.
func (n *Notifier) Close() {
	n.stop()
	n.wg.Wait()
	n.transport.CloseIdleConnections()
}

// Check reports what is wrong with t as a registration: its form
// (Target.Validate) and a host that is an address the policy refuses,
// written in any form (127.0.0.1, 2130706433, [::ffff:7f00:1]), or
// localhost. A name's addresses are checked when it is dialed.
func (n *Notifier) Check(t Target) error {
	if err := t.Validate(); err != nil {
		return err
	}
	u, _ := url.Parse(t.URL)
	if err := n.cfg.Policy.CheckHost(u.Hostname()); err != nil {
		return fmt.Errorf("url: %w", err)
	}
	return nil
}

// Notify queues a notification for device that output of kind what (with
// text, sent only with Config.Content) waits for it. It never blocks: a
// full queue drops it.
func (n *Notifier) Notify(device, what, text string) {
	if n == nil {
		return
	}
	nt := Notice{Device: device, What: what, At: time.Now().UTC()}
	if n.cfg.Content {
		nt.Text = text
	}
	select {
	case n.queue <- nt:
	default:
		n.metric(Metrics.PushDropped)
		n.cfg.Log.Warn("push queue full; notification dropped", "device", device, "queue", n.cfg.Queue)
	}
}

func (n *Notifier) metric(f func(Metrics)) {
	if n.cfg.Metrics != nil {
		f(n.cfg.Metrics)
	}
}

// run takes up the queued notifications in order, while fewer than Queue
// are in progress: it reads each one's target and claims its burst (two
// store calls), then leaves its requests to a goroutine of its own.
func (n *Notifier) run() {
	defer n.wg.Done()
	for {
		select {
		case <-n.ctx.Done():
			return
		case n.active <- struct{}{}:
		}
		var nt Notice
		select {
		case <-n.ctx.Done():
			return
		case nt = <-n.queue:
		}
		j, ok := n.prepare(nt)
		if !ok {
			<-n.active
			continue
		}
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			defer func() { <-n.active }()
			n.deliver(j)
		}()
	}
}

// burstKey is the store claim that coalesces a device's notifications.
func burstKey(device string) string { return "push:" + device }

// job is a notification to send: its target, claimed for its burst.
type job struct {
	nt       Notice
	t        Target
	endpoint string // origin(t.URL)
	claim    string // the burst claim's value, to release it
}

// prepare reads nt's target and claims the device's burst: false when
// there is nothing to send (no target, notified in this burst) or it
// cannot be sent.
func (n *Notifier) prepare(nt Notice) (job, bool) {
	ctx, cancel := context.WithTimeout(n.ctx, 5*time.Second)
	defer cancel()
	data, err := n.cfg.Store.PushTarget(ctx, nt.Device)
	if errors.Is(err, store.ErrNotFound) {
		return job{}, false
	}
	if err != nil {
		n.metric(Metrics.PushFailed)
		n.cfg.Log.Warn("push target not read; notification dropped", "device", nt.Device, "err", err)
		return job{}, false
	}
	var t Target
	if err := json.Unmarshal(data, &t); err != nil {
		n.metric(Metrics.PushFailed)
		n.cfg.Log.Warn("push target unreadable; notification dropped", "device", nt.Device, "err", err)
		return job{}, false
	}
	claim := ids.New("push")
	ok, err := n.cfg.Store.Claim(ctx, burstKey(nt.Device), claim, n.cfg.Every)
	if errors.Is(err, store.ErrPending) || (err == nil && !ok) {
		return job{}, false // notified in this burst
	}
	if err != nil {
		n.metric(Metrics.PushFailed)
		n.cfg.Log.Warn("push burst claim failed; notification dropped", "device", nt.Device, "err", err)
		return job{}, false
	}
	// Registered under older rules, it may no longer pass (what it leads
	// to is checked as it is dialed). The claim is kept: a retry would
	// not change it, and the log says so once per burst.
	if err := t.Validate(); err != nil {
		n.metric(Metrics.PushFailed)
		n.cfg.Log.Warn("push target invalid; notification dropped", "device", nt.Device, "kind", t.Kind, "err", err)
		return job{}, false
	}
	u, _ := url.Parse(t.URL)
	return job{nt: nt, t: t, endpoint: origin(u), claim: claim}, true
}

// deliver makes j's attempts. A notification that fails releases the
// burst's claim, so the next output tries again.
func (n *Notifier) deliver(j job) {
	fail := func(attempts int, err error) {
		n.metric(Metrics.PushFailed)
		n.cfg.Log.Warn("push notification failed", "device", j.nt.Device, "kind", j.t.Kind, "endpoint", j.endpoint, "attempts", attempts, "err", err)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = n.cfg.Store.Release(ctx, burstKey(j.nt.Device), j.claim)
		cancel()
	}
	wait := retry.Full(n.cfg.Backoff, n.cfg.MaxBackoff)
	for i := 1; ; i++ {
		if n.slots.acquire(n.ctx, j.endpoint) != nil {
			return // closing
		}
		o := n.send(j.t, j.nt)
		n.slots.release(j.endpoint)
		if o.err == nil {
			n.metric(Metrics.PushSent)
			return
		}
		if n.ctx.Err() != nil {
			return
		}
		if o.permanent || i >= n.cfg.Attempts {
			fail(i, o.err)
			return
		}
		d := wait.Next()
		if o.hasRetryAfter {
			if o.retryAfter > MaxRetryAfter {
				fail(i, fmt.Errorf("%w, asking to retry after %v, past the %v waited at most", o.err, o.retryAfter, MaxRetryAfter))
				return
			}
			d = o.retryAfter
		}
		if !n.cfg.Sleep(n.ctx, d) {
			return
		}
	}
}

// outcome is what an attempt came to: nil err is sent; permanent is a
// failure a retry would not change (a refusal, a redirect, an address the
// policy refuses); retryAfter is a 429's or 503's Retry-After.
type outcome struct {
	err           error
	permanent     bool
	retryAfter    time.Duration
	hasRetryAfter bool
}

// send makes one attempt.
func (n *Notifier) send(t Target, nt Notice) outcome {
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.Timeout)
	defer cancel()
	req, err := n.request(ctx, t, nt)
	if err != nil {
		return outcome{err: err, permanent: true}
	}
	resp, err := n.client.Do(req)
	if err != nil {
		// A *url.Error's text holds the whole URL, the secret of a
		// UnifiedPush endpoint: keep what it wraps.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		var refused *RefusedError
		var badCert *tls.CertificateVerificationError
		if errors.As(err, &refused) || errors.As(err, &badCert) {
			return outcome{err: err, permanent: true}
		}
		return outcome{err: err}
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	code := resp.StatusCode
	answered := fmt.Errorf("push endpoint answered %d %s", code, http.StatusText(code))
	switch {
	case code >= 200 && code < 300:
		return outcome{}
	case code >= 300 && code < 400:
		return outcome{err: fmt.Errorf("%w: redirects are not followed", answered), permanent: true}
	case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		o := outcome{err: answered}
		o.retryAfter, o.hasRetryAfter = retry.RetryAfter(resp.Header.Get("Retry-After"), time.Now())
		return o
	case code == http.StatusRequestTimeout || code >= 500:
		return outcome{err: answered}
	default:
		return outcome{err: answered, permanent: true}
	}
}

// request is t's request for nt.
func (n *Notifier) request(ctx context.Context, t Target, nt Notice) (*http.Request, error) {
	var body []byte
	if t.Kind == KindNtfy {
		msg := "New message from your agent"
		if nt.Text != "" {
			msg = nt.Text
		}
		body = []byte(msg)
	} else {
		body, _ = json.Marshal(nt)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.URL, bytes.NewReader(body))
	if err != nil {
		return nil, errors.New("the url cannot be requested") // its text would hold the URL
	}
	switch t.Kind {
	case KindNtfy:
		req.Header.Set("X-Title", "Hermes")
		req.Header.Set("X-Priority", "4")
		req.Header.Set("X-Tags", "speech_balloon")
		if t.Token != "" {
			req.Header.Set("Authorization", "Bearer "+t.Token)
		}
	case KindWebhook:
		req.Header.Set("Content-Type", "application/json")
		if len(n.cfg.Key) > 0 {
			req.Header.Set(SignatureHeader, Sign(n.cfg.Key, body))
		}
	case KindUnifiedPush:
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("TTL", "86400") // the RFC 8030 header UnifiedPush servers take
		req.Header.Set("Urgency", "high")
	}
	return req, nil
}

// Sign is a webhook body's X-Hermes-Signature: "sha256=" and the hex
// HMAC-SHA256 of body under key.
func Sign(key, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// Verify reports whether sig is body's signature under key, in constant
// time: what a webhook receiver checks.
func Verify(key, body []byte, sig string) bool {
	return hmac.Equal([]byte(sig), []byte(Sign(key, body)))
}
