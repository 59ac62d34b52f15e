package main

// The floor: a bare gobwas WebSocket server that speaks only hello → ready
// and ping → pong of Protocol v1, with a goroutine per connection and no
// store, bus or router behind it. It is what the machine and the load
// generator can do at all; a step run measures it with the same client and
// the same steps as the gateway and reports each rate as a ratio to it.

import (
	"bufio"
	"context"
	"crypto/subtle"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/hermes-mobile/gateway/pkg/config"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/secret"
)

const (
	// floorHelloTimeout is how long the floor waits for the upgrade and
	// hello, as the spec's hello timeout.
	floorHelloTimeout = 15 * time.Second
	// floorReadBuffer is the buffered reader of one floor connection.
	floorReadBuffer = 4 << 10
)

// floorServer is a running floor.
type floorServer struct {
	ln    net.Listener
	token []byte
	wg    sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// startFloor listens on addr, which must be a loopback address, and serves
// the floor with token as its app token until Close.
func startFloor(addr, token string) (*floorServer, error) {
	if token == "" {
		return nil, errors.New("floor: a token is required")
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("floor: %w", err)
	}
	if ip, err := netip.ParseAddr(host); host != "localhost" && (err != nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("floor: %q: the floor listens on loopback only", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("floor: %w", err)
	}
	f := &floorServer{ln: ln, token: []byte(token), conns: map[net.Conn]struct{}{}}
	f.wg.Go(f.accept)
	return f, nil
}

// URL is the floor's WebSocket URL.
func (f *floorServer) URL() string { return "ws://" + f.ln.Addr().String() + "/ws" }

// Close stops accepting, closes every connection and waits for their
// goroutines.
func (f *floorServer) Close() error {
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	err := f.ln.Close()
	f.wg.Wait()
	return err
}

func (f *floorServer) accept() {
	for {
		nc, err := f.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		f.mu.Lock()
		if f.closed {
			f.mu.Unlock()
			nc.Close()
			return
		}
		f.conns[nc] = struct{}{}
		f.mu.Unlock()
		f.wg.Go(func() {
			f.serve(nc)
			f.mu.Lock()
			delete(f.conns, nc)
			f.mu.Unlock()
			nc.Close()
		})
	}
}

// serve upgrades nc and answers its frames: hello with ready (or a fatal
// error), then ping with pong; anything else after hello is ignored.
func (f *floorServer) serve(nc net.Conn) {
	nc.SetDeadline(time.Now().Add(floorHelloTimeout))
	if _, err := ws.Upgrade(nc); err != nil {
		return
	}
	rw := struct {
		io.Reader
		io.Writer
	}{bufio.NewReaderSize(nc, floorReadBuffer), nc}
	helloed := false
	var out []byte
	for {
		msg, op, err := wsutil.ReadClientData(rw)
		if err != nil {
			return
		}
		if op != ws.OpText {
			continue
		}
		fr, perr := protocol.Decode(msg)
		if !helloed {
			h, ok := fr.(*protocol.Hello)
			switch {
			case perr != nil || !ok:
				floorFatal(nc, protocol.NewError(protocol.CodeBadFrame, "the first frame must be hello"))
				return
			case subtle.ConstantTimeCompare([]byte(h.Token), f.token) != 1:
				floorFatal(nc, protocol.NewError(protocol.CodeAuthFailed, "invalid token"))
				return
			}
			dev := h.Device
			if dev.ID == "" {
				dev.ID = "dev-floor"
			}
			helloed = true
			nc.SetDeadline(time.Time{})
			out = protocol.AppendReady(out[:0], protocol.Ready{Session: protocol.Session(dev.ID), DeviceID: dev.ID, DeviceName: dev.Name})
		} else if p, ok := fr.(*protocol.Ping); ok && perr == nil {
			out = protocol.AppendPong(out[:0], p.TS)
		} else {
			continue
		}
		if err := wsutil.WriteServerText(nc, out); err != nil {
			return
		}
	}
}

// floorFatal sends a fatal error frame and a close frame 1008, as the edge
// does.
func floorFatal(nc net.Conn, e *protocol.Error) {
	e.Fatal = true
	nc.SetWriteDeadline(time.Now().Add(time.Second))
	_ = wsutil.WriteServerText(nc, protocol.AppendError(nil, e))
	_ = ws.WriteFrame(nc, ws.NewCloseFrame(ws.NewCloseFrameBody(ws.StatusCode(protocol.CloseCode), string(e.Code))))
}

// floorMain runs `loadtest floor`: the floor as a process of its own, until
// SIGINT or SIGTERM. It logs {"msg":"floor listening","url":"ws://…/ws"}.
func floorMain(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("loadtest floor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "address to listen on (loopback only)")
	var token secret.Secret
	config.Secret(fs, &token, "token", "MOBILE_TOKEN", "the app token hello must carry")
	if err := config.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "loadtest floor:", err)
		return exitUsage
	}
	f, err := startFloor(*listen, string(token))
	if err != nil {
		fmt.Fprintln(stderr, "loadtest", err)
		return exitUsage
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	log.Info("floor listening", "url", f.URL())
	<-ctx.Done()
	f.Close()
	return 0
}
