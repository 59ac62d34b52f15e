package client

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// testServer is a scripted WebSocket server on a real socket of 127.0.0.1:
// every accepted connection is upgraded and handed to the script.
type testServer struct {
	url string
	ln  net.Listener
	wg  sync.WaitGroup
}

// serverConn is the server's end of one connection.
type serverConn struct {
	net.Conn
	t      *testing.T
	header http.Header
}

// startServer serves script on 127.0.0.1:0 until the test ends; the cleanup
// waits for every script to return. With upgrade false the script gets the
// raw TCP connection before any handshake.
func startServer(t *testing.T, upgrade bool, script func(sc *serverConn)) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf(
			"listen: %v",
			err,
		)
	}
	s := &testServer{url: "ws://" + ln.Addr().String() + "/ws", ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
				sc := &serverConn{Conn: conn, t: t, header: http.Header{}}
				if upgrade {
					u := ws.Upgrader{
						OnHeader: func(k, v []byte) error {
							sc.header.Add(string(k), string(v))
							return nil
						},
					}
					if _, err := u.Upgrade(conn); err != nil {
						t.Errorf(
							"server: upgrade: %v",
							err,
						)
						return
					}
				}
				script(sc)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.wg.Wait()
	})
	return s
}

// send writes one text message.
func (sc *serverConn) send(b []byte) {
	if err := wsutil.WriteServerText(sc.Conn, b); err != nil {
		sc.t.Errorf(
			"server: write: %v",
			err,
		)
	}
}

// sendFrame writes one unmasked frame.
func (sc *serverConn) sendFrame(op ws.OpCode, fin bool, p []byte) {
	if err := ws.WriteFrame(sc.Conn, ws.NewFrame(op, fin, p)); err != nil {
		sc.t.Errorf(
			"server: write frame: %v",
			err,
		)
	}
}

// sendClose writes a close frame.
func (sc *serverConn) sendClose(code ws.StatusCode, reason string) {
	sc.sendFrame(ws.OpClose, true, ws.NewCloseFrameBody(code, reason))
}

// readMessage reads the next data message, answering pings and closes.
func (sc *serverConn) readMessage() ([]byte, error) {
	p, _, err := wsutil.ReadClientData(sc.Conn)
	return p, err
}

// decode reads the next message and decodes it as the gateway would.
func (sc *serverConn) decode() (protocol.ClientFrame, error) {
	p, err := sc.readMessage()
	if err != nil {
		return nil, err
	}
	f, perr := protocol.Decode(p)
	if perr != nil {
		return nil, fmt.Errorf("decode %q: %w", p, perr)
	}
	return f, nil
}

// readFrame reads one frame as it is on the wire, its payload unmasked.
func (sc *serverConn) readFrame() (ws.Header, []byte, error) {
	h, err := ws.ReadHeader(sc.Conn)
	if err != nil {
		return h, nil, err
	}
	p := make([]byte, h.Length)
	if _, err := io.ReadFull(sc.Conn, p); err != nil {
		return h, nil, err
	}
	if h.Masked {
		ws.Cipher(p, h.Mask, 0)
	}
	return h, p, nil
}

// readClose reads until the client's close frame and returns its code; an
// error if the connection ends without one.
func (sc *serverConn) readClose() (ws.StatusCode, error) {
	for {
		_, err := sc.readMessage()
		var closed wsutil.ClosedError
		if errors.As(err, &closed) {
			return closed.Code, nil
		}
		if err != nil {
			return 0, err
		}
	}
}
