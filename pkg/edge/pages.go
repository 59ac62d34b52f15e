package edge

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// maxRequestLine bounds the first line of a request read to choose between
// the WebSocket and the pages (a longer one is not a page request).
const maxRequestLine = 4096

// route reads the request line of nc. A request for /ws (or any request
// when Config.Pages is nil) goes on to the WebSocket upgrade, which reads
// the returned conn: it replays the bytes read so far. Any other request is
// handed to the pages server and page is true. As with a plain upgrade, a
// client must not send frames before the 101 response: bytes read past the
// handshake are not kept.
func (s *Server) route(nc net.Conn) (net.Conn, bool) {
	if s.cfg.Pages == nil {
		return nc, false
	}
	br := bufio.NewReaderSize(nc, maxRequestLine)
	line, err := br.ReadSlice('\n')
	rc := &replayConn{Conn: nc, r: io.MultiReader(bytes.NewReader(bytes.Clone(line)), br)}
	if err != nil || isWebSocketPath(line) {
		// An overlong or cut line goes to the upgrader, which refuses it.
		return rc, false
	}
	nc.SetDeadline(time.Time{})
	if p := s.pages(); p == nil || !p.offer(rc) {
		nc.Close() // the server is closed
	}
	return nil, true
}

// isWebSocketPath reports whether the request line asks for /ws.
func isWebSocketPath(line []byte) bool {
	f := strings.Fields(string(line))
	if len(f) < 2 {
		return true
	}
	path, _, _ := strings.Cut(f[1], "?")
	return path == "/ws"
}

// avatarURL is ready's avatar_url for a phone that connected to host.
func (s *Server) avatarURL(host, proto string, trusted bool) string {
	if s.cfg.AvatarURL != "" || s.cfg.Pages == nil || s.cfg.AvatarPath == "" || host == "" {
		return s.cfg.AvatarURL
	}
	scheme := "http"
	if trusted && strings.EqualFold(strings.TrimSpace(proto), "https") {
		scheme = "https"
	}
	return scheme + "://" + host + s.cfg.AvatarPath
}

// replayConn reads the bytes already taken from the socket before the rest.
type replayConn struct {
	net.Conn
	r io.Reader
}

func (c *replayConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// pageServer is an http.Server fed the page connections of the WebSocket
// listener.
type pageServer struct {
	srv   *http.Server
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

// pages starts the page server on first use; nil once the server is closed
// without having started it.
func (s *Server) pages() *pageServer {
	s.pagesOnce.Do(func() {
		p := &pageServer{
			srv: &http.Server{
				Handler:           s.cfg.Pages,
				ReadHeaderTimeout: handshakeTimeout,
				IdleTimeout:       time.Minute,
				ErrorLog:          nil,
			},
			conns: make(chan net.Conn),
			done:  make(chan struct{}),
		}
		s.pageSrv = p
		s.goFunc(func() { _ = p.srv.Serve(p) }) // http.ErrServerClosed once the edge closes
	})
	return s.pageSrv
}

// offer hands c to the server; false once it is closed.
func (p *pageServer) offer(c net.Conn) bool {
	select {
	case p.conns <- c:
		return true
	case <-p.done:
		return false
	}
}

// Accept, Close and Addr make the server its own listener.
func (p *pageServer) Accept() (net.Conn, error) {
	select {
	case c := <-p.conns:
		return c, nil
	case <-p.done:
		return nil, net.ErrClosed
	}
}

func (p *pageServer) Close() error {
	p.once.Do(func() { close(p.done) })
	return nil
}

func (p *pageServer) Addr() net.Addr { return &net.TCPAddr{} }

// closePages stops the page server and its connections.
func (s *Server) closePages() {
	s.pagesOnce.Do(func() {}) // no server is started after this
	if s.pageSrv != nil {
		s.pageSrv.srv.Close()
	}
}
