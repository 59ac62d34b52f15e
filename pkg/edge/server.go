// Package edge is the WebSocket side of the gateway: it upgrades connections
// with zero-copy gobwas/ws, runs Protocol v1 for each phone, and writes the
// frames that the agent side sends to the devices it owns.
//
// An idle connection costs no goroutine: the socket is registered with epoll
// (see poller_linux.go) and a goroutine exists only while a frame is being
// read or written. Read buffers come from a pool and are held only while a
// frame is in flight.
package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"

	"github.com/hermes-mobile/gateway/internal/retry"
	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/ids"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/push"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
	"github.com/hermes-mobile/gateway/pkg/tenant"
	"github.com/hermes-mobile/gateway/pkg/usage"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// Config of an edge node. Zero durations and sizes take the defaults below.
type Config struct {
	// ID names this edge in owner records; random when empty.
	ID   string
	Auth AuthConfig
	// HomeDevice is the target of a deliver without one (MOBILE_HOME_DEVICE).
	HomeDevice string
	// AvatarURL is sent in ready (MOBILE_AVATAR_URL). When empty and Pages
	// serves AvatarPath, ready names that page at the host the phone
	// connected to.
	AvatarURL string
	// Pages serves the plain HTTP requests (any path but /ws) that come to
	// the WebSocket listener: the avatar page and the browser client. Nil
	// answers them 404 as before.
	Pages http.Handler
	// AvatarPath is where Pages serves the avatar page ("/avatar/").
	AvatarPath string
	// PageTimeout bounds a page request's headers once its request line
	// came, and the whole request (10 s); a page connection idle between
	// requests is closed after 6 × PageTimeout and a response must be
	// written within 3 × PageTimeout. The pages read no body: a request
	// that announces one is answered and its connection closed.
	PageTimeout time.Duration
	// MaxPageConns bounds the open page connections of the edge (1024);
	// past it a page request is answered 503 and closed at once. Phones
	// (/ws) never count against it nor wait behind it.
	MaxPageConns int

	HelloTimeout time.Duration // first frame must be hello within (15 s)
	TypingIdle   time.Duration // speaking → idle without messages (3 s)
	ThinkingIdle time.Duration // thinking → idle without any agent frame (30 s)
	// ReadTimeout bounds the arrival of one whole message once its first
	// byte came (60 s): a peer cannot hold a read buffer open forever.
	ReadTimeout time.Duration
	// WriteTimeout bounds a write to the socket during which the peer
	// acknowledges nothing (10 s): a peer that stops reading is
	// disconnected within 1.25 × WriteTimeout of its last acknowledgement,
	// a slow one is not.
	WriteTimeout time.Duration
	// MaxOutboundBytes bounds the frames queued for one connection (32 MiB);
	// past it the connection is closed as a slow reader.
	MaxOutboundBytes int
	// MaxReadBytes bounds the bytes of messages being read, across the edge
	// (256 MiB). A message past the 16 KiB each socket reads into reserves
	// its length from it when its frame header arrives, before any payload
	// is buffered; one that does not fit is refused on the header alone
	// with a fatal internal_error (close 1008): the phone reconnects and
	// sends it again, and sockets reading small frames are not affected.
	MaxReadBytes int64
	// MaxHelloConns bounds the sockets in the hello phase (upgraded, hello
	// not answered yet) across the edge (10,000), and MaxHelloBytes what
	// their messages may hold (16 MiB): each holds at most a 4 KiB reader
	// and an 8 KiB message, so the phase admits at most MaxHelloBytes /
	// 12 KiB sockets too (1,365 by default). MaxHelloConnsPerAddr bounds the strangers
	// (sockets whose hello was not accepted yet) of one source, a client
	// address after the trusted-proxy rules, IPv4 addresses grouped by
	// HelloPrefixV4 bits (32) and IPv6 ones by HelloPrefixV6 (64) (256).
	// Past a bound a stranger that holds more than its share, or has
	// waited HelloTimeout/8, gives its place to the newcomer (see
	// admission.go); when none can, the upgrade is refused with HTTP 503
	// and a Retry-After.
	MaxHelloBytes        int64
	MaxHelloConns        int
	MaxHelloConnsPerAddr int
	HelloPrefixV4        int
	HelloPrefixV6        int
	// MaxQueuedBytes bounds the bytes queued outbound, across the edge
	// (256 MiB). Past it, a frame for a connection that already has more
	// than 1 MiB queued closes that connection as a slow reader (its
	// undelivered output goes to the outbox); a connection with less still
	// queues, so a phone that reads keeps its traffic whatever others hold.
	MaxQueuedBytes int64
	// MaxUploadBytes bounds the bytes of unfinished multi-part uploads the
	// edge's connections hold in the store (256 MiB), each part counted
	// until its file completes or its connection closes. A part that does
	// not fit gets internal_error and is not stored: the phone sends it
	// again later.
	MaxUploadBytes int64
	// PingInterval is the keepalive period (30 s): a socket that sent
	// nothing for PingInterval gets a WebSocket ping at the next sweep, and
	// one still silent after PingMisses more intervals is closed. One sweep
	// per edge does it; connections hold no timer.
	PingInterval time.Duration
	// PingMisses is how many unanswered keepalive intervals are tolerated
	// after the first (2).
	PingMisses int
	// OwnerTTL is how long the edge's lease lives without its heartbeat
	// (30 s): once it lapses, the owner records naming the edge read as
	// none. The heartbeat renews it every OwnerTTL/3; the records
	// themselves live 120 × OwnerTTL and are refreshed every third of that.
	OwnerTTL time.Duration
	// BlobTTL is how long uploaded media stays in the store for the agent (15 min).
	BlobTTL time.Duration
	// OpTimeout bounds one store or bus call made for a frame (5 s).
	OpTimeout time.Duration
	// AckWait is how long a delivery to a phone that acknowledges what it
	// displays waits for the phone's ack (10 s; less than the dispatcher's
	// 15 s): past it the delivery counts as not delivered and the router
	// keeps it for the outbox.
	AckWait time.Duration
	// ClaimTTL is how long a message id stays claimed by a connection that
	// has not handed the message over yet (3 × OpTimeout): a resend of the
	// id meanwhile is told to send again; after it, a claim whose holder
	// died or lost its reply no longer blocks the resend.
	ClaimTTL time.Duration
	// Telemetry receives the edge's metrics and spans; nil records nothing.
	Telemetry *telemetry.Telemetry
	// Usage counts each owner's sockets, messages and deliveries (the
	// process's one recorder, pkg/usage); nil counts nothing.
	Usage *usage.Recorder
	// Outbox keeps a deliver frame with a ttl that its device cannot take
	// now (the process's outbox, as the router's API keeps one); nil
	// refuses a ttl.
	Outbox *dispatch.Outbox
	// Push registers the push token an app sends in a push frame, for
	// its own device, and names the kinds it takes (ready's
	// capabilities.push): the notifier of the process's outbox. Nil
	// takes none.
	Push *push.Notifier
	// DeviceSubjects: besides its edge subject, subscribe to each held
	// device's subject and announce takeovers there too, as edges did
	// before edge subjects, so that routers and edges of that release
	// still reach this edge's phones during a rolling upgrade. It costs
	// a subscription per phone (in the edge and the NATS server).
	//
	// shim(v0.2.0): routers and edges of the release before edge
	// subjects (MOBILE_DEVICE_SUBJECTS, and what it turns on).
	DeviceSubjects bool
}

// DefaultConfig is the configuration a zero Config stands for (ID aside),
// so that flags show the real defaults without repeating them.
func DefaultConfig() Config {
	var c Config
	c.setDefaults()
	c.ID = ""
	return c
}

// Validate reports every setting that cannot work, naming it by its
// environment variable when it has one (MOBILE_OWNER_TTL: …); zero values
// stand for their defaults and are valid.
func (c Config) Validate() error {
	var errs []error
	for name, d := range map[string]time.Duration{"HelloTimeout": c.HelloTimeout, "TypingIdle": c.TypingIdle,
		"ThinkingIdle": c.ThinkingIdle, "ReadTimeout": c.ReadTimeout, "WriteTimeout": c.WriteTimeout,
		"PingInterval": c.PingInterval, "OwnerTTL": c.OwnerTTL, "BlobTTL": c.BlobTTL, "OpTimeout": c.OpTimeout,
		"AckWait": c.AckWait, "ClaimTTL": c.ClaimTTL, "PageTimeout": c.PageTimeout} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s: %v is negative", setting(name), d))
		}
	}
	for name, n := range map[string]int64{"MaxOutboundBytes": int64(c.MaxOutboundBytes), "MaxReadBytes": c.MaxReadBytes,
		"MaxQueuedBytes": c.MaxQueuedBytes, "MaxUploadBytes": c.MaxUploadBytes, "PingMisses": int64(c.PingMisses),
		"MaxHelloBytes": c.MaxHelloBytes, "MaxHelloConns": int64(c.MaxHelloConns), "MaxHelloConnsPerAddr": int64(c.MaxHelloConnsPerAddr),
		"HelloPrefixV4": int64(c.HelloPrefixV4), "HelloPrefixV6": int64(c.HelloPrefixV6),
		"MaxPageConns": int64(c.MaxPageConns)} {
		if n < 0 {
			errs = append(errs, fmt.Errorf("%s: %d is negative", setting(name), n))
		}
	}
	if c.HelloPrefixV4 > 32 {
		errs = append(errs, fmt.Errorf("%s: %d is more bits than an IPv4 address has", setting("HelloPrefixV4"), c.HelloPrefixV4))
	}
	if c.HelloPrefixV6 > 128 {
		errs = append(errs, fmt.Errorf("%s: %d is more bits than an IPv6 address has", setting("HelloPrefixV6"), c.HelloPrefixV6))
	}
	if c.MaxHelloBytes > 0 && c.MaxHelloBytes < helloSocketBytes {
		errs = append(errs, fmt.Errorf("%s: %d bytes is less than one socket in the hello phase may hold (%d)", setting("MaxHelloBytes"), c.MaxHelloBytes, helloSocketBytes))
	}
	if c.AckWait >= dispatch.DefaultTimeout {
		// The router stops waiting for the delivery first: every phone
		// that acks would have its messages counted as not delivered.
		errs = append(errs, fmt.Errorf("%s: %v must be shorter than a delivery's %v", setting("AckWait"), c.AckWait, dispatch.DefaultTimeout))
	}
	if c.OwnerTTL > 0 && c.OwnerTTL < 3*time.Second {
		errs = append(errs, fmt.Errorf("%s: %v is under 3 s: the heartbeat runs every third of it", setting("OwnerTTL"), c.OwnerTTL))
	}
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return errors.Join(errs...)
}

func (c *Config) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.HelloTimeout, protocol.HelloTimeout)
	def(&c.TypingIdle, protocol.TypingIdle)
	def(&c.ThinkingIdle, 30*time.Second)
	def(&c.ReadTimeout, 60*time.Second)
	def(&c.WriteTimeout, 10*time.Second)
	def(&c.OwnerTTL, 30*time.Second)
	def(&c.BlobTTL, 15*time.Minute)
	def(&c.OpTimeout, 5*time.Second)
	def(&c.ClaimTTL, 3*c.OpTimeout)
	def(&c.AckWait, 10*time.Second)
	def(&c.PingInterval, 30*time.Second)
	def(&c.PageTimeout, handshakeTimeout)
	if c.MaxPageConns <= 0 {
		c.MaxPageConns = 1024
	}
	if c.PingMisses <= 0 {
		c.PingMisses = 2
	}
	if c.MaxOutboundBytes <= 0 {
		c.MaxOutboundBytes = 32 << 20
	}
	for _, b := range []*int64{&c.MaxReadBytes, &c.MaxQueuedBytes, &c.MaxUploadBytes} {
		if *b <= 0 {
			*b = DefaultBudgetBytes
		}
	}
	if c.MaxHelloBytes <= 0 {
		c.MaxHelloBytes = DefaultHelloBytes
	}
	if c.MaxHelloConns <= 0 {
		c.MaxHelloConns = DefaultHelloConns
	}
	if c.MaxHelloConnsPerAddr <= 0 {
		c.MaxHelloConnsPerAddr = DefaultHelloConnsPerAddr
	}
	if c.HelloPrefixV4 <= 0 {
		c.HelloPrefixV4 = DefaultHelloPrefixV4
	}
	if c.HelloPrefixV6 <= 0 {
		c.HelloPrefixV6 = DefaultHelloPrefixV6
	}
	if c.ID == "" {
		c.ID = "edge-" + ids.Hex(4)
	}
}

// Server is one edge node.
type Server struct {
	cfg    Config
	log    *slog.Logger
	store  store.Store
	bus    bus.Bus
	auth   *authenticator
	poller *poller // nil: every connection gets a reading goroutine
	sender *dispatch.Dispatcher
	// deliverer carries out deliver frames, through sender.
	deliverer *dispatch.Deliverer
	owners    *ownerReads      // the fence's and the hello's owner reads, batched
	batchSub  bus.Subscription // this edge's subject (wire.Batch); nil if it failed
	outSub    bus.Subscription // this edge's output subject; nil if it failed
	tel       edgeTelemetry
	// stopRevoke ends the tenants file's calls of revoke.
	stopRevoke func()

	ctx     context.Context // cancelled by Close
	cancel  context.CancelFunc
	wg      sync.WaitGroup // every goroutine the server starts, until Close waits
	gmu     sync.Mutex     // guards waiting against wg.Add
	waiting bool
	workers *workers // the goroutines goFunc reuses

	// mu guards lns and closed, and the fields of registry and admission
	// that say they are under Server.mu.
	mu     sync.Mutex
	lns    []net.Listener
	closed bool
	// releasing counts the store clean-ups of closed connections, so
	// that Drain can wait for them.
	releasing sync.WaitGroup

	pagesOnce        sync.Once
	pageSrv          *pageServer // set by pagesOnce
	start            time.Time   // the monotonic origin of conn.lastSeen
	warnedForwarding atomic.Bool // warnUntrustedForwarding ran

	registry
	admission
}

// registry is the devices this edge holds: each held device's socket and
// subscription, the devices recover is looking at, and the notices kept
// for a device whose socket has not registered yet. It must not decide
// whether a connection is taken or what it may hold: that is admission's,
// and a connection is admitted before it names its device.
type registry struct {
	devices map[string]*deviceSlot // under Server.mu: device id → the socket that owns it here
	// deviceSubs: each held device's subject is subscribed too
	// (Config.DeviceSubjects, or the output subject could not be).
	deviceSubs bool
	// recovering (under Server.mu): the devices recover is looking at.
	recovering map[string]bool
	// early (under Server.mu): notices about devices with no socket here
	// when they came, for a hello that claimed the device and has not
	// registered yet (see register); the heartbeat forgets them after
	// OwnerTTL.
	early map[string]earlyNotice
}

// admission is whether a connection is taken and what it may hold: the
// sockets taken, the hello phase (its cap and its counts by source), the
// drain's refusal of newcomers, and the edge's byte budgets. It must not
// touch the registry: which device a socket holds is registry's.
type admission struct {
	// Byte budgets of the whole edge; see Config.MaxReadBytes and the rest.
	reading, queued, uploading budget
	helloBytes                 budget       // what the hello phase holds (see admission.go)
	stopBudgets                func() error // ends their reporting

	conns map[*conn]struct{} // under Server.mu
	// hello (under Server.mu) is the hello phase: the sockets whose hello
	// is not answered yet, and admission to it.
	hello *helloPhase
	// draining (under Server.mu): Drain began; no new connections are
	// taken.
	draining bool

	nConns atomic.Int64
}

// earlyNotice is what onControl heard about a device with no socket here.
type earlyNotice struct {
	takeover int64 // the newest takeover's epoch: sockets below it close
	reread   bool  // something was kept in the outbox: read it again
	at       time.Time
}

// noteEarlyLocked keeps ctl, about a device with no socket here, for the
// socket that may register for it next. Server.mu is held.
func (s *registry) noteEarlyLocked(ctl wire.Control) {
	if ctl.Op != wire.OpTakeover && ctl.Op != wire.OpOutbox {
		return
	}
	if s.early == nil {
		s.early = make(map[string]earlyNotice)
	}
	n := s.early[ctl.Device]
	if ctl.Op == wire.OpTakeover {
		n.takeover = max(n.takeover, ctl.Epoch)
	} else {
		n.reread = true
	}
	n.at = time.Now()
	s.early[ctl.Device] = n
}

// forgetEarly drops the notices older than age.
func (s *Server) forgetEarly(age time.Duration) {
	cutoff := time.Now().Add(-age)
	s.mu.Lock()
	defer s.mu.Unlock()
	for dev, n := range s.early {
		if n.at.Before(cutoff) {
			delete(s.early, dev)
		}
	}
}

// deviceSlot is a device's subscription on this edge and its current socket.
type deviceSlot struct {
	conn *conn
	sub  bus.Subscription
}

// New returns an edge that keeps state in st and talks over b.
func New(cfg Config, st store.Store, b bus.Bus, log *slog.Logger) *Server {
	cfg.setDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		workers: newWorkers(),
		admission: admission{
			reading:   budget{limit: cfg.MaxReadBytes},
			queued:    budget{limit: cfg.MaxQueuedBytes},
			uploading: budget{limit: cfg.MaxUploadBytes},
			hello:     newHelloPhase(cfg),
			conns:     make(map[*conn]struct{}),
		},
		cfg:      cfg,
		log:      log.With("edge", cfg.ID),
		store:    st,
		bus:      b,
		auth:     newAuthenticator(cfg.Auth),
		sender:   &dispatch.Dispatcher{Owners: st, Bus: b, Cache: &dispatch.OwnerCache{}},
		tel:      newEdgeTelemetry(cfg.Telemetry),
		registry: registry{devices: make(map[string]*deviceSlot)},
		start:    time.Now(),
	}
	s.helloBytes.limit = helloSocketBytes * int64(s.hello.cap) // what the admitted sockets may hold
	s.deliverer = &dispatch.Deliverer{Dispatcher: s.sender, Blobs: st, BlobTTL: cfg.BlobTTL, HomeDevice: cfg.HomeDevice, Outbox: cfg.Outbox}
	if p, err := sharedPoller(); err == nil {
		s.poller = p
	}
	s.stopBudgets = s.tel.m.observeBudgets([len(budgetNames)]*budget{&s.reading, &s.queued, &s.uploading, &s.helloBytes})
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.owners = newOwnerReads(s.ctx, st, cfg.OpTimeout, s.goFunc)
	s.deviceSubs = cfg.DeviceSubjects
	if b != nil { // nil in tests of the edge alone
		if sub, err := b.Subscribe(bus.EdgeSubject(cfg.ID), s.onBatch); err != nil {
			// Senders get no responders and send each output alone.
			s.log.Warn("no subscription to the edge's subject; batches go device by device", "err", err)
		} else {
			s.batchSub = sub
		}
		if sub, err := b.Subscribe(bus.EdgeOutputSubject(cfg.ID), s.onEdgeDelivery); err != nil {
			// Senders get no responders and use the device's subject.
			s.log.Warn("no subscription to the edge's output subject; subscribing to each device's", "err", err)
			s.deviceSubs = true
		} else {
			s.outSub = sub
		}
	}
	s.stopRevoke = cfg.Auth.Tenants.OnChange(s.revoke)
	s.goFunc(s.heartbeat)
	s.goFunc(s.keepalive)
	s.goFunc(s.helloSweep)
	return s
}

// ID is the edge's name in owner records.
func (s *Server) ID() string { return s.cfg.ID }

// Conns is the number of open WebSocket connections.
func (s *Server) Conns() int { return int(s.nConns.Load()) }

// tracked runs f now, counted like a goFunc goroutine (for callbacks that
// already run in a goroutine of their own, such as the poller's).
func (s *Server) tracked(f func()) {
	s.gmu.Lock()
	if s.waiting {
		s.gmu.Unlock()
		f()
		return
	}
	s.wg.Add(1)
	s.gmu.Unlock()
	defer s.wg.Done()
	f()
}

// goFunc runs f in a goroutine (one of s.workers) that Close waits for
// until f returns. Once Close waits, new goroutines (a flush that finds its
// socket closed) run untracked: they end at once.
func (s *Server) goFunc(f func()) {
	s.gmu.Lock()
	if s.waiting {
		s.gmu.Unlock()
		go f()
		return
	}
	s.wg.Add(1)
	s.gmu.Unlock()
	s.workers.run(func() {
		defer s.wg.Done()
		f()
	})
}

// Serve accepts connections on ln until Close. It returns nil after Close.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return net.ErrClosed
	}
	s.lns = append(s.lns, ln)
	s.mu.Unlock()
	wait := retry.New(5*time.Millisecond, time.Second)
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.ctx.Err() != nil || s.isDraining() {
				return nil
			}
			s.tel.m.acceptFailed(acceptStageAccept)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporary(err) {
				// Out of file descriptors and the like: wait, do not spin.
				d := wait.Next()
				s.log.Warn("accept failed; retrying", "err", err, "backoff", d)
				retry.Sleep(s.ctx, d)
				continue
			}
			return err
		}
		wait.Reset()
		s.goFunc(func() { s.handshake(nc) })
	}
}

func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// stopAccepting sets *state (s.closed or s.draining), closes the listeners
// and returns the open connections; ok is false when the server is closed
// or *state was set already.
func (s *Server) stopAccepting(state *bool) (conns []*conn, ok bool) {
	s.mu.Lock()
	if s.closed || *state {
		s.mu.Unlock()
		return nil, false
	}
	*state = true
	lns := s.lns
	conns = make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, ln := range lns {
		ln.Close()
	}
	return conns, true
}

// Close stops accepting, closes every connection with 1001 (going away) and
// waits for the server's goroutines.
func (s *Server) Close() error {
	conns, ok := s.stopAccepting(&s.closed)
	if !ok {
		return nil
	}
	s.mu.Lock()
	drained := s.draining
	s.mu.Unlock()
	if drained {
		s.tel.m.setDraining(-1) // closed: no longer draining
	}
	s.stopRevoke()
	s.closePages()
	if s.batchSub != nil {
		_ = s.batchSub.Unsubscribe() // a batch that still comes finds its sockets closing: "moved"
	}
	if s.outSub != nil {
		_ = s.outSub.Unsubscribe() // what still comes finds its socket closing: "moved"
	}
	for _, c := range conns {
		c.closeWith(closeGoingAway, "server shutting down", nil)
	}
	// Give the close frames a moment, then drop whatever is left.
	deadline := time.Now().Add(2 * time.Second)
	for s.Conns() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	for _, c := range conns {
		c.teardown(errServerClosed)
	}
	// A teardown already running elsewhere returned at once above; wait for it.
	for _, c := range conns {
		select {
		case <-c.dead:
		case <-time.After(time.Until(deadline.Add(3 * time.Second))):
		}
	}
	s.cancel()
	s.gmu.Lock()
	s.waiting = true
	s.gmu.Unlock()
	s.wg.Wait()
	s.workers.stop()
	return s.stopBudgets()
}

// register makes c the socket of its device on this edge, closing an older
// one, and subscribes to the device's subject when this edge had no socket
// for it. It reports false when c lost to a newer socket already here.
func (s *Server) register(c *conn) (ok, reread bool, err error) {
	s.mu.Lock()
	slot := s.devices[c.device]
	var old *conn
	if slot != nil && slot.conn != nil {
		if slot.conn.epoch.Load() > c.epoch.Load() {
			s.mu.Unlock()
			return false, false, nil
		}
		old = slot.conn
	}
	// Notices that came after c's claim, before this registration.
	if n, ok := s.early[c.device]; ok {
		delete(s.early, c.device)
		if n.takeover > c.epoch.Load() {
			s.mu.Unlock()
			return false, false, nil // a newer socket took the device over
		}
		reread = n.reread
	}
	if slot == nil {
		slot = &deviceSlot{}
		s.devices[c.device] = slot
	}
	slot.conn = c
	needSub := s.deviceSubs && slot.sub == nil
	s.mu.Unlock()
	if old != nil {
		old.replacedByNewer()
	}
	if needSub { // shim(v0.2.0): Config.DeviceSubjects.
		sub, err := s.bus.Subscribe(bus.DeviceSubject(c.device), s.onDeviceDelivery)
		s.mu.Lock()
		defer s.mu.Unlock()
		if err != nil {
			if slot.conn == c {
				delete(s.devices, c.device)
			}
			return false, false, err
		}
		if s.devices[c.device] != slot || slot.sub != nil {
			sub.Unsubscribe() // the slot went away or another call subscribed
		} else {
			slot.sub = sub
		}
	}
	return true, reread, nil
}

// unregister removes c; the last socket of a device unsubscribes.
func (s *Server) unregister(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	slot := s.devices[c.device]
	var sub bus.Subscription
	if slot != nil && slot.conn == c {
		delete(s.devices, c.device)
		sub = slot.sub
	}
	s.mu.Unlock()
	if sub != nil {
		sub.Unsubscribe()
	}
}

// deviceConn returns the socket of device on this edge.
func (s *Server) deviceConn(device string) *conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if slot := s.devices[device]; slot != nil {
		return slot.conn
	}
	return nil
}

// recordLives is how many OwnerTTLs an owner record lives without a
// refresh (an hour by default): the edge's lease, renewed every third of
// OwnerTTL, is what keeps the records standing between refreshes, so an
// idle phone costs the store one write an hour (every third of this).
const recordLives = 120

// recordTTL is the ttl of an owner record this edge claims or refreshes.
func (s *Server) recordTTL() time.Duration { return recordLives * s.cfg.OwnerTTL }

// heartbeat renews this edge's lease every OwnerTTL/3: one write keeps
// every owner record naming this edge standing (store.Owners.RenewEdge).
// Every third of recordTTL it refreshes the records themselves, which
// also finds the devices whose ownership moved elsewhere without us
// hearing of it. When the lease was found lapsed (a pause, the store lost
// or restarted), senders read our records as none meanwhile and may have
// kept outputs in the outboxes: every device is checked at once, the
// ones still ours read their outbox again, the others are recovered.
func (s *Server) heartbeat() {
	beat := s.cfg.OwnerTTL / 3
	t := time.NewTicker(beat)
	defer t.Stop()
	refreshEvery := max(1, int(s.recordTTL()/3/beat))
	for n := 1; ; n++ {
		ctx, cancel := context.WithTimeout(s.ctx, beat)
		fresh, err := s.store.RenewEdge(ctx, s.cfg.ID, s.cfg.OwnerTTL)
		cancel()
		if err != nil {
			s.log.Warn("renewing the edge's lease failed", "err", err)
		}
		s.renewConnLeases(beat)
		// The first renewal is fresh too: nothing was read as none yet.
		if lapsed := err == nil && fresh && n > 1; lapsed || n%refreshEvery == 0 {
			s.refreshOwned(lapsed)
		}
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.forgetEarly(s.cfg.OwnerTTL)
	}
}

// renewConnLeases renews the places the file owners' sockets here hold in
// their owners' connections quotas (store.Leases, ttl OwnerTTL): one
// store call per owner with sockets here, whatever their number, each
// within timeout. A socket whose place lapsed or was given back meanwhile
// (a close of its replaced socket elsewhere) takes it again.
func (s *Server) renewConnLeases(timeout time.Duration) {
	byOwner := make(map[string][]string)
	s.mu.Lock()
	for dev, slot := range s.devices {
		if slot.conn != nil && slot.conn.leased.Load() {
			o := tenant.OwnerOf(dev)
			byOwner[o] = append(byOwner[o], dev)
		}
	}
	s.mu.Unlock()
	for owner, devs := range byOwner {
		ctx, cancel := context.WithTimeout(s.ctx, timeout)
		err := s.store.RenewLeases(ctx, tenant.QuotaKey(owner, tenant.QuotaConnections), devs, s.cfg.OwnerTTL)
		cancel()
		if err != nil && s.ctx.Err() == nil {
			s.log.Warn("renewing the owners' connections quotas failed", "owner", owner, "err", err)
		}
	}
}

// refreshOwned refreshes the owner records of the devices held here and
// recovers those whose ownership was lost; lapsed: the lease had lapsed,
// so the devices still held read their outboxes again.
func (s *Server) refreshOwned(lapsed bool) {
	owned := make(map[string]int64)
	s.mu.Lock()
	for dev, slot := range s.devices {
		if slot.conn != nil {
			owned[dev] = slot.conn.epoch.Load()
		}
	}
	s.mu.Unlock()
	if len(owned) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.OwnerTTL/3)
	lost, err := s.store.RefreshDevices(ctx, owned, s.recordTTL())
	cancel()
	if err != nil {
		s.log.Warn("refreshing owner records failed", "err", err)
		return
	}
	for _, dev := range lost {
		epoch := owned[dev]
		delete(owned, dev)
		s.recover(dev, epoch)
	}
	if !lapsed {
		return
	}
	s.log.Info("the edge's lease had lapsed; its devices read their outboxes again", "devices", len(owned))
	for dev, epoch := range owned {
		if c := s.deviceConn(dev); c != nil && c.epoch.Load() == epoch {
			c.rereadOutbox()
		}
	}
}

// keepalive is the one sweep of the edge's sockets: every PingInterval it
// pings those that sent nothing for an interval and drops those silent for
// 1+PingMisses intervals (a phone that vanished without a FIN). Any frame
// from the peer, a pong included, counts as an answer.
func (s *Server) keepalive() {
	t := time.NewTicker(s.cfg.PingInterval)
	defer t.Stop()
	ping := controlFrame(ws.OpPing, nil)
	var conns []*conn
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		now := time.Since(s.start)
		s.mu.Lock()
		for c := range s.conns {
			conns = append(conns, c)
		}
		s.mu.Unlock()
		dead := time.Duration(1+s.cfg.PingMisses) * s.cfg.PingInterval
		for i, c := range conns {
			conns[i] = nil
			switch idle := now - time.Duration(c.lastSeen.Load()); {
			case idle >= dead:
				c.logger().Debug("closing silent connection", "idle", idle)
				c.teardown(errPingTimeout)
			case idle >= s.cfg.PingInterval:
				c.enqueue(ping, nil)
			}
		}
		conns = conns[:0]
	}
}

// helloSlices is how many times per HelloTimeout helloSweep looks: a
// connection without hello is closed between HelloTimeout and
// HelloTimeout × (1 + 1/helloSlices) after it connected.
const helloSlices = 16

// helloSweep closes the connections that did not say hello in time. One
// sweep per edge does it: a timer per connection would cost every phone
// its memory for as long as it stays.
func (s *Server) helloSweep() {
	t := time.NewTicker(s.cfg.HelloTimeout / helloSlices)
	defer t.Stop()
	var late []*conn
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		late = s.hello.late(time.Since(s.start), late)
		s.mu.Unlock()
		for i, c := range late {
			late[i] = nil
			c.helloTimeout()
		}
		late = late[:0]
	}
}

// admitHello takes a place in the hello phase for a new socket from
// client (see admission.go). A stranger that gave up its place for it is
// closed here. When no place can be had, ok is false and retryAfter says
// in how many seconds to come back.
func (s *Server) admitHello(client netip.Addr) (src netip.Prefix, ok bool, retryAfter int) {
	s.mu.Lock()
	now := time.Since(s.start)
	src, victim, ok := s.hello.admit(client, now)
	if !ok {
		retryAfter = s.hello.retryAfter(now)
	}
	s.mu.Unlock()
	if victim != nil {
		s.tel.m.helloEvicted()
		victim.evict()
	}
	return src, ok, retryAfter
}

// helloAccepted: c's hello carried a valid token; it no longer counts as
// a stranger of its source.
func (s *Server) helloAccepted(c *conn) {
	s.mu.Lock()
	s.hello.accepted(c)
	s.mu.Unlock()
}

// helloDone takes c out of the hello phase, once: its hello was answered,
// or it closed.
func (s *Server) helloDone(c *conn) {
	s.mu.Lock()
	s.hello.leave(c, time.Since(s.start))
	s.mu.Unlock()
}

// HelloPhase reports the sockets in the hello phase now (strangers and
// hellos being answered), and the bytes their messages hold.
func (s *Server) HelloPhase() (conns int, bytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hello.n, s.helloBytes.inUse()
}

// recover handles a device whose owner record no longer holds our epoch.
// If the record is simply gone (the store lost it, e.g. a Redis restart),
// the socket re-claims the device under a new epoch and stays open. If
// another edge owns it, we missed the takeover: the socket closes (1001),
// and the phone reconnects. One recover per device runs at a time (the
// heartbeat and deliveries that found no record both call it), so a
// device is claimed again once, not twice with the socket holding the
// older of the two epochs.
func (s *Server) recover(dev string, epoch int64) {
	s.mu.Lock()
	if s.recovering[dev] {
		s.mu.Unlock()
		return
	}
	if s.recovering == nil {
		s.recovering = make(map[string]bool)
	}
	s.recovering[dev] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.recovering, dev)
		s.mu.Unlock()
	}()
	c := s.deviceConn(dev)
	if c == nil || c.epoch.Load() != epoch {
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.OpTimeout)
	defer cancel()
	owner, err := s.store.DeviceOwner(ctx, dev)
	if err == nil && owner.Edge == s.cfg.ID && owner.Epoch == epoch {
		return // ours after all (a caller's read was older than a claim)
	}
	if errors.Is(err, store.ErrNotFound) {
		if e, err := s.store.ClaimDevice(ctx, dev, s.cfg.ID, s.recordTTL()); err == nil {
			c.epoch.CompareAndSwap(epoch, e)
			c.logger().Info("re-claimed a device whose owner record was lost", "epoch", e)
			// Senders found no owner meanwhile and kept what they had for
			// the device in its outbox.
			c.rereadOutbox()
			return
		}
	}
	c.closeWith(closeGoingAway, "device ownership lost; reconnect", nil)
}
