package edge

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/tenant"
	"github.com/hermes-mobile/gateway/pkg/usage"
)

// WebSocket close codes the edge sends.
const (
	closeNormal        = 1000 // replaced by a newer connection of the device
	closeGoingAway     = 1001 // the edge is shutting down: reconnect elsewhere
	closeProtocolError = 1002 // broken WebSocket framing, or an invalid close frame
	closeInvalidData   = 1007 // a close reason that is not UTF-8
)

const (
	handshakeTimeout = 10 * time.Second
	lingerTimeout    = 2 * time.Second // after our close frame, for the peer's
	smallBufSize     = 16 << 10        // pooled read buffer, enough for most frames
	readerSize       = 4096            // the pooled bufio.Reader of a socket being read
	// minGrowth is the first allocation of a message read outside the
	// pooled buffer (before hello): a buffer then doubles as bytes arrive.
	minGrowth = 512
	// MaxPreHelloBytes bounds a message before hello: a larger one is a
	// fatal too_big, refused on its header alone. A hello is a few hundred
	// bytes; its six device and user strings at their 120-character bound,
	// four bytes each, and a 1 KiB token come to about 4 KiB, so 8 KiB is
	// twice the largest useful hello.
	MaxPreHelloBytes = 8 << 10
)

var (
	readers  = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, readerSize) }}
	smallBuf = sync.Pool{New: func() any { b := make([]byte, 0, smallBufSize); return &b }}
)

// helloPhaseFull refuses an upgrade that found no place in the hello
// phase (see admission.go): 503, and the client comes back after
// retryAfter seconds. The answers are made once, one for each value.
func helloPhaseFull(retryAfter int) error { return helloRefusals[retryAfter] }

var helloRefusals = func() (r [maxRetryAfter + 1]error) {
	for i := range r {
		r[i] = ws.RejectConnectionError(ws.RejectionStatus(503),
			ws.RejectionReason("too many connections are saying hello; retry later"),
			ws.RejectionHeader(ws.HandshakeHeaderString(fmt.Sprintf("Retry-After: %d\r\n", max(i, minRetryAfter)))))
	}
	return r
}()

// Close codes of the metrics for a connection that ended without a close
// frame (RFC 6455 7.1.5: 1006) and for a close frame without a code (1005).
const (
	closeAbnormal = 1006
	closeNoStatus = 1005
)

// connFlags are a connection's states, one bit each (as nats-server's
// clientFlag), under conn.mu.
type connFlags uint8

const (
	flagHelloed  connFlags = 1 << iota // hello accepted
	flagReady                          // the outbox was flushed: deliveries go straight out
	flagAcking                         // the phone acks (it has sent an ack, or the store says it did on an earlier socket): deliveries wait for its acks
	flagAcked                          // the phone has sent an ack on this socket: the store was told (see rememberAcks)
	flagWriting                        // a flush goroutine is writing the queue
	flagClosing                        // a close frame is queued; nothing else is accepted
	flagClosed                         // torn down
	flagUploaded                       // a part went to the store: teardown drops the connection's uploads
)

func (f *connFlags) set(b connFlags)   { *f |= b }
func (f *connFlags) clear(b connFlags) { *f &^= b }

// is reports whether any of the bits b is set.
func (f connFlags) is(b connFlags) bool { return f&b != 0 }

// outItem is one queued frame; done, when set, runs once the frame (and all
// before it) is written, or with the error that stopped it.
type outItem struct {
	frame []byte
	done  func(error)
}

// conn is one WebSocket connection: its socket half and its session
// half, and what joins them (the server, the lock and the states both
// halves are read under). A method that needs only one half's fields is a
// method of that half.
type conn struct {
	srv *Server

	// handleMu is held while a message is handled, so that drainClose
	// can wait for the one in progress.
	handleMu sync.Mutex

	// mu guards flags and the fields of socket and session that say they
	// are under conn.mu.
	mu    sync.Mutex
	flags connFlags // the connection's states

	socket
	session
}

// socket is the wire half of a conn: the net.Conn and its poll entry, the
// write queue and its flush, the close handshake, the keepalive's clock
// and the teardown's marks. It knows nothing of the device: it must not
// touch the session's fields, and what it writes comes from conn's queue.
type socket struct {
	nc     net.Conn
	client netip.Addr // the client's address, after trusted proxies
	pe     *pollEntry

	// Under conn.mu: the write queue and the close handshake.
	out      []outItem
	outBytes int
	// closeCode is the code of the close frame that began the closing
	// handshake (0 while none did; -1 for a close frame no code can be
	// read from), closeByPeer whether the peer sent it: the metrics'.
	closeCode   int
	closeByPeer bool

	opened time.Time     // the upgrade completed
	torn   atomic.Bool   // teardown ran (or is running)
	dead   chan struct{} // closed when teardown has finished

	// lastSeen is when the peer last sent a frame (monotonic nanoseconds
	// since the server started), for the keepalive sweep.
	lastSeen atomic.Int64

	// stall is where a blocked write last saw the peer acknowledge bytes
	// (see writeBuffers); only the flushing goroutine uses it.
	stall struct {
		acked uint64
		since time.Time
	}
}

// session is the device half of a conn: who hello said is connected, and
// what this connection holds for the device (claims whose outcome is
// unknown, deliveries waiting for acks, outbox reads, uploads, deliver
// frames in flight, the avatar). It must not touch the socket's fields: a
// frame reaches the phone only through conn's queue (enqueue, send).
type session struct {
	// Set by hello on the reading goroutine, before the conn is registered
	// where deliveries can find it; read-only afterwards.
	id          string       // names the connection's uploads
	device      string       // the device key (tenant.DeviceKey): the phone's id, scoped to its owner
	sessionName string       // protocol.Session(device): the agent's session, not the phone's
	epoch       atomic.Int64 // changes only when the heartbeat re-claims a lost record
	deliverOK   bool
	cron        *cronQueue                // deliver frames in flight; made on the first, under handleMu
	user        struct{ id, name string } // what hello.user claims: display only
	auth        string                    // which token authenticated device (wire.Event.Auth)
	// key is the owner key of the tenants file that admitted the socket
	// (under conn.mu); nil for a token of the environment. A reload that
	// removes it closes the socket (Server.revoke).
	key     *tenant.Key
	devName string
	// leased: the socket holds a place in its owner's connections quota
	// (a lease of the store, connLease), its device key the lease's id;
	// replaced: a newer socket of the device took it over, and with it
	// that place, which this one's close must not give back.
	leased, replaced atomic.Bool
	// use counts what the socket's owner uses: stored with ready under
	// conn.mu unless the socket closed first, and read by teardown under
	// it, so a socket is counted closed exactly when it was counted open.
	use atomic.Pointer[usage.Owner]

	// avatarURL is ready's avatar_url: Config.AvatarURL, or the edge's own
	// page at the host the phone connected to.
	avatarURL string

	// Under conn.mu: the avatar, the deliveries and acks.
	avatar   string
	idle     *time.Timer
	held     []heldItem        // deliveries that came before ready
	attempts map[string]string // dedup key → attempt of a claim with unknown outcome
	// Deliveries written and waiting for the phone's ack (see awaitAck):
	// by message id, and the ids in the order they were first written.
	unacked    map[string][]*ackWaiter
	unackedIDs []string
	recentAcks []string // acks that came before anybody waited for them

	// uploads (under conn.mu) is what each unfinished upload of this
	// connection holds of the edge's upload budget, by file id.
	uploads map[string]*upload

	outboxMu   sync.Mutex // one outbox read of this socket at a time
	outboxSent int64      // under outboxMu: the Seq of the last outbox item queued here
	// The acknowledgements of this socket's outbox reads, in read order
	// (settleReads), under outboxAckMu: a later read (a reread while the
	// flush still waits for acks) must not remove an earlier read's
	// unacknowledged items with its own.
	outboxAckMu sync.Mutex
	outboxReads []*outboxAck // reads whose acknowledgement has not run, oldest first
	outboxBad   int64        // the lowest Seq this socket did not deliver (0: none yet)
}

// handshake upgrades nc and starts watching it.
func (s *Server) handshake(nc net.Conn) {
	peer := addrOf(nc.RemoteAddr())
	trusted := s.trustedProxy(peer)
	nc.SetDeadline(time.Now().Add(handshakeTimeout))
	// rc replays what route read; after the upgrade the raw socket is
	// used, so that it can be registered with epoll.
	rc, page := s.route(nc)
	if page {
		return
	}
	header := []byte(s.forwardedHeader())
	var fwd, host, proto []byte
	forwarded := false // any forwarding header, for the untrusted-peer warning
	var client netip.Addr
	var src netip.Prefix
	admitted := false // holds a place in the hello phase (admitHello)
	u := ws.Upgrader{
		OnRequest: func(uri []byte) error {
			path, _, _ := bytes.Cut(uri, []byte("?"))
			if string(path) != "/ws" {
				return ws.RejectConnectionError(ws.RejectionStatus(404), ws.RejectionReason("not found: the WebSocket is at /ws"))
			}
			return nil
		},
		OnHost: func(h []byte) error {
			host = append(host[:0], h...)
			return nil
		},
		OnHeader: func(key, value []byte) error {
			if !trusted {
				if bytes.EqualFold(key, []byte(HeaderXForwardedFor)) || bytes.EqualFold(key, []byte(HeaderForwarded)) {
					forwarded = true
				}
				return nil
			}
			switch {
			case bytes.EqualFold(key, []byte("X-Forwarded-Proto")):
				proto = append(proto[:0], value...)
			case bytes.EqualFold(key, header):
				fwd = appendList(fwd, value)
			}
			return nil
		},
		// The request is read: the client is known. A socket past the
		// hello-phase caps is refused here, before it costs a conn.
		OnBeforeUpgrade: func() (ws.HandshakeHeader, error) {
			client = peer
			if trusted {
				client = s.clientFromHeaders(string(fwd))
			}
			var retryAfter int
			if src, admitted, retryAfter = s.admitHello(client); !admitted {
				s.tel.m.acceptFailed(acceptStageHello)
				return nil, helloPhaseFull(retryAfter)
			}
			return nil, nil
		},
	}
	cr := &countingReader{r: rc}
	if _, err := u.Upgrade(cr); err != nil {
		s.log.Debug("upgrade failed", "peer", peer, "err", err)
		if cr.n > 0 && !isHelloRefusal(err) {
			// A connection that sent nothing at all is a TCP health
			// check, not a failure.
			s.tel.m.acceptFailed(acceptStageUpgrade)
		}
		if admitted {
			s.mu.Lock()
			s.hello.cancel(src)
			s.mu.Unlock()
		}
		nc.Close()
		return
	}
	nc.SetDeadline(time.Time{})
	if !trusted && forwarded && peer.IsLoopback() {
		s.warnUntrustedForwarding(peer)
	}
	c := &conn{srv: s, socket: socket{nc: nc, client: client, dead: make(chan struct{})}, session: session{avatar: protocol.AvatarIdle}}
	c.avatarURL = s.avatarURL(string(host), string(proto), trusted)
	c.seen()
	s.mu.Lock()
	if s.closed || s.draining {
		s.hello.cancel(src)
		s.mu.Unlock()
		nc.Close()
		return
	}
	s.conns[c] = struct{}{}
	s.hello.enter(c, src, time.Since(s.start), s.cfg.HelloTimeout)
	s.mu.Unlock()
	s.nConns.Add(1)
	c.opened = time.Now()
	s.tel.m.connOpened()
	if s.poller != nil {
		onReadable := func() { s.tracked(c.onReadable) }
		if err := s.poller.add(nc, func(pe *pollEntry) { c.pe = pe }, onReadable); err == nil {
			return
		}
		c.pe = nil
	}
	// No epoll for this socket: one reading goroutine.
	s.goFunc(func() {
		for {
			if err := c.readAvailable(); err != nil {
				if err != errClientClosed {
					c.teardown(err)
				}
				return
			}
		}
	})
}

// isHelloRefusal reports whether err is one of helloPhaseFull's answers.
func isHelloRefusal(err error) bool {
	for _, r := range helloRefusals {
		if err == r {
			return true
		}
	}
	return false
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.ReadWriter
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func (c *countingReader) Write(p []byte) (int, error) { return c.r.Write(p) }

func appendList(dst, v []byte) []byte {
	if len(dst) > 0 {
		dst = append(dst, ',')
	}
	return append(dst, v...)
}

// onReadable runs when epoll says the socket has data.
func (c *conn) onReadable() {
	if err := c.readAvailable(); err != nil {
		if err != errClientClosed {
			c.teardown(err)
		}
		return
	}
	if err := c.srv.poller.resume(c.pe); err != nil {
		c.teardown(err)
	}
}

// readAvailable reads and handles messages while bytes are buffered. It
// blocks only inside a message (bounded by ReadTimeout) or, when woken
// without data, until data arrives.
func (c *conn) readAvailable() error {
	br := readers.Get().(*bufio.Reader)
	br.Reset(c.nc)
	defer func() { br.Reset(nil); readers.Put(br) }()
	for {
		if c.isClosing() {
			return c.discard(br)
		}
		if _, err := br.Peek(1); err != nil {
			return err
		}
		c.nc.SetReadDeadline(time.Now().Add(c.srv.cfg.ReadTimeout))
		if err := c.readMessage(br); err != nil {
			return err
		}
		if br.Buffered() == 0 {
			c.mu.Lock()
			if !c.flags.is(flagClosing) {
				c.nc.SetReadDeadline(time.Time{})
			}
			c.mu.Unlock()
			return nil
		}
	}
}

// discard swallows what the peer still sends after our close frame, so the
// close frame is not lost to a reset, until the peer closes or the linger
// deadline passes. It takes what has arrived and returns: a closing socket
// waits in epoll, not in a goroutine (the teardown after lingerTimeout
// closes it).
func (c *socket) discard(br *bufio.Reader) error {
	if _, err := br.Peek(1); err != nil {
		return err
	}
	_, _ = br.Discard(br.Buffered())
	return nil
}

func (c *conn) isClosing() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.flags.is(flagClosing)
}

// readMessage reads one WebSocket message (answering control frames on the
// way) and hands it to handle; a control frame between messages is read
// alone. A framing error or an oversized message
// queues the close and returns nil: readAvailable sees the connection
// closing and discards the rest until the close frame is out.
//
// Memory follows the bytes that came, never a declared length: after hello
// a message starts in the pooled 16 KiB buffer and past it grows as its
// bytes arrive (see grow), each growth taken from the edge's read budget.
// Before hello the socket has no pooled buffer: its message grows from
// nothing, at most to MaxPreHelloBytes; what it and the pooled reader hold
// is counted in the hello budget, whose bound the hello phase's admission
// keeps by counting sockets (see admission.go), so it is never refused.
func (c *conn) readMessage(br *bufio.Reader) error {
	m := msgReader{c: c, limit: protocol.MaxFrameBytes, budget: &c.srv.reading}
	defer func() { m.budget.release(m.reserved) }()
	if !c.isHelloed() {
		m.limit, m.budget = MaxPreHelloBytes, &c.srv.helloBytes
		// The reader is held for as long as the message takes to come.
		m.take(readerSize)
	} else {
		bp := smallBuf.Get().(*[]byte)
		defer smallBuf.Put(bp)
		m.msg, m.pooled = (*bp)[:0], bp
	}
	state := ws.StateServerSide
	for {
		h, err := ws.ReadHeader(br)
		if err != nil {
			if errors.Is(err, ws.ErrHeaderLengthMSB) || errors.Is(err, ws.ErrHeaderLengthUnexpected) {
				return c.protocolError(err.Error())
			}
			return err
		}
		c.seen()
		if err := ws.CheckHeader(h, state); err != nil {
			return c.protocolError(err.Error())
		}
		if h.OpCode.IsControl() {
			if closed, err := c.control(br, h); closed || err != nil {
				return err
			}
			if !state.Fragmented() {
				// Between messages: back to readAvailable, which waits
				// for the next byte without a deadline (and, with epoll,
				// without a goroutine). Waiting here for the next header
				// would hold both and cut an idle phone that only
				// answers pings after ReadTimeout.
				return nil
			}
			continue
		}
		if int64(len(m.msg))+h.Length > m.limit {
			what := "frame is larger than 16 MiB"
			if m.budget == &c.srv.helloBytes {
				what = "a message before hello is larger than 8 KiB"
			}
			c.fatal(protocol.NewFatal(protocol.CodeTooBig, what))
			return nil
		}
		if ok, err := m.readPayload(br, h); !ok || err != nil {
			return err
		}
		if h.Fin {
			break
		}
		state = state.Set(ws.StateFragmented)
	}
	if m.pooled != nil && cap(m.msg) == smallBufSize {
		*m.pooled = m.msg // keep the pooled buffer (it did not grow)
	}
	c.handleMu.Lock()
	defer c.handleMu.Unlock()
	if !c.isClosing() { // after our close frame nothing more is taken
		c.handle(m.msg)
	}
	return nil
}

// msgReader is one message being read and what it holds of a budget.
type msgReader struct {
	c        *conn
	msg      []byte
	pooled   *[]byte // the pooled buffer msg started in (nil before hello)
	limit    int64   // the message's bound
	budget   *budget // the read budget, or before hello the hello budget
	reserved int64   // taken from budget
}

// take reserves n more bytes of m's budget; when they do not fit, the
// connection gets a fatal internal_error and take reports false. Before
// hello they always fit: the hello phase's admission holds the bound.
func (m *msgReader) take(n int64) bool {
	c := m.c
	if m.budget == &c.srv.helloBytes {
		m.budget.force(n)
		m.reserved += n
		return true
	}
	if m.budget.take(n) {
		m.reserved += n
		return true
	}
	c.logger().Warn("refusing a message: the edge's read budget is spent", "bytes", len(m.msg)+int(n), "budget", c.srv.cfg.MaxReadBytes)
	c.fatal(failReadBudget.frame())
	return false
}

// readPayload appends h's payload to m.msg, unmasked, as its bytes arrive:
// the buffer grows only when full, never past what h declares. ok is false
// when the budget refused a growth (the connection is closing).
func (m *msgReader) readPayload(br *bufio.Reader, h ws.Header) (ok bool, err error) {
	remaining := int(h.Length)
	offset := 0
	for remaining > 0 {
		if len(m.msg) == cap(m.msg) && !m.grow(remaining) {
			return false, nil
		}
		p := m.msg[len(m.msg) : len(m.msg)+min(remaining, cap(m.msg)-len(m.msg))]
		n, err := br.Read(p)
		ws.Cipher(p[:n], h.Mask, offset)
		m.msg = m.msg[:len(m.msg)+n]
		offset += n
		remaining -= n
		if err != nil && remaining > 0 {
			return false, err
		}
	}
	return true, nil
}

// grow makes room in the full buffer m.msg for more of a payload that has
// remaining bytes to come: twice the buffer (at least minGrowth), never
// more than remaining, so that a buffer is at most twice what the peer sent
// and a message of n bytes costs about 2n of allocations in all (steps of
// a fixed size would copy it n/step times: 120 MiB for a 15 MiB file in
// 1 MiB steps). The budget then holds the new buffer's size (the pooled
// buffer is never counted).
func (m *msgReader) grow(remaining int) bool {
	n := min(remaining, max(cap(m.msg), minGrowth))
	size := int64(len(m.msg) + n)
	if !m.take(size - m.outside()) {
		return false
	}
	msg := make([]byte, len(m.msg), size) // the old buffer is garbage now
	copy(msg, m.msg)
	m.msg = msg
	return true
}

// outside is what m.msg holds of the budget: nothing while it is the
// pooled buffer (or none yet), its capacity once it grew.
func (m *msgReader) outside() int64 {
	if cap(m.msg) == 0 || (m.pooled != nil && cap(m.msg) == smallBufSize) {
		return 0
	}
	return int64(cap(m.msg))
}

// logger is the connection's logger, made when it logs: one kept per
// connection would cost every idle phone its formatted attributes.
func (c *conn) logger() *slog.Logger {
	if c.device == "" {
		return c.srv.log.With("client", c.client.String())
	}
	if owner, dev := tenant.SplitDeviceKey(c.device); owner != tenant.Legacy {
		return c.srv.log.With("client", c.client.String(), "owner", owner, "device", dev)
	}
	return c.srv.log.With("client", c.client.String(), "device", c.device)
}

// seen records that the peer sent a frame: it is alive.
func (c *conn) seen() { c.lastSeen.Store(int64(time.Since(c.srv.start))) }

func (c *conn) isHelloed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.flags.is(flagHelloed)
}

// control reads and answers the control frame h (CheckHeader has bounded
// it to 125 bytes). closed is true after a close frame.
func (c *conn) control(br *bufio.Reader, h ws.Header) (closed bool, err error) {
	var ctl [ws.MaxControlFramePayloadSize]byte
	p := ctl[:h.Length]
	if _, err := io.ReadFull(br, p); err != nil {
		return false, err
	}
	ws.Cipher(p, h.Mask, 0)
	if h.OpCode == ws.OpClose {
		c.onPeerClose(p)
		return true, errClientClosed
	}
	// Ping (answered with the same payload) or pong (ignored). The answer is
	// built in a buffer and queued like any frame, behind what is queued.
	var out bytes.Buffer
	hd := wsutil.ControlHandler{Src: bytes.NewReader(p), Dst: &out, State: ws.StateServerSide, DisableSrcCiphering: true}
	if err := hd.Handle(h); err != nil {
		return false, err
	}
	if out.Len() > 0 {
		c.enqueue(out.Bytes(), nil)
	}
	return false, nil
}

// protocolError fails the connection (RFC 6455 7.1.7): close 1002, written
// before the socket closes. It returns nil, like fatal: readAvailable sees
// the connection closing and discards what follows.
func (c *conn) protocolError(why string) error {
	c.logger().Debug("websocket protocol error", "why", why)
	c.closeWith(closeProtocolError, why, nil)
	return nil
}

// onPeerClose answers the peer's close frame (RFC 6455 5.5.1, 7.4): an empty
// one with an empty one, a valid code with the same code, an invalid code or
// a 1-byte body with 1002 (ws.CheckCloseFrameData, plus codes past 4999), a
// reason that is not UTF-8 with 1007. 1005, 1006 and 1015 are never sent.
func (c *conn) onPeerClose(p []byte) {
	answer := closeFrame(-1, "")
	peerCode := closeNoStatus // for the metrics: an empty close frame
	switch {
	case len(p) == 1:
		peerCode = -1 // no code can be read
	case len(p) > 1:
		peerCode = int(binary.BigEndian.Uint16(p))
	}
	if len(p) > 0 {
		code, reason := ws.ParseCloseFrameData(p)
		switch err := ws.CheckCloseFrameData(code, reason); {
		case len(p) == 1:
			answer = closeFrame(closeProtocolError, "close frame body of 1 byte")
		case code > 4999: // not in any range of RFC 6455 7.4.2; gobwas lets it pass
			answer = closeFrame(closeProtocolError, "close code out of range")
		case errors.Is(err, ws.ErrProtocolInvalidUTF8):
			answer = closeFrame(closeInvalidData, "close reason is not UTF-8")
		case err != nil:
			answer = closeFrame(closeProtocolError, err.Error())
		default:
			answer = closeFrame(int(code), "")
		}
	}
	c.mu.Lock()
	if c.flags.is(flagClosing) {
		// The peer answered our close: the handshake is complete.
		c.mu.Unlock()
		c.teardown(errClientClosed)
		return
	}
	c.flags.set(flagClosing)
	c.closeCode, c.closeByPeer = peerCode, true
	c.mu.Unlock()
	// The socket closes once our answer is written (or, if the writer is
	// stuck, when the linger time is up).
	c.enqueueAlways(answer, func(error) { c.teardown(errClientClosed) })
	time.AfterFunc(lingerTimeout, func() { c.teardown(errClientClosed) })
}

// fatal sends e and closes the connection with 1008 and the code as reason.
// replacedByNewer closes c for a newer socket of its device, here or on
// another edge, which holds c's place in the owner's connections quota.
func (c *conn) replacedByNewer() {
	c.replaced.Store(true)
	c.closeWith(closeNormal, "replaced by a newer connection", nil)
}

func (c *conn) fatal(e *protocol.Error) {
	e.Fatal = true
	c.logger().Info("closing connection", "code", e.Code, "why", e.Message)
	c.srv.tel.fatal(c, e.Code)
	c.closeWith(protocol.CloseCode, string(e.Code), e)
}

// closeWith queues errFrame (if any) and a close frame, then closes the
// socket once the peer answers or lingerTimeout passes.
func (c *conn) closeWith(code int, reason string, errFrame *protocol.Error) {
	c.mu.Lock()
	if c.flags.is(flagClosing | flagClosed) {
		c.mu.Unlock()
		return
	}
	c.flags.set(flagClosing)
	c.closeCode = code
	c.mu.Unlock()
	if errFrame != nil {
		c.enqueueAlways(textFrame(protocol.AppendError(newFrame(128), errFrame)), nil)
	}
	c.enqueueAlways(closeFrame(code, reason), func(err error) {
		if err != nil {
			c.teardown(err)
			return
		}
		if tc, ok := c.nc.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		c.nc.SetReadDeadline(time.Now().Add(lingerTimeout))
		time.AfterFunc(lingerTimeout, func() { c.teardown(errClientClosed) })
	})
}

// send queues one text frame built from payload; it is dropped when the
// connection is closing.
func (c *conn) send(payload []byte) { c.enqueue(textFrame(payload), nil) }

// enqueue queues frame unless the connection is closing; done runs when it
// is written (or, if it is dropped, with the reason).
func (c *conn) enqueue(frame []byte, done func(error)) {
	c.mu.Lock()
	after := dropped(done)
	if !c.flags.is(flagClosing | flagClosed) {
		after = c.queueLocked(frame, done)
	}
	c.mu.Unlock()
	run(after)
}

// enqueueAlways queues frame even while closing (the close sequence itself).
func (c *conn) enqueueAlways(frame []byte, done func(error)) {
	c.mu.Lock()
	after := dropped(done)
	if !c.flags.is(flagClosed) {
		after = c.queueLocked(frame, done)
	}
	c.mu.Unlock()
	run(after)
}

// dropped is the work after a frame was not queued: done learns why.
func dropped(done func(error)) func() {
	if done == nil {
		return nil
	}
	return func() { done(net.ErrClosed) }
}

// run runs the work a xLocked method left for after the unlock, if any.
func run(after func()) {
	if after != nil {
		after()
	}
}

// queueLocked queues frame; c.mu is held before and after. It returns what
// must run once c.mu is released (nil: nothing): starting the flush, or
// closing the connection as a slow reader.
func (c *conn) queueLocked(frame []byte, done func(error)) (after func()) {
	n := len(frame)
	over := c.outBytes+n > c.srv.cfg.MaxOutboundBytes
	if !over && !c.srv.queued.take(int64(n)) {
		// The edge's queues are full: the sockets holding more than the
		// floor go, the others still get their frames.
		over = c.outBytes+n > queueFloor
		if !over {
			c.srv.queued.force(int64(n))
		}
	}
	if over && len(c.out) > 0 {
		queued := c.outBytes
		return func() {
			if done != nil {
				done(errSlowReader)
			}
			c.logger().Warn("closing slow reader", "queued_bytes", queued, "edge_queued_bytes", c.srv.queued.inUse())
			c.teardown(errSlowReader)
		}
	}
	if over { // an empty queue takes any one frame
		c.srv.queued.force(int64(n))
	}
	c.out = append(c.out, outItem{frame, done})
	c.srv.tel.frameOut(frame)
	c.outBytes += n
	if c.flags.is(flagWriting) {
		return nil
	}
	c.flags.set(flagWriting)
	return func() { c.srv.goFunc(c.flush) }
}

// flush writes queued frames until the queue is empty, in one writev per
// batch.
func (c *conn) flush() {
	var bufs net.Buffers
	for {
		c.mu.Lock()
		batch := c.out
		c.out = nil
		if len(batch) == 0 || c.flags.is(flagClosed) {
			c.flags.clear(flagWriting)
			c.mu.Unlock()
			c.srv.queued.release(queuedBytes(batch))
			for _, it := range batch {
				if it.done != nil {
					it.done(net.ErrClosed)
				}
			}
			return
		}
		c.mu.Unlock()
		bufs = bufs[:0]
		size := 0
		for _, it := range batch {
			bufs = append(bufs, it.frame)
			size += len(it.frame)
		}
		err := c.writeBuffers(&bufs)
		c.mu.Lock()
		c.outBytes -= size
		c.mu.Unlock()
		c.srv.queued.release(int64(size))
		for _, it := range batch {
			if it.done != nil {
				it.done(err)
			}
		}
		if err != nil {
			c.teardown(err)
			return
		}
	}
}

// queuedBytes is the size of items, which the queued budget holds.
func queuedBytes(items []outItem) int64 {
	var n int64
	for _, it := range items {
		n += int64(len(it.frame))
	}
	return n
}

// writeSlices is how many times per WriteTimeout a blocked write looks at
// what the peer has taken.
const writeSlices = 8

// writeBuffers writes bufs to the socket. WriteTimeout bounds the time
// without progress, not the whole write: a phone on a slow link may take a
// minute over an 8 MiB file, but one that reads nothing for WriteTimeout is
// cut off. Progress is what the peer's TCP acknowledged, not what this
// host's kernel took: the send buffer grows by itself and would count
// megabytes that never left the machine, letting a stalled reader stay for
// three times WriteTimeout. The check runs only while a write is blocked,
// every WriteTimeout/writeSlices, so the cut comes between WriteTimeout and
// 1.25 × WriteTimeout after the peer's last acknowledgement. Only the
// flushing goroutine touches c.stall.
func (c *conn) writeBuffers(bufs *net.Buffers) error {
	timeout := c.srv.cfg.WriteTimeout
	for {
		c.nc.SetWriteDeadline(time.Now().Add(timeout / writeSlices))
		n, err := bufs.WriteTo(c.nc) // consumes what it wrote
		if err == nil || len(*bufs) == 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		now := time.Now()
		acked, ok := peerAcked(c.nc)
		if !ok {
			acked = c.stall.acked + uint64(n) // no TCP_INFO: what the kernel took
		}
		if c.stall.since.IsZero() || acked != c.stall.acked {
			c.stall.acked, c.stall.since = acked, now
		}
		if now.Sub(c.stall.since) >= timeout {
			return fmt.Errorf("%w: %w", errWriteStalled, err)
		}
	}
}

// teardown releases everything the connection holds. Only the first call
// does anything; a callback it runs may call it again and returns at once.
func (c *conn) teardown(reason error) {
	if !c.torn.CompareAndSwap(false, true) {
		return
	}
	c.mu.Lock()
	c.flags.set(flagClosed)
	c.flags.set(flagClosing)
	pending := c.out
	c.out = nil
	held := c.held
	c.held = nil
	if c.idle != nil {
		c.idle.Stop()
	}
	helloed := c.flags.is(flagHelloed)
	code, byPeer := c.closeCode, c.closeByPeer
	use := c.use.Load()
	c.mu.Unlock()
	use.Closed()
	var why *closeReason
	errors.As(reason, &why) // nil: the socket's own error
	if code == 0 {
		// No close frame began it: the socket just ended.
		code, byPeer = closeAbnormal, !edgeCut(why, reason)
	}
	c.srv.helloDone(c)
	if c.pe != nil {
		c.srv.poller.remove(c.pe)
	}
	c.nc.Close()
	c.srv.queued.release(queuedBytes(pending))
	c.releaseUploads()
	for _, it := range pending {
		if it.done != nil {
			it.done(net.ErrClosed)
		}
	}
	for _, h := range held {
		h.done(net.ErrClosed)
	}
	c.failUnacked()
	c.srv.unregister(c)
	c.srv.nConns.Add(-1)
	c.srv.tel.m.connClosed(code, byPeer, time.Since(c.opened))
	if why != nil && why.slow != "" {
		c.srv.tel.m.slowReaderClosed(why.slow)
	}
	if helloed {
		c.logger().Debug("connection closed", "reason", reason)
		c.srv.releasing.Add(1)
		c.srv.goFunc(func() {
			defer c.srv.releasing.Done()
			c.releaseState()
		})
	}
	close(c.dead)
}

// edgeCut reports whether the edge dropped a connection (a cause of its
// own that cuts, why, or a read deadline) rather than the peer going away
// (EOF, reset).
func edgeCut(why *closeReason, reason error) bool {
	if why != nil {
		return why.cut
	}
	return errors.Is(reason, os.ErrDeadlineExceeded)
}

// frame building. A frame buffer starts with room for the largest server
// header, so the header is written in place in front of the payload.
const headroom = 10

func newFrame(sizeHint int) []byte { return make([]byte, headroom, headroom+sizeHint) }

// textFrame turns a buffer from newFrame into a text frame.
func textFrame(b []byte) []byte { return finishFrame(b, ws.OpText) }

func finishFrame(b []byte, op ws.OpCode) []byte {
	n := len(b) - headroom
	var start int
	switch {
	case n <= 125:
		start = headroom - 2
		b[start+1] = byte(n)
	case n <= 0xffff:
		start = headroom - 4
		b[start+1] = 126
		binary.BigEndian.PutUint16(b[start+2:], uint16(n))
	default:
		start = 0
		b[1] = 127
		binary.BigEndian.PutUint64(b[2:], uint64(n))
	}
	b[start] = 0x80 | byte(op)
	return b[start:]
}

func controlFrame(op ws.OpCode, payload []byte) []byte {
	b := append(newFrame(len(payload)), payload...)
	return finishFrame(b, op)
}

// closeFrame builds a close frame; a negative code means an empty body.
func closeFrame(code int, reason string) []byte {
	if code < 0 {
		return finishFrame(newFrame(0), ws.OpClose)
	}
	if len(reason) > 123 {
		reason = reason[:123]
	}
	b := newFrame(2 + len(reason))
	b = binary.BigEndian.AppendUint16(b, uint16(code))
	b = append(b, reason...)
	return finishFrame(b, ws.OpClose)
}

func addrOf(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(ta.IP); ok {
			return ip.Unmap()
		}
	}
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}
