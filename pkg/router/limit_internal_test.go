package router

import (
	"net"
	"net/http"
	"testing"
	"testing/synctest"
	"time"
)

// pipeListener hands out the server ends of net.Pipe connections sent on
// conns, in order: the accept queue of the limit listener under test.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
}

func (p *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-p.conns:
		return c, nil
	case <-p.done:
		return nil, net.ErrClosed
	}
}
func (p *pipeListener) Close() error   { close(p.done); return nil }
func (p *pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// TestStrangerGrace: with the connection limit held by an authenticated
// connection and three strangers, a new connection closes no stranger
// until the oldest was accepted StrangerGrace ago: one nanosecond before,
// it still waits and every stranger is open; at the grace, the oldest
// stranger is closed and the new connection is served. A client's own
// new connections in a burst are not closed before their request is read.
// The grace runs from the accept only: strangers that keep beginning
// requests are closed as before.
func TestStrangerGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const grace = 250 * time.Millisecond
		pl := &pipeListener{conns: make(chan net.Conn, 8), done: make(chan struct{})}
		a := &API{cfg: APIConfig{MaxConns: 4, FirstByteTimeout: time.Hour, AnonIdleTimeout: time.Hour, StrangerGrace: grace}}
		l := a.Listener(pl)
		defer l.Close()
		dial := func() net.Conn {
			server, client := net.Pipe()
			t.Cleanup(func() { client.Close() })
			pl.conns <- server
			return client
		}
		var held []*limitConn
		for range 4 {
			dial()
			c, err := l.Accept()
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c.(*limitConn))
			time.Sleep(time.Millisecond) // each in its state a moment longer than the next
		}
		held[0].trust.Store(authed)
		strangers := held[1:]

		dial()
		got := make(chan net.Conn, 1)
		go func() {
			c, err := l.Accept()
			if err != nil {
				t.Error(err)
			}
			got <- c
		}()
		// The oldest stranger came 3 ms before this one began to wait.
		time.Sleep(grace - 3*time.Millisecond - time.Nanosecond)
		synctest.Wait()
		select {
		case <-got:
			t.Fatal("the new connection was served before a stranger passed its grace")
		default:
		}
		for i, s := range strangers {
			if s.trust.Load() == evicted {
				t.Fatalf("stranger %d closed %v after it came, before its grace %v", i, time.Since(time.Unix(0, s.accepted.Load())), grace)
			}
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		select {
		case c := <-got:
			if c == nil {
				t.Fatal("no connection")
			}
			c.(*limitConn).trust.Store(authed) // an agent's: its request had a valid token
		default:
			t.Fatal("the new connection still waits with a stranger past its grace")
		}
		if strangers[0].trust.Load() != evicted {
			t.Fatal("the oldest stranger, past its grace, is not the one closed")
		}
		for i, s := range strangers[1:] {
			if s.trust.Load() == evicted {
				t.Fatalf("stranger %d, within its grace, closed too", i+1)
			}
		}
		if held[0].trust.Load() != authed {
			t.Fatal("the authenticated connection was closed")
		}

		// Past their grace, strangers that keep beginning requests (a
		// stranger's requests need no token: /healthz) are no newer for
		// it: the next connection closes one at once.
		time.Sleep(grace)
		for _, s := range strangers[1:] {
			s.setState(http.StateActive)
		}
		dial()
		go func() {
			c, err := l.Accept()
			if err != nil {
				t.Error(err)
			}
			got <- c
		}()
		synctest.Wait()
		select {
		case <-got:
		default:
			t.Fatal("a connection waits for strangers that began a request just now, though they came long ago")
		}
		closed := 0
		for _, s := range strangers[1:] {
			if s.trust.Load() == evicted {
				closed++
			}
		}
		if closed != 1 {
			t.Fatalf("%d of the busy strangers closed for one new connection, want 1", closed)
		}
	})
}
