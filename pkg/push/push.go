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
// wait in a bounded queue, are retried with backoff, and never block the
// delivery that caused them: Notify only queues, and drops when the queue
// is full.
package push

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

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
	// MaxTokenBytes bounds an ntfy access token.
	MaxTokenBytes = 256
	// TargetTTL is how long a registration is kept without being renewed.
	TargetTTL = 30 * 24 * time.Hour
	// SignatureHeader carries a webhook body's signature.
	SignatureHeader = "X-Hermes-Signature"
)

// ntfyTopic is ntfy's topic name rule (server/server.go, topicRegex).
var ntfyTopic = regexp.MustCompile(`^[-_A-Za-z0-9]{1,64}$`)

// Target is a device's push endpoint, as registered.
type Target struct {
	Kind  string `json:"kind"`
	URL   string `json:"url"`
	Token string `json:"token,omitempty"` // ntfy: an access token
}

// Validate reports what is wrong with t: an unknown kind, a URL that is
// not absolute http(s) or longer than MaxURLBytes, an ntfy URL that is not
// https://host/<topic>, a token where none is taken or too long.
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
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil {
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
		return fmt.Errorf("token is longer than %d bytes", MaxTokenBytes)
	}
	return nil
}

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
	// Queue bounds the notifications waiting to be sent (1024); past it
	// they are dropped (hermes_push_dropped_total).
	Queue int
	// Workers send at once (4).
	Workers int
	// Attempts bounds the tries of one notification (5), with Backoff
	// (1 s) doubling between them, up to 1 min.
	Attempts int
	Backoff  time.Duration
	// Timeout bounds one request (10 s).
	Timeout time.Duration
	// Client sends the requests; nil is a client of its own.
	Client  *http.Client
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
		c.Workers = 4
	}
	if c.Attempts <= 0 {
		c.Attempts = 5
	}
	if c.Backoff <= 0 {
		c.Backoff = time.Second
	}
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
	if c.Client == nil {
		c.Client = &http.Client{}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
}

// Notifier sends the notifications. Create it with New; Close stops it.
type Notifier struct {
	cfg   Config
	queue chan Notice
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup
}

// New starts a Notifier's workers.
func New(cfg Config) *Notifier {
	cfg.setDefaults()
	n := &Notifier{cfg: cfg, queue: make(chan Notice, cfg.Queue)}
	n.ctx, n.stop = context.WithCancel(context.Background())
	for range cfg.Workers {
		n.wg.Add(1)
		go n.work()
	}
	return n
}

// Close stops the workers, dropping what waits, and waits for them.
func (n *Notifier) Close() {
	n.stop()
	n.wg.Wait()
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

func (n *Notifier) work() {
	defer n.wg.Done()
	for {
		select {
		case <-n.ctx.Done():
			return
		case nt := <-n.queue:
			n.handle(nt)
		}
	}
}

// burstKey is the store claim that coalesces a device's notifications.
func burstKey(device string) string { return "push:" + device }

// handle sends nt unless the device was notified in this burst or has no
// target. A notification that fails every attempt releases the burst's
// claim, so the next output tries again.
func (n *Notifier) handle(nt Notice) {
	ctx, cancel := context.WithTimeout(n.ctx, 5*time.Second)
	defer cancel()
	data, err := n.cfg.Store.PushTarget(ctx, nt.Device)
	if errors.Is(err, store.ErrNotFound) {
		return
	}
	if err != nil {
		n.metric(Metrics.PushFailed)
		n.cfg.Log.Warn("push target not read; notification dropped", "device", nt.Device, "err", err)
		return
	}
	var t Target
	if err := json.Unmarshal(data, &t); err != nil {
		n.metric(Metrics.PushFailed)
		n.cfg.Log.Warn("push target unreadable; notification dropped", "device", nt.Device, "err", err)
		return
	}
	attempt := ids.New("push")
	ok, err := n.cfg.Store.Claim(ctx, burstKey(nt.Device), attempt, n.cfg.Every)
	if errors.Is(err, store.ErrPending) || (err == nil && !ok) {
		return // notified in this burst
	}
	if err != nil {
		n.metric(Metrics.PushFailed)
		n.cfg.Log.Warn("push burst claim failed; notification dropped", "device", nt.Device, "err", err)
		return
	}
	wait := n.cfg.Backoff
	for i := 1; ; i++ {
		err := n.send(t, nt)
		if err == nil {
			n.metric(Metrics.PushSent)
			return
		}
		var perm *permanent
		if i >= n.cfg.Attempts || errors.As(err, &perm) {
			n.metric(Metrics.PushFailed)
			n.cfg.Log.Warn("push notification failed", "device", nt.Device, "kind", t.Kind, "attempts", i, "err", err)
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = n.cfg.Store.Release(rctx, burstKey(nt.Device), attempt)
			cancel()
			return
		}
		select {
		case <-n.ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Minute)
	}
}

// permanent is a failure a retry would not change (the endpoint is gone
// or refuses the request).
type permanent struct{ error }

// send makes one attempt.
func (n *Notifier) send(t Target, nt Notice) error {
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.Timeout)
	defer cancel()
	var req *http.Request
	var err error
	switch t.Kind {
	case KindNtfy:
		msg := "New message from your agent"
		if nt.Text != "" {
			msg = nt.Text
		}
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, t.URL, strings.NewReader(msg))
		if err != nil {
			return &permanent{err}
		}
		req.Header.Set("X-Title", "Hermes")
		req.Header.Set("X-Priority", "4")
		req.Header.Set("X-Tags", "speech_balloon")
		if t.Token != "" {
			req.Header.Set("Authorization", "Bearer "+t.Token)
		}
	default:
		body, _ := json.Marshal(nt)
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, t.URL, bytes.NewReader(body))
		if err != nil {
			return &permanent{err}
		}
		req.Header.Set("Content-Type", "application/json")
		if t.Kind == KindWebhook && len(n.cfg.Key) > 0 {
			req.Header.Set(SignatureHeader, Sign(n.cfg.Key, body))
		}
		if t.Kind == KindUnifiedPush {
			req.Header.Set("TTL", "86400") // the RFC 8030 header UnifiedPush servers take
			req.Header.Set("Urgency", "high")
		}
	}
	resp, err := n.cfg.Client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return nil
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return fmt.Errorf("push endpoint answered %s", resp.Status)
	default:
		return &permanent{fmt.Errorf("push endpoint answered %s", resp.Status)}
	}
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
