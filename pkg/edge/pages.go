package edge

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// maxRequestLine bounds the first line of a request read to choose between
// the WebSocket and the pages (a longer one is not a page request).
const maxRequestLine = 4096

// pageHeaderBytes bounds the headers of a page request (64 KiB; past it
// 431).
const pageHeaderBytes = 64 << 10

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
	p := s.pages()
	if p == nil {
		nc.Close() // the server is closed
		return nil, true
	}
	if !p.admit() {
		s.log.Warn("refusing a page request: too many page connections", "limit", s.cfg.MaxPageConns)
		refusePage(nc, pageRefusal)
		return nil, true
	}
	nc.SetDeadline(time.Time{})
	if !p.offer(rc) {
		p.open.Add(-1)
		nc.Close() // the server is closed
	}
	return nil, true
}

// pageRefusal answers a page request past MaxPageConns.
const pageRefusal = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n" +
	"Retry-After: 1\r\nConnection: close\r\nContent-Length: 34\r\n\r\ntoo many page requests; try again\n"

// pageBodyRefusal answers a page request that announces a body.
const pageBodyRefusal = "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n" +
	"Connection: close\r\nContent-Length: 29\r\n\r\na page request takes no body\n"

// refusePage writes answer on nc and closes it, within a second. What
// the client sends meanwhile is read first, so that closing does not reset
// the connection before the answer is read.
func refusePage(nc net.Conn, answer string) {
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(nc, answer); err != nil {
		return
	}
	if cw, ok := nc.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(nc, maxRequestLine))
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

// CloseWrite sends the socket's FIN, when it has one.
func (c *replayConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// pageServer is an http.Server fed the page connections of the WebSocket
// listener.
type pageServer struct {
	srv   *http.Server
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	limit int64
	open  atomic.Int64 // page connections admitted and not closed
}

// admit counts a new page connection if it fits MaxPageConns.
func (p *pageServer) admit() bool {
	if p.open.Add(1) > p.limit {
		p.open.Add(-1)
		return false
	}
	return true
}

// connState gives back a page connection's place once it is closed (a
// hijacked one: see noBody).
func (p *pageServer) connState(_ net.Conn, st http.ConnState) {
	if st == http.StateClosed {
		p.open.Add(-1)
	}
}

// PageConns is the number of open page connections.
func (s *Server) PageConns() int {
	if s.cfg.Pages == nil {
		return 0
	}
	if p := s.pages(); p != nil {
		return int(p.open.Load())
	}
	return 0
}

// noBody serves h to requests without a body. A page request that
// announces one is answered 400 and closed without reading it: the server
// would otherwise wait for the body before it reuses or closes the
// connection, and a client that never sends it would hold it.
func (p *pageServer) noBody(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength == 0 {
			h.ServeHTTP(w, r)
			return
		}
		nc, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			w.Header().Set("Connection", "close")
			http.Error(w, "a page request takes no body", http.StatusBadRequest)
			return
		}
		refusePage(nc, pageBodyRefusal)
		p.open.Add(-1)
	})
}

// pages starts the page server on first use; nil once the server is closed
// without having started it.
func (s *Server) pages() *pageServer {
	s.pagesOnce.Do(func() {
		p := &pageServer{
			srv: &http.Server{
				Handler:           nil, // below: p.noBody
				ReadHeaderTimeout: s.cfg.PageTimeout,
				ReadTimeout:       s.cfg.PageTimeout,
				WriteTimeout:      3 * s.cfg.PageTimeout,
				IdleTimeout:       6 * s.cfg.PageTimeout,
				MaxHeaderBytes:    pageHeaderBytes,
				ErrorLog:          nil,
			},
			conns: make(chan net.Conn),
			done:  make(chan struct{}),
			limit: int64(s.cfg.MaxPageConns),
		}
		p.srv.Handler, p.srv.ConnState = p.noBody(s.cfg.Pages), p.connState
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
