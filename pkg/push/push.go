// Package push wakes a phone that sleeps: when the agent's output lands for
// a device that holds no socket, the gateway notifies the push endpoint
// registered for the device, so the app reconnects and reads its outbox.
//
// Five kinds of endpoint are supported: the three self-hosters run,
//
//   - webhook: a POST of a JSON Notice to any URL, signed with
//     X-Hermes-Signature: sha256=<hex HMAC-SHA256 of the body> under the
//     gateway's push key (MOBILE_PUSH_KEY);
//   - unifiedpush: a POST of the JSON Notice to the endpoint URL the
//     device's distributor handed out (the UnifiedPush server protocol);
//   - ntfy: a message published to https://<host>/<topic> with ntfy's
//     publish API (the body is the message; X-Title, X-Priority, X-Tags;
//     an access token as Authorization: Bearer);
//
// and the two services the phones people carry are woken by, each
// registered with the token the app got from its platform (see fcm.go and
// apns.go):
//
//   - fcm: Firebase Cloud Messaging's HTTP v1 API (Android), with a
//     service account's access token (FCMConfig);
//   - apns: the Apple Push Notification service's HTTP/2 API (iOS), with a
//     provider token signed by a .p8 key (APNsConfig).
//
// A phone registers its own token over its socket (the push frame,
// docs/protocol-notes.md); the router API registers any kind
// (PUT /v1/devices/{device}/push). A token FCM or APNs reports dead is
// forgotten (Metrics.PushForgotten).
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
// ntfy topic are secrets, as is a token. FCM and APNs go through the same
// dialer, policy and bounds, each service one endpoint with PerService
// slots and at most a quarter of Queue in progress, so one that fails or
// hangs never holds back the other, nor the endpoints.
package push

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
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
	"github.com/hermes-mobile/gateway/pkg/tenant"
)

// Kinds of push endpoint.
const (
	KindWebhook     = "webhook"
	KindUnifiedPush = "unifiedpush"
	KindNtfy        = "ntfy"
	KindFCM         = "fcm"
	KindAPNs        = "apns"
)

// kindList names the kinds in errors.
const kindList = "webhook, unifiedpush, ntfy, fcm or apns"

// Bounds.
const (
	// MaxURLBytes bounds a registered endpoint URL: browsers' and
	// proxies' common limit, and what the store keeps per device.
	MaxURLBytes = 2048
	// MaxTokenBytes bounds an ntfy access token (ntfy's are 32
	// characters).
	MaxTokenBytes = 256
	// MaxDeviceTokenBytes bounds an FCM registration token or an APNs
	// device token. Neither service promises a length (APNs tokens are
	// 64 hex digits today, FCM's a few hundred characters): room to grow,
	// and still a small record per device.
	MaxDeviceTokenBytes = 4096
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
	Kind string `json:"kind"`
	URL  string `json:"url"` // none for fcm and apns: the token is the address
	// Token is an ntfy access token, or the device's FCM registration
	// token or APNs device token.
	Token string `json:"token,omitempty"`
}

// Validate reports what is wrong with t's form: an unknown kind, a URL
// that is not absolute http(s) or longer than MaxURLBytes, an ntfy URL
// that is not https://host/<topic>, a token where none is taken, longer
// than MaxTokenBytes or with a byte a header cannot carry; for fcm and
// apns, a URL, or a token that is missing, longer than
// MaxDeviceTokenBytes, not printable ASCII (fcm) or not hex (apns). Where
// the URL leads is the Policy's to judge, whether the service is
// configured the Notifier's (Notifier.Check).
func (t Target) Validate() error {
	switch t.Kind {
	case KindWebhook, KindUnifiedPush, KindNtfy:
	case KindFCM, KindAPNs:
		return t.validateDeviceToken()
	case "":
		return errors.New("kind is missing: " + kindList)
	default:
		return fmt.Errorf("unknown kind %q: %s", t.Kind, kindList)
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
	return printable(t.Token)
}

// printable reports a byte of tok that is not printable ASCII (a control
// character, a space, a byte past ASCII), naming its position only: a
// token is a secret.
func printable(tok string) error {
	for i := 0; i < len(tok); i++ {
		switch c := tok[i]; {
		case c < 0x20 || c == 0x7f:
			return fmt.Errorf("token has a control character (byte %d is 0x%02x): a token is printable ASCII, no CR, LF or tab", i, c)
		case c == ' ' || c > 0x7e:
			return fmt.Errorf("token has a space or a non-ASCII byte (byte %d): a token is printable ASCII", i)
		}
	}
	return nil
}

// validateDeviceToken checks an fcm or apns target: a token and no URL.
// An FCM registration token goes in a JSON body (printable ASCII is all
// FCM hands out); an APNs device token in the request's path, and is the
// hex of the token's bytes.
func (t Target) validateDeviceToken() error {
	what := "an FCM registration token"
	if t.Kind == KindAPNs {
		what = "an APNs device token"
	}
	switch {
	case t.URL != "":
		return fmt.Errorf("a %s registration takes no url: its token, %s, is the address", t.Kind, what)
	case t.Token == "":
		return fmt.Errorf("token is missing: %s", what)
	case len(t.Token) > MaxDeviceTokenBytes:
		return fmt.Errorf("token is %d bytes, longer than %d", len(t.Token), MaxDeviceTokenBytes)
	}
	if t.Kind == KindFCM {
		return printable(t.Token)
	}
	if len(t.Token)%2 != 0 {
		return errors.New("token is an odd number of hex digits: an APNs device token is the hex of its bytes")
	}
	for i := 0; i < len(t.Token); i++ {
		if c := t.Token[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return fmt.Errorf("token has a byte that is not a hex digit (byte %d): an APNs device token is the hex of its bytes", i)
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

// public is nt as it leaves the cluster: Device is the phone's own id,
// not its device key (tenant.DeviceKey), which the store and the claims
// use.
func (nt Notice) public() Notice {
	nt.Device = tenant.DeviceID(nt.Device)
	return nt
}

// Metrics counts notifications; nil counts nothing.
type Metrics interface {
	PushSent()
	PushFailed()
	PushDropped()
	// PushForgotten counts a registration of kind (fcm, apns) forgotten
	// because its service reported the token dead.
	PushForgotten(kind string)
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
	// FCM and APNs are the services the fcm and apns kinds are sent to
	// (LoadFCM, LoadAPNs); nil: the kind is not offered to apps
	// (AppKinds) and its registrations are refused (Check).
	FCM  *FCM
	APNs *APNs
	// TTL is how long FCM and APNs keep a notification for a phone they
	// cannot reach now: as long as the outbox keeps what it announces
	// (MOBILE_OUTBOX_TTL, 24 h).
	TTL time.Duration
	// PerService bounds the requests in flight to FCM, and to APNs (4):
	// each is one endpoint every phone of its platform shares. At most a
	// quarter of Queue notifications of one service are in progress;
	// past it the service's are dropped, so one that fails or hangs
	// leaves the others room.
	PerService int
	// RootCAs verifies the certificates of the services and endpoints;
	// nil: the host's roots. A relay behind a private CA; a test's
	// stand-in.
	RootCAs *x509.CertPool
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
	if c.TTL <= 0 {
		c.TTL = 24 * time.Hour
	}
	if c.PerService <= 0 {
		c.PerService = 4
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

	// services are FCM's and APNs's senders, by kind, as configured;
	// appKinds their kinds, in that order; backlog a token per
	// notification of the service in progress.
	services map[string]service
	appKinds []string
	backlog  map[string]chan struct{}
}

// service is FCM or APNs as the Notifier sends to it.
type service interface {
	// endpoint is the service's origin (scheme://host[:port]): its
	// bound of request slots and its name in logs.
	endpoint() string
	// request is nt's request to the device of token; a failure says
	// whether a retry may mend it (an access token not fetched).
	request(ctx context.Context, token string, nt Notice) (*http.Request, outcome)
	// answer refines o, what a failed answer (code, the first 64 KiB of
	// its body) means to any endpoint: a token the service reports dead,
	// credentials to renew before the retry, its own words in the error.
	answer(resp *http.Response, body []byte, o outcome) outcome
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
	var tlsConfig *tls.Config
	if cfg.RootCAs != nil {
		tlsConfig = &tls.Config{RootCAs: cfg.RootCAs, MinVersion: tls.VersionTLS12}
	}
	n.transport = &http.Transport{
		TLSClientConfig:       tlsConfig,
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
	n.services = make(map[string]service)
	n.backlog = make(map[string]chan struct{})
	if cfg.FCM != nil {
		n.services[KindFCM] = newFCMSender(cfg.FCM, n)
	}
	if cfg.APNs != nil {
		n.services[KindAPNs] = newAPNsSender(cfg.APNs, n)
	}
	for _, kind := range []string{KindFCM, KindAPNs} {
		if svc, ok := n.services[kind]; ok {
			n.appKinds = append(n.appKinds, kind)
			n.backlog[kind] = make(chan struct{}, max(1, cfg.Queue/4))
			n.slots.limit(svc.endpoint(), cfg.PerService)
		}
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

// AppKinds are the kinds an app may register over its socket, those of
// the services configured: fcm, apns, both or none (ready's
// capabilities.push).
func (n *Notifier) AppKinds() []string {
	if n == nil {
		return nil
	}
	return n.appKinds
}

// Offers reports whether kind is one of AppKinds.
func (n *Notifier) Offers(kind string) bool { return n != nil && n.services[kind] != nil }

// Check reports what is wrong with t as a registration: its form
// (Target.Validate), a service this Notifier does not send to, and a host
// that is an address the policy refuses, written in any form (127.0.0.1,
// 2130706433, [::ffff:7f00:1]), or localhost. A name's addresses are
// checked when it is dialed.
func (n *Notifier) Check(t Target) error {
	if err := t.Validate(); err != nil {
		return err
	}
	switch t.Kind {
	case KindFCM, KindAPNs:
		if !n.Offers(t.Kind) {
			return fmt.Errorf("this server does not send %s notifications: %s is not configured", t.Kind, serviceSetting[t.Kind])
		}
		return nil
	}
	u, _ := url.Parse(t.URL)
	if err := n.cfg.Policy.CheckHost(u.Hostname()); err != nil {
		return fmt.Errorf("url: %w", err)
	}
	return nil
}

// serviceSetting is the setting that configures a service, for errors.
var serviceSetting = map[string]string{
	KindFCM:  "MOBILE_PUSH_FCM_CREDENTIALS_FILE",
	KindAPNs: "MOBILE_PUSH_APNS_KEY_FILE",
}

// Register makes t, which passed Check, device's push endpoint for
// TargetTTL, replacing any: what PUT /v1/devices/{device}/push and an
// app's push frame do.
func (n *Notifier) Register(ctx context.Context, device string, t Target) error {
	data, err := json.Marshal(t)
	if err != nil {
		return err
	}
	return n.cfg.Store.SetPushTarget(ctx, device, data, TargetTTL)
}

// Unregister forgets device's registration if it is of kind: an app
// taking back its token leaves a registration of another kind (an
// operator's webhook) alone. removed reports whether there was one.
func (n *Notifier) Unregister(ctx context.Context, device, kind string) (removed bool, err error) {
	data, err := n.cfg.Store.PushTarget(ctx, device)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	var t Target
	if json.Unmarshal(data, &t) == nil && t.Kind != kind {
		return false, nil
	}
	return true, n.cfg.Store.DeletePushTarget(ctx, device)
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
		backlog := n.backlog[j.t.Kind] // nil but for a service's
		if backlog != nil {
			select {
			case backlog <- struct{}{}:
			default:
				n.dropBacklogged(j)
				<-n.active
				continue
			}
		}
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			defer func() { <-n.active }()
			if backlog != nil {
				defer func() { <-backlog }()
			}
			n.deliver(j)
		}()
	}
}

// dropBacklogged drops j, whose service has a quarter of Queue in
// progress already (it fails or hangs), and releases the burst's claim.
func (n *Notifier) dropBacklogged(j job) {
	n.metric(Metrics.PushDropped)
	n.cfg.Log.Warn("push service busy; notification dropped", "device", j.nt.Device, "kind", j.t.Kind,
		"endpoint", j.endpoint, "in_progress", cap(n.backlog[j.t.Kind]))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = n.cfg.Store.Release(ctx, burstKey(j.nt.Device), j.claim)
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
	switch t.Kind {
	case KindFCM, KindAPNs:
		svc := n.services[t.Kind]
		if svc == nil {
			// Registered while the service was configured.
			n.metric(Metrics.PushFailed)
			n.cfg.Log.Warn("push target's service is not configured; notification dropped", "device", nt.Device, "kind", t.Kind,
				"setting", serviceSetting[t.Kind])
			return job{}, false
		}
		return job{nt: nt, t: t, endpoint: svc.endpoint(), claim: claim}, true
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
		if o.dead {
			n.forget(j, o.err)
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

// forget deletes j's registration, whose token its service reported dead
// (err says how), unless the device registered another since.
func (n *Notifier) forget(j job, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	log := n.cfg.Log.With("device", j.nt.Device, "kind", j.t.Kind, "endpoint", j.endpoint, "reason", err)
	data, rerr := n.cfg.Store.PushTarget(ctx, j.nt.Device)
	var now Target
	switch {
	case errors.Is(rerr, store.ErrNotFound):
		log.Info("push token reported dead; its registration is gone already")
		return
	case rerr == nil && json.Unmarshal(data, &now) == nil && now != j.t:
		log.Info("push token reported dead; not forgotten: the device registered another since")
		return
	case rerr == nil:
		rerr = n.cfg.Store.DeletePushTarget(ctx, j.nt.Device)
	}
	if rerr != nil {
		n.metric(Metrics.PushFailed)
		log.Warn("push token reported dead; forgetting its registration failed", "err", rerr)
		return
	}
	if n.cfg.Metrics != nil {
		n.cfg.Metrics.PushForgotten(j.t.Kind)
	}
	log.Warn("push token reported dead; registration forgotten")
}

// outcome is what an attempt came to: nil err is sent; permanent is a
// failure a retry would not change (a refusal, a redirect, an address the
// policy refuses); dead, a token the service reports no longer valid
// (forget the registration); retryAfter is a 429's or 503's Retry-After.
type outcome struct {
	err           error
	permanent     bool
	dead          bool
	retryAfter    time.Duration
	hasRetryAfter bool
}

// send makes one attempt.
func (n *Notifier) send(t Target, nt Notice) outcome {
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.Timeout)
	defer cancel()
	svc := n.services[t.Kind] // nil but for fcm and apns
	var req *http.Request
	if svc != nil {
		var o outcome
		if req, o = svc.request(ctx, t.Token, nt); o.err != nil {
			return o
		}
	} else {
		var err error
		if req, err = n.request(ctx, t, nt); err != nil {
			return outcome{err: err, permanent: true}
		}
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
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	o := classify(resp)
	if svc != nil && o.err != nil {
		o = svc.answer(resp, body, o)
	}
	return o
}

// classify is what an endpoint's answer means: sent (2xx), a refusal (a
// 3xx, a 4xx but 408 and 429: permanent), or a failure worth a retry, after
// what a 429's or 503's Retry-After asks.
func classify(resp *http.Response) outcome {
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
		body, _ = json.Marshal(nt.public())
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
