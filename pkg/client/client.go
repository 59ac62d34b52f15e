package client

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// Defaults of Options.
const (
	// DefaultReadLimit bounds one message from the server: twice the
	// protocol's frame limit, so that a test can receive whatever the gateway
	// sends, including a frame that is too big.
	DefaultReadLimit = protocol.MaxFrameBytes * 2
	// DefaultBuffer is how many received frames wait for the consumer before
	// the reader stops reading the socket.
	DefaultBuffer = 1024
)

// closeWait bounds how long the closing handshake waits for the server: for
// its close frame after ours (Close) and for it to drop the TCP connection
// after the handshake, before the client drops it itself.
const closeWait = 2 * time.Second

// controlWriteTimeout bounds a pong or close written by the reader goroutine,
// which must not stay blocked on a server that does not read.
const controlWriteTimeout = 5 * time.Second

// ErrClosed is returned by the senders once the connection is closed or a
// close frame has been sent.
var ErrClosed = errors.New("client: connection is closed")

// Options of Dial. The zero value is usable.
type Options struct {
	// LocalAddr is the source address to dial from (the port is the
	// system's choice). The zero Addr means the system's choice.
	LocalAddr netip.Addr
	// Header holds extra headers of the handshake request (X-Forwarded-For,
	// Origin, ...). A Host header replaces the host of the URL.
	Header http.Header
	// ReadLimit bounds one message from the server, all its fragments
	// together; a larger one ends the connection. Zero means
	// DefaultReadLimit.
	ReadLimit int64
	// Timeout bounds the TCP connect and the WebSocket handshake together.
	// Zero means only ctx bounds them.
	Timeout time.Duration
	// WriteTimeout bounds each send. Zero means a send waits as long as the
	// server does not read.
	WriteTimeout time.Duration
	// Buffer is how many received frames the reader keeps for the consumer;
	// when they are not consumed, it stops reading the socket. Zero means
	// DefaultBuffer.
	Buffer int
	// AutoAck acknowledges every message and file once it is complete (its
	// final frame, its last chunk), with the protocol's ack frame, as the
	// app does once it has displayed them.
	AutoAck bool
}

// HandshakeError is the server's refusal of the WebSocket upgrade: an HTTP
// status other than 101. It unwraps to ws.StatusError.
type HandshakeError struct {
	Status int
	Header http.Header
	Body   []byte // at most 64 KiB, and only when the length was announced
}

func (e *HandshakeError) Error() string {
	s := fmt.Sprintf("client: handshake refused: HTTP %d", e.Status)
	if b := bytes.TrimSpace(e.Body); len(b) > 0 {
		if len(b) > 200 {
			b = b[:200]
		}
		s += ": " + string(b)
	}
	return s
}

func (e *HandshakeError) Unwrap() error { return ws.StatusError(e.Status) }

// Conn is a Protocol v1 connection to the gateway. The senders are safe for
// concurrent use with each other and with the consumer methods (Next, Expect,
// ExpectClose, CollectMessage, CollectMedia, Hello), which may also be called
// from several goroutines but take turns.
type Conn struct {
	conn         net.Conn
	br           *bufio.Reader
	readLimit    int64
	writeTimeout time.Duration
	autoAck      bool

	// Reader side. endErr is written by the reader before it closes frames.
	frames   chan Frame
	done     chan struct{} // closed when the reader has returned
	quit     chan struct{} // closed by Close/CloseNow: stop delivering
	quitOnce sync.Once
	endErr   error

	closed      atomic.Bool // the socket is closed
	closeQueued atomic.Bool // a close frame is queued or sent: write nothing else

	// Writer side, guarded by wmu.
	wmu         sync.Mutex
	werr        error // sticky: the stream is unusable
	closeSent   bool
	wbuf        []byte
	partialLeft int64 // payload still owed to a frame of SendHeaderOnly
	partialOff  int64
	partialMask [4]byte

	// Control frames waiting for the write side, guarded by ctlMu.
	ctlMu sync.Mutex
	ctl   []control

	// Consumer side: rsem is held by the consumer; pending is the backlog.
	rsem    chan struct{}
	pending []Frame
}

type control struct {
	op ws.OpCode
	p  []byte
}

// Dial connects to url (ws:// or wss://) and performs the WebSocket
// handshake. The connection is open until Close or CloseNow, whatever
// becomes of ctx after Dial returns.
func Dial(ctx context.Context, url string, opts Options) (*Conn, error) {
	nd := &net.Dialer{}
	if opts.LocalAddr.IsValid() {
		nd.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(opts.LocalAddr, 0))
	}
	d := ws.Dialer{
		Timeout: opts.Timeout,
		NetDial: nd.DialContext,
	}
	if len(opts.Header) > 0 {
		h := opts.Header.Clone()
		if host := h.Get("Host"); host != "" {
			d.Host = host
			h.Del("Host")
		}
		d.Header = ws.HandshakeHeaderHTTP(h)
	}
	var refused *HandshakeError
	d.OnStatusError = func(status int, _ []byte, resp io.Reader) {
		refused = &HandshakeError{Status: status}
		r, err := http.ReadResponse(bufio.NewReader(resp), nil)
		if err != nil {
			return
		}
		refused.Header = r.Header
		if r.ContentLength > 0 && r.ContentLength <= 64<<10 {
			refused.Body, _ = io.ReadAll(io.LimitReader(r.Body, r.ContentLength))
		}
	}
	conn, br, _, err := d.Dial(ctx, url)
	if err != nil {
		if refused != nil {
			return nil, refused
		}
		return nil, fmt.Errorf("client: dial %s: %w", url, err)
	}
	if br == nil {
		br = bufio.NewReaderSize(conn, 4096)
	}
	c := &Conn{
		conn:         conn,
		br:           br,
		readLimit:    opts.ReadLimit,
		writeTimeout: opts.WriteTimeout,
		autoAck:      opts.AutoAck,
		done:         make(chan struct{}),
		quit:         make(chan struct{}),
		rsem:         make(chan struct{}, 1),
	}
	if c.readLimit <= 0 {
		c.readLimit = DefaultReadLimit
	}
	buffer := opts.Buffer
	if buffer <= 0 {
		buffer = DefaultBuffer
	}
	c.frames = make(chan Frame, buffer)
	go c.readLoop()
	return c, nil
}

// LocalAddr is the client's end of the TCP connection.
func (c *Conn) LocalAddr() net.Addr { return c.conn.LocalAddr() }

// RemoteAddr is the server's end of the TCP connection.
func (c *Conn) RemoteAddr() net.Addr { return c.conn.RemoteAddr() }

// Done is closed when the reader goroutine has returned: the connection is
// over, though frames may still wait to be consumed.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err is why the connection ended (wrapping io.EOF), or nil while it lasts.
func (c *Conn) Err() error {
	select {
	case <-c.done:
		return c.endErr
	default:
		return nil
	}
}

// ackIfShown acknowledges f when the app would have shown it complete: the
// final frame of a message, the last chunk of a file. The ack is sent by its
// own goroutine, so that the reader never waits for the writer.
func (c *Conn) ackIfShown(f Frame) {
	if id := f.Str("id"); id != "" && (f.T() == protocol.TypeMessage || f.T() == protocol.TypeMedia) && f.Bool("final") {
		go func() { _ = c.Ack(id) }() // fails only once the socket is gone, which the reader sees
	}
}

// ---- reader goroutine ----

// errRemoteClose stops the reader when the server's close frame arrives.
var errRemoteClose = errors.New("close frame received")

func (c *Conn) readLoop() {
	defer close(c.done)
	var (
		remote    *CloseInfo
		closeBody []byte
	)
	onControl := func(h ws.Header, r io.Reader) error {
		p := make([]byte, h.Length)
		if _, err := io.ReadFull(r, p); err != nil {
			return err
		}
		switch h.OpCode {
		case ws.OpPing:
			c.queueControl(ws.OpPong, p)
			c.flushControl()
		case ws.OpClose:
			remote = &CloseInfo{Code: int(ws.StatusNoStatusRcvd)}
			if len(p) >= 2 {
				code, reason := ws.ParseCloseFrameData(p)
				remote.Code, remote.Reason = int(code), reason
			}
			closeBody = p
			return errRemoteClose
		}
		return nil
	}
	rd := &wsutil.Reader{
		Source:         c.br,
		State:          ws.StateClientSide,
		MaxFrameSize:   c.readLimit,
		MaxMessageSize: c.readLimit,
		OnIntermediate: onControl,
	}
	var (
		err    error
		linger bool // a close handshake is under way: let the server end it
	)
	for {
		var h ws.Header
		h, err = rd.NextFrame()
		if err != nil {
			break
		}
		if h.OpCode.IsControl() {
			if err = onControl(h, rd); err != nil {
				break
			}
			continue
		}
		var buf bytes.Buffer
		buf.Grow(int(min(h.Length, 64<<10)))
		if _, err = buf.ReadFrom(rd); err != nil {
			break
		}
		f := decodeFrame(h.OpCode, buf.Bytes())
		if c.autoAck {
			c.ackIfShown(f)
		}
		c.deliver(f)
	}

	switch {
	case remote != nil:
		// Answer with a close frame echoing the code (RFC 6455, 5.5.1),
		// unless we sent ours first; then wait for the server to drop TCP.
		reply := closeBody
		if len(reply) > 2 {
			reply = reply[:2]
		}
		if c.queueClose(reply) {
			c.flushControl()
		}
		linger = true
		c.deliver(closeFrame(remote, closeBody))
		c.endErr = fmt.Errorf("client: connection closed by the server (%s): %w", remote, io.EOF)
	case c.isQuit():
		c.endErr = fmt.Errorf("client: connection closed: %w", io.EOF)
	case errors.Is(err, io.EOF):
		c.endErr = fmt.Errorf("client: connection lost without a close frame: %w", err)
	default:
		var code ws.StatusCode
		var perr ws.ProtocolError
		switch {
		case errors.Is(err, wsutil.ErrMessageTooLarge), errors.Is(err, wsutil.ErrFrameTooLarge):
			code = ws.StatusMessageTooBig
		case errors.As(err, &perr):
			code = ws.StatusProtocolError
		}
		if code != 0 && c.queueClose(ws.NewCloseFrameBody(code, "")) {
			c.flushControl()
			linger = true
		}
		c.endErr = fmt.Errorf("client: connection lost: %w: %w", err, io.EOF)
	}
	close(c.frames)

	if linger && !c.closed.Load() {
		// Whatever still comes (the server's close, the rest of a frame
		// too large to read) is discarded until the server drops TCP.
		_ = c.conn.SetReadDeadline(time.Now().Add(closeWait))
		_, _ = io.Copy(io.Discard, c.br)
	}
	c.closed.Store(true)
	_ = c.conn.Close()
}

// deliver hands f to the consumer, or drops it once the Conn is being closed
// (a frame arriving after Close, such as the server's answer to our close,
// is never delivered).
func (c *Conn) deliver(f Frame) {
	if c.isQuit() {
		return
	}
	select {
	case c.frames <- f:
	case <-c.quit:
	}
}

func (c *Conn) isQuit() bool {
	select {
	case <-c.quit:
		return true
	default:
		return false
	}
}

// ---- consumer side ----

func (c *Conn) acquire(ctx context.Context) error {
	select {
	case c.rsem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Conn) release() { <-c.rsem }

// recv takes the next frame from the reader. ok is false when there will be
// no more; err is the context's error.
func (c *Conn) recv(ctx context.Context) (f Frame, ok bool, err error) {
	select {
	case f, ok = <-c.frames:
		return f, ok, nil
	default:
	}
	select {
	case f, ok = <-c.frames:
		return f, ok, nil
	case <-ctx.Done():
		return Frame{}, true, ctx.Err()
	}
}

// next takes the next frame: from the backlog first, then from the reader.
func (c *Conn) next(ctx context.Context) (Frame, error) {
	if len(c.pending) > 0 {
		f := c.pending[0]
		c.pending[0] = Frame{}
		c.pending = c.pending[1:]
		return f, f.Err()
	}
	f, ok, err := c.recv(ctx)
	if err != nil {
		return Frame{}, err
	}
	if !ok {
		return Frame{}, c.endErr
	}
	return f, f.Err()
}

// Next returns the next frame from the server. A WebSocket close is a Frame
// with T() == "" and Close() != nil; once the connection is over, Next
// returns an error wrapping io.EOF. A message that is not a JSON object is
// returned together with an error saying so.
func (c *Conn) Next(ctx context.Context) (Frame, error) {
	if err := c.acquire(ctx); err != nil {
		return Frame{}, err
	}
	defer c.release()
	return c.next(ctx)
}

// Expect returns the next frame of type t, consuming the frames of other
// types before it. If the connection closes or ctx ends first, the error
// names the frames it skipped.
func (c *Conn) Expect(ctx context.Context, t string) (Frame, error) {
	if err := c.acquire(ctx); err != nil {
		return Frame{}, err
	}
	defer c.release()
	var skipped []Frame
	for {
		f, err := c.next(ctx)
		if err != nil {
			return f, fmt.Errorf("client: waiting for a %q frame%s: %w", t, skippedList(skipped), err)
		}
		if ci := f.Close(); ci != nil {
			return f, fmt.Errorf("client: waiting for a %q frame%s: server closed the connection (%s): %w",
				t, skippedList(skipped), ci, io.EOF)
		}
		if f.T() == t {
			return f, nil
		}
		skipped = append(skipped, f)
	}
}

// ExpectClose consumes frames until the server's WebSocket close and returns
// its code and reason. It fails if the connection ends without one.
func (c *Conn) ExpectClose(ctx context.Context) (*CloseInfo, error) {
	if err := c.acquire(ctx); err != nil {
		return nil, err
	}
	defer c.release()
	var skipped []Frame
	for {
		f, err := c.next(ctx)
		if err != nil && f.IsZero() {
			return nil, fmt.Errorf("client: waiting for a close frame%s: %w", skippedList(skipped), err)
		}
		if ci := f.Close(); ci != nil {
			return ci, nil
		}
		skipped = append(skipped, f)
	}
}

// skippedList describes skipped frames for an error message.
func skippedList(fs []Frame) string {
	if len(fs) == 0 {
		return " (nothing else arrived)"
	}
	const most = 20
	var b strings.Builder
	fmt.Fprintf(&b, " (skipped %d:", len(fs))
	for i, f := range fs {
		if i == most {
			fmt.Fprintf(&b, " ... %d more", len(fs)-most)
			break
		}
		b.WriteString(" ")
		b.WriteString(f.describe())
	}
	b.WriteString(")")
	return b.String()
}

// ---- closing ----

// Close sends a close frame (1000, normal closure), waits a little for the
// server's answer and closes the socket. Frames received before are still
// returned by Next. Close is idempotent.
func (c *Conn) Close() error {
	c.quitOnce.Do(func() { close(c.quit) })
	if c.queueClose(ws.NewCloseFrameBody(ws.StatusNormalClosure, "")) {
		c.flushControl()
	}
	timer := time.NewTimer(closeWait)
	defer timer.Stop()
	select {
	case <-c.done:
		return nil
	case <-timer.C:
	}
	return c.CloseNow()
}

// CloseNow closes the TCP connection without a close frame, as a network
// drop would, and waits for the reader to return.
func (c *Conn) CloseNow() error {
	c.quitOnce.Do(func() { close(c.quit) })
	already := c.closed.Swap(true)
	err := c.conn.Close()
	<-c.done
	if already {
		return nil
	}
	return err
}
