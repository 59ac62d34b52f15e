//go:build unix

package fault

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
)

// wsFrame is an unmasked text frame with payload p, as a server sends it.
func wsFrame(p string) []byte {
	switch n := len(p); {
	case n < 126:
		return append([]byte{0x81, byte(n)}, p...)
	default:
		return append([]byte{0x81, 126, byte(n >> 8), byte(n)}, p...)
	}
}

// TestBlackholeLetsOnlyReadyThrough: the blackhole forwards the handshake's
// answer and the first frame, nothing after either way, closes neither
// side, and counts the messages the server wrote after ready.
func TestBlackholeLetsOnlyReadyThrough(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	answer := []byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n")
	ready := wsFrame(`{"t":"ready","session":"mobile:a"}`)
	long := `{"t":"message","id":"m2","text":"` + string(bytes.Repeat([]byte("x"), 300)) + `","final":true}`
	after := append(append(wsFrame(`{"t":"message","id":"m1","text":"a","final":true}`), wsFrame(`{"t":"pong","id":"1"}`)...), wsFrame(long)...)
	fromPhone := make(chan []byte, 16)
	serverDone := make(chan struct{})
	go func() {
		defer close(serverDone)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 1024)
		n, _ := c.Read(buf) // the upgrade request
		fromPhone <- append([]byte(nil), buf[:n]...)
		// The answer to the handshake; ready only after the hello, as an
		// edge does; ready with the start of the next frame in one write:
		// the blackhole must cut exactly after ready.
		_, _ = c.Write(answer)
		n, _ = c.Read(buf) // the hello
		fromPhone <- append([]byte(nil), buf[:n]...)
		all := append(append([]byte(nil), ready...), after...)
		_, _ = c.Write(all[:len(ready)+5])
		time.Sleep(50 * time.Millisecond) // a gap between the writes, so the cut may fall in either read
		_, _ = c.Write(all[len(ready)+5:])
		_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		for {
			n, err := c.Read(buf)
			if n > 0 {
				fromPhone <- append([]byte(nil), buf[:n]...)
			}
			if err != nil {
				return
			}
		}
	}()
	b, err := newBlackhole(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	phone, err := net.Dial("tcp", b.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer phone.Close()
	if _, err := phone.Write([]byte("GET /ws HTTP/1.1\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(answer))
	if _, err := io.ReadFull(phone, got); err != nil || !bytes.Equal(got, answer) {
		t.Fatalf("through the blackhole: %q, %v; want the answer to the handshake", got, err)
	}
	if _, err := phone.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	got = make([]byte, len(ready))
	if _, err := io.ReadFull(phone, got); err != nil || !bytes.Equal(got, ready) {
		t.Fatalf("through the blackhole: %q, %v; want ready", got, err)
	}
	testsvc.WaitFor(t, 5*time.Second, "the blackhole to close after ready", b.silent)
	if _, err := phone.Write([]byte("after ready")); err != nil {
		t.Fatal(err)
	}
	_ = phone.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := phone.Read(make([]byte, 64)); n != 0 || err == io.EOF {
		t.Fatalf("after ready the phone read %d bytes, %v; want silence, no EOF", n, err)
	}
	<-serverDone // the server read until its deadline: it was neither closed nor reset
	for _, want := range []string{"GET /ws HTTP/1.1\r\n\r\n", "hello"} {
		if got := string(<-fromPhone); got != want {
			t.Fatalf("the server got %q, want %q", got, want)
		}
	}
	if len(fromPhone) != 0 {
		t.Fatalf("the server got %q after ready", <-fromPhone)
	}
	if n := b.unread(); n != 2 {
		t.Fatalf("unread = %d, want 2 (two messages after ready, a pong not counted)", n)
	}
}
