// Package natsbus implements bus.Bus on NATS (github.com/nats-io/nats.go),
// against an external server (Connect) or a nats-server embedded in the
// process (Embedded, and ConnectInProcess for more connections to it).
//
// # Dispatch
//
// An edge holds one subscription per connected device, so one Bus may hold
// 100k subscriptions. nats.go's callback Subscribe starts a goroutine per
// subscription, so natsbus never uses it. A Bus runs a fixed set of
// dispatchers instead (Options.Dispatchers): each is one goroutine draining
// its own buffered channel. Every subscription is a nats.go channel
// subscription (ChanSubscribe, ChanQueueSubscribe) that feeds the channel of
// the dispatcher picked by a hash of the subscription's subject.
//
// nats.go's reader puts the messages of a connection into those channels in
// the order they arrive, and each channel has exactly one reader, so the
// messages of a subscription reach its Handler one at a time and in arrival
// order, while subscriptions on different subjects run in parallel on
// different dispatchers. A wildcard subscription is serialized as a whole,
// which is stronger than the contract asks. A single shared channel would
// need a routing goroutine and a second set of queues to keep that order;
// a channel per dispatcher needs neither.
//
// Each dispatcher maps *nats.Subscription to its Handler. Subscribe holds
// the dispatcher's lock across ChanSubscribe, so no message is looked up
// before its Handler is registered. Unsubscribe drains: the entry stays,
// marked late, until a marker sent behind the subscription's last message
// (after the server confirmed the unsubscribe) reaches the dispatcher, so
// messages routed before the unsubscribe are still handled. A Handler call
// already running when Unsubscribe returns still finishes.
//
// The channels are the pending limit: when a dispatcher's channel is full,
// nats.go drops the message and reports a slow consumer, which is logged.
// Handlers must hand long work off. A panicking Handler is logged and the
// dispatcher goes on.
//
// # Errors
//
// Request returns an error wrapping bus.ErrNoResponders when nobody
// listens. While the connection is down (reconnecting, closed, or its Bus
// closed) Publish, Request and Subscribe return errors wrapping
// bus.ErrUnavailable at once: publishes are not buffered for a later
// reconnect. A Request whose ctx ends returns the ctx error, also wrapping
// bus.ErrUnavailable when the connection was down at that moment.
//
// A subject longer than MaxSubjectBytes (with the prefix) is refused with
// ErrSubjectTooLong before anything is sent: the server would close the
// whole connection over it ("maximum control line exceeded").
//
// When nats.go gives up on the connection for good (it was closed by the
// server and could not be re-established), Err says so: the process cannot
// recover by itself and its liveness probe should fail.
package natsbus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	neturl "net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hermes-mobile/gateway/internal/batch"
	"github.com/hermes-mobile/gateway/internal/retry"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
)

var _ bus.Bus = (*Bus)(nil)

// Defaults for Options.
const (
	// DefaultName is the connection name when Options.Name is empty.
	DefaultName = "hermes-gateway"
	// DefaultPending is the default of Options.Pending.
	DefaultPending = 1 << 18
	// MaxPayload is the largest message the embedded server accepts.
	MaxPayload = 8 << 20

	minDispatchers   = 4
	maxDispatchers   = 32
	minPerDispatcher = 1024
	reconnectMin     = 25 * time.Millisecond
	reconnectMax     = 2 * time.Second
	pingInterval     = 10 * time.Second
	closeWait        = 5 * time.Second
	startWait        = 10 * time.Second
)

// Options configures a Bus. The zero value is usable.
type Options struct {
	// SubjectPrefix is put in front of every subject (NATS_PREFIX), so
	// several gateways can share one NATS; it ends with a dot, e.g. "gw1.".
	// Handlers see subjects without it. The replies to requests come on
	// inboxes under it too (InboxPrefix), so a NATS user allowed only
	// "gw1.>" is all a gateway needs.
	SubjectPrefix string
	// Name is the connection name the server shows; DefaultName if empty.
	Name string
	// Logger receives connection events and dropped messages; nil discards.
	Logger *slog.Logger
	// Dispatchers is the number of goroutines running Handlers; 0 means
	// GOMAXPROCS, kept within 4..32.
	Dispatchers int
	// Pending is how many received messages a Bus buffers for its Handlers
	// before it drops them as a slow consumer, split evenly among the
	// dispatchers (at least 1024 each); 0 means DefaultPending.
	Pending int
	// Telemetry counts the connection's losses and reconnects
	// (hermes_nats_disconnects_total, hermes_nats_reconnects_total) and
	// its slow consumers (hermes_nats_slow_consumers_total); nil counts
	// nothing.
	Telemetry *telemetry.Telemetry
	// RetryConnect makes Connect return at once, before the server is
	// reached: the first connection is retried as a lost one is, forever,
	// with the same backoff. WaitConnected waits for it; until then
	// Publish, Request and Subscribe fail with bus.ErrUnavailable. Without
	// it Connect fails when the server cannot be reached.
	RetryConnect bool
}

// InboxPrefix is where the replies to a Bus's requests come: "_INBOX", or
// under the subject prefix ("gw1._INBOX" for "gw1."), so that one
// permission covers every subject a gateway uses. Replies are opaque to
// whoever answers them: processes of either form work together.
func InboxPrefix(subjectPrefix string) string {
	return subjectPrefix + "_INBOX"
}

// connectLogEvery spaces the log lines of failed connection attempts: the
// first is logged at once, then one per interval at most, with the count.
const connectLogEvery = 10 * time.Second

// Bus is a bus.Bus on one NATS connection. Its methods are safe for
// concurrent use. A Handler must not call Close.
type Bus struct {
	nc     *nats.Conn
	prefix string // Options.SubjectPrefix
	log    *slog.Logger
	srv    *server.Server // embedded server this Bus owns and shuts down, or nil
	inproc *server.Server // server reached in-process, or nil

	shards []*shard
	// flushes confirms new subscriptions with the server: one round trip
	// (PING/PONG) for every subscription made while the previous was out.
	flushes batch.Batcher[struct{}, error]
	quit    chan struct{}  // closed by Close: dispatchers return
	wg      sync.WaitGroup // dispatchers
	closed  chan struct{}  // closed by nats.go's ClosedHandler
	up      chan struct{}  // closed once the first connection is made
	upOnce  sync.Once
	url     string // the server URLs, without credentials, for the log

	// Failed connection attempts since the last connection, for the log.
	dialFails atomic.Int64
	dialLog   retry.Every

	closeOnce sync.Once
	closing   atomic.Bool // Close began: the disconnect that follows is ours
	metrics   *telemetry.Metrics

	// Requests in flight, failed at once when the connection drops: their
	// replies can no longer arrive.
	reqMu   sync.Mutex
	reqs    map[uint64]context.CancelCauseFunc
	nextReq uint64
}

// MaxSubjectBytes bounds a subject, prefix included. The server's control
// line ("HPUB <subject> <reply> <sizes>") is at most 4096 bytes; the bound
// leaves room for the reply inbox and sizes. The longest device subject, a
// 120-character id escaped byte by byte, is under 1,500 bytes.
const MaxSubjectBytes = 2048

// ErrSubjectTooLong is returned for a subject over MaxSubjectBytes.
var ErrSubjectTooLong = errors.New("natsbus: subject too long")

// errDisconnected is the cause of requests cut off by a disconnect.
var errDisconnected = fmt.Errorf("natsbus: %w: connection lost during the request", bus.ErrUnavailable)

// Connect connects to the NATS server(s) at url (comma-separated URLs are
// allowed). Once connected the Bus reconnects forever, with backoff; if the
// first connection fails, Connect returns an error wrapping
// bus.ErrUnavailable.
func Connect(url string, opts Options) (*Bus, error) {
	return dial(url, nil, opts)
}

// ConnectInProcess connects to srv, a running nats-server in this process,
// without a socket: the way to reach an Embedded Bus's Server() from a
// second Bus. Closing this Bus leaves srv running.
func ConnectInProcess(srv *server.Server, opts Options) (*Bus, error) {
	if srv == nil {
		return nil, errors.New("natsbus: ConnectInProcess: nil server")
	}
	return dial("", srv, opts)
}

// Server returns the nats-server this Bus is connected to in-process, or nil
// for a socket connection. For a Bus from Embedded it is the server Close
// shuts down.
func (b *Bus) Server() *server.Server { return b.inproc }

func dial(url string, inproc *server.Server, opts Options) (*Bus, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	name := opts.Name
	if name == "" {
		name = DefaultName
	}
	b := &Bus{
		prefix:  opts.SubjectPrefix,
		log:     log.With("component", "natsbus", "conn", name),
		inproc:  inproc,
		quit:    make(chan struct{}),
		closed:  make(chan struct{}),
		up:      make(chan struct{}),
		url:     redactURLs(url),
		metrics: opts.Telemetry.Metrics(),
		dialLog: retry.Every{Interval: connectLogEvery},
	}
	b.shards = newShards(opts.Dispatchers, opts.Pending)
	b.flushes.Run = func(in []struct{}) []error {
		err := b.nc.FlushTimeout(flushWait)
		out := make([]error, len(in))
		for i := range out {
			out[i] = err
		}
		return out
	}

	nopts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.CustomReconnectDelay(reconnectDelay),
		// Fail publishes while disconnected instead of buffering them for a
		// reconnect that may come too late: callers retry on ErrUnavailable.
		nats.ReconnectBufSize(-1),
		nats.PingInterval(pingInterval),
		nats.DisconnectErrHandler(b.onDisconnect),
		nats.ReconnectHandler(b.onReconnect),
		nats.ReconnectErrHandler(b.onConnectError),
		nats.ConnectHandler(b.onConnect),
		nats.ClosedHandler(b.onClosed),
		nats.ErrorHandler(b.onAsyncError),
		nats.RetryOnFailedConnect(opts.RetryConnect),
	}
	if inproc != nil {
		nopts = append(nopts, nats.InProcessServer(inproc))
	}
	if opts.SubjectPrefix != "" {
		nopts = append(nopts, nats.CustomInboxPrefix(InboxPrefix(opts.SubjectPrefix)))
	}
	nc, err := nats.Connect(url, nopts...)
	if err != nil {
		if unavailable(err) {
			return nil, fmt.Errorf("natsbus: connect %s: %w: %w", b.url, bus.ErrUnavailable, err)
		}
		return nil, fmt.Errorf("natsbus: connect %s: %w", b.url, err)
	}
	b.nc = nc
	if nc.IsConnected() {
		b.onConnect(nc) // so "nats connected" comes first; the handler's call is then a no-op
	} else {
		b.log.Info("waiting for nats", "url", b.url)
	}
	b.start()
	return b, nil
}

// WaitConnected waits until the Bus has connected for the first time
// (at once unless Options.RetryConnect), ctx ends, or the Bus is closed.
func (b *Bus) WaitConnected(ctx context.Context) error {
	select {
	case <-b.up:
		return nil
	case <-b.closed:
		if err := b.Err(); err != nil {
			return err
		}
		return errors.New("natsbus: closed before it connected")
	case <-ctx.Done():
		return fmt.Errorf("natsbus: waiting for %s: %w", b.url, context.Cause(ctx))
	}
}

// onConnect marks the first connection, once.
func (b *Bus) onConnect(nc *nats.Conn) {
	b.upOnce.Do(func() {
		b.metrics.NATSConnected()
		b.dialFails.Store(0)
		b.dialLog.Reset()
		b.log.Info("nats connected", "url", b.connectedURL(nc), "server", nc.ConnectedServerName())
		close(b.up)
	})
}

// connectedURL is the server's URL for the log, without credentials, or
// "in-process" for a server reached in-process: nats.go reports its
// default URL (nats://127.0.0.1:4222) for one, where nothing listens.
func (b *Bus) connectedURL(nc *nats.Conn) string {
	if b.inproc != nil {
		return "in-process"
	}
	return nc.ConnectedUrlRedacted()
}

// onConnectError logs a failed attempt to connect or reconnect, spaced by
// connectLogEvery.
func (b *Bus) onConnectError(_ *nats.Conn, err error) {
	if errors.Is(err, nats.ErrNoServers) && b.dialFails.Load() == 0 {
		// nats.go's summary of a failed first connect, which hides the
		// dial error; the next attempt, 25 ms later, reports that.
		return
	}
	n := b.dialFails.Add(1)
	if b.dialLog.Allow() {
		b.log.Warn("nats not reachable; retrying", "url", b.url, "attempts", n, "err", err)
	}
}

// redactURLs is a comma-separated list of server URLs without their
// passwords, for the log and errors.
func redactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if u, err := neturl.Parse(p); err == nil && u.Host != "" {
			p = u.Redacted()
		} else if strings.Contains(p, "@") {
			p = "(a URL with credentials)"
		}
		parts[i] = p
	}
	return strings.Join(parts, ",")
}

// reconnectDelay backs off from reconnectMin to reconnectMax, with up to 25%
// jitter so a fleet does not reconnect in step.
func reconnectDelay(attempts int) time.Duration {
	d := reconnectMax
	if attempts < 10 {
		d = min(reconnectMin<<attempts, reconnectMax)
	}
	return d + rand.N(d/4+1)
}

// Publish sends data to subject without waiting.
func (b *Bus) Publish(ctx context.Context, subject string, data []byte, header map[string]string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := b.checkSubject(subject); err != nil {
		return err
	}
	header = telemetry.Inject(ctx, header) // the W3C trace context, when ctx has a span
	m := &nats.Msg{Subject: b.prefix + subject, Data: data, Header: toNATSHeader(header)}
	if err := b.nc.PublishMsg(m); err != nil {
		return opErr("publish", subject, err)
	}
	return nil
}

// Request sends data to subject and waits for the first reply, or for ctx.
func (b *Bus) Request(ctx context.Context, subject string, data []byte, header map[string]string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := b.checkSubject(subject); err != nil {
		return nil, err
	}
	header = telemetry.Inject(ctx, header)
	m := &nats.Msg{Subject: b.prefix + subject, Data: data, Header: toNATSHeader(header)}
	ctx, done := b.trackRequest(ctx)
	defer done()
	resp, err := b.nc.RequestMsgWithContext(ctx, m)
	if err == nil {
		return resp.Data, nil
	}
	if cause := context.Cause(ctx); errors.Is(cause, errDisconnected) {
		return nil, fmt.Errorf("natsbus: request %s: %w", subject, cause)
	}
	if cerr := ctx.Err(); cerr != nil && errors.Is(err, cerr) {
		if !b.nc.IsConnected() {
			return nil, fmt.Errorf("natsbus: request %s: %w: %w", subject, bus.ErrUnavailable, cerr)
		}
		return nil, cerr
	}
	return nil, opErr("request", subject, err)
}

// checkSubject refuses a subject the server would close the connection over.
func (b *Bus) checkSubject(subject string) error {
	if n := len(b.prefix) + len(subject); n > MaxSubjectBytes {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrSubjectTooLong, n, MaxSubjectBytes)
	}
	return nil
}

// Err returns nil while the connection is up or being re-established, and
// an error once it is closed for good (by nats.go or by Close): nothing
// sent on this Bus can arrive any more.
func (b *Bus) Err() error {
	select {
	case <-b.closed:
		if err := b.nc.LastError(); err != nil {
			return fmt.Errorf("natsbus: connection closed: %w", err)
		}
		return errors.New("natsbus: connection closed")
	default:
		return nil
	}
}

// Subscribe delivers every message on subject to h.
func (b *Bus) Subscribe(subject string, h bus.Handler) (bus.Subscription, error) {
	return b.subscribe(subject, "", h)
}

// QueueSubscribe delivers each message on subject to one member of queue.
func (b *Bus) QueueSubscribe(subject, queue string, h bus.Handler) (bus.Subscription, error) {
	if queue == "" {
		return nil, fmt.Errorf("natsbus: subscribe %s: empty queue", subject)
	}
	return b.subscribe(subject, queue, h)
}

// Close closes the connection without draining (nats.go drains each
// subscription on a goroutine of its own), waits for the dispatchers and the
// Handlers running on them to return, and shuts down a server started by
// Embedded. Messages not yet handled are dropped. Close is idempotent.
func (b *Bus) Close() error {
	b.closeOnce.Do(func() {
		b.closing.Store(true)
		b.nc.Close()
		select {
		case <-b.closed:
		case <-time.After(closeWait):
			b.log.Warn("nats close callback did not run", "wait", closeWait)
		}
		close(b.quit)
		b.wg.Wait()
		if b.srv != nil {
			b.srv.Shutdown()
			b.srv.WaitForShutdown()
		}
		b.log.Info("bus closed")
	})
	return nil
}

// trackRequest registers a request so a disconnect can fail it.
func (b *Bus) trackRequest(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	b.reqMu.Lock()
	if b.reqs == nil {
		b.reqs = make(map[uint64]context.CancelCauseFunc)
	}
	b.nextReq++
	id := b.nextReq
	b.reqs[id] = cancel
	b.reqMu.Unlock()
	return ctx, func() {
		b.reqMu.Lock()
		delete(b.reqs, id)
		b.reqMu.Unlock()
		cancel(nil)
	}
}

func (b *Bus) onDisconnect(_ *nats.Conn, err error) {
	b.reqMu.Lock()
	for _, cancel := range b.reqs {
		cancel(errDisconnected)
	}
	b.reqMu.Unlock()
	if !b.closing.Load() {
		b.metrics.NATSDisconnected()
	}
	if err != nil {
		b.log.Warn("nats disconnected", "err", err)
	} else {
		b.log.Info("nats disconnected")
	}
}

func (b *Bus) onReconnect(nc *nats.Conn) {
	b.dialFails.Store(0)
	b.dialLog.Reset()
	b.metrics.NATSReconnected()
	b.log.Info("nats reconnected", "url", b.connectedURL(nc))
}

func (b *Bus) onClosed(nc *nats.Conn) {
	if err := nc.LastError(); err != nil {
		b.log.Warn("nats connection closed", "err", err)
	}
	close(b.closed)
}

func (b *Bus) onAsyncError(_ *nats.Conn, sub *nats.Subscription, err error) {
	if errors.Is(err, nats.ErrSlowConsumer) {
		// nats.go reports a subscription once each time it begins
		// dropping, not per message.
		b.metrics.NATSSlowConsumer()
	}
	if sub == nil {
		b.log.Warn("nats error", "err", err)
		return
	}
	if errors.Is(err, nats.ErrSlowConsumer) {
		dropped, _ := sub.Dropped()
		b.log.Warn("slow consumer: messages dropped", "subject", sub.Subject, "queue", sub.Queue, "dropped", dropped)
		return
	}
	b.log.Warn("nats subscription error", "subject", sub.Subject, "queue", sub.Queue, "err", err)
}

// opErr maps a nats.go error to the bus errors.
func opErr(op, subject string, err error) error {
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("natsbus: %s %s: %w", op, subject, bus.ErrNoResponders)
	case unavailable(err):
		return fmt.Errorf("natsbus: %s %s: %w: %w", op, subject, bus.ErrUnavailable, err)
	}
	return fmt.Errorf("natsbus: %s %s: %w", op, subject, err)
}

// unavailable tells whether err means the server cannot be reached now.
func unavailable(err error) bool {
	var nerr net.Error
	return errors.Is(err, nats.ErrConnectionClosed) ||
		errors.Is(err, nats.ErrConnectionDraining) ||
		errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, nats.ErrDisconnected) ||
		errors.Is(err, nats.ErrReconnectBufExceeded) ||
		errors.Is(err, nats.ErrNoServers) ||
		errors.Is(err, nats.ErrInvalidConnection) ||
		errors.Is(err, nats.ErrStaleConnection) ||
		errors.As(err, &nerr)
}

func toNATSHeader(h map[string]string) nats.Header {
	if len(h) == 0 {
		return nil
	}
	nh := make(nats.Header, len(h))
	for k, v := range h {
		nh[k] = []string{v}
	}
	return nh
}

func fromNATSHeader(nh nats.Header) map[string]string {
	if len(nh) == 0 {
		return nil
	}
	h := make(map[string]string, len(nh))
	for k, vs := range nh {
		if len(vs) > 0 {
			h[k] = vs[0]
		}
	}
	return h
}

func defaultDispatchers() int {
	return min(max(runtime.GOMAXPROCS(0), minDispatchers), maxDispatchers)
}
