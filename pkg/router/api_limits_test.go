package router_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/router"
)

// rawConn dials the API of e.
func rawConn(t *testing.T, e *env) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// readResponse reads one response from c within d.
func readResponse(t *testing.T, c net.Conn, br *bufio.Reader, d time.Duration) *http.Response {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(d))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no response within %v: %v", d, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// wantClosed expects the server to close c within d.
func wantClosed(t *testing.T, c net.Conn, br *bufio.Reader, d time.Duration) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(d))
	if _, err := br.ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the connection is still open after %v (%v)", d, err)
	}
}

// TestAPIBodyTimeout: a request whose body trickles in is cut off once
// BodyTimeout has passed since its headers, instead of being held forever.
func TestAPIBodyTimeout(t *testing.T) {
	e := startSingle(t, apiConfig(func(c *router.APIConfig) { c.BodyTimeout = 300 * time.Millisecond }))
	c := rawConn(t, e)
	br := bufio.NewReader(c)
	io.WriteString(c, "POST /v1/deliver HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+deliverToken+
		"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"text\":")
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if resp, err := http.ReadResponse(br, nil); err == nil {
		// An answer (the body could not be read) is fine, as long as the
		// connection then closes.
		if resp.StatusCode < 400 {
			t.Fatalf("a trickled body was answered %d", resp.StatusCode)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		wantClosed(t, c, br, 10*time.Second)
	} else if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the request with a trickled body is still held after 10 s")
	}
}

// TestAPIUnauthorizedBodyNotRead: a request with a wrong token is answered
// 401 at once and the connection closed, without waiting for (or reading)
// the body it announced.
func TestAPIUnauthorizedBodyNotRead(t *testing.T) {
	e := startSingle(t, apiConfig(nil))
	c := rawConn(t, e)
	br := bufio.NewReader(c)
	io.WriteString(c, "POST /v1/deliver HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n"+
		"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
	resp := readResponse(t, c, br, 10*time.Second)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("status %d, want 401", resp.StatusCode)
	}
	wantClosed(t, c, br, 10*time.Second)
}

// TestAPIHeaderBound: headers of 8 KiB are served; 64 KiB get 431.
func TestAPIHeaderBound(t *testing.T) {
	e := startSingle(t, apiConfig(nil))
	for _, tc := range []struct {
		size int
		want int
	}{{8 << 10, http.StatusOK}, {64 << 10, http.StatusRequestHeaderFieldsTooLarge}} {
		c := rawConn(t, e)
		br := bufio.NewReader(c)
		io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: "+strings.Repeat("p", tc.size)+"\r\n\r\n")
		if resp := readResponse(t, c, br, 10*time.Second); resp.StatusCode != tc.want {
			t.Fatalf("%d bytes of headers: status %d, want %d", tc.size, resp.StatusCode, tc.want)
		}
	}
}

// TestAPIConnectionCap: with MaxConns 2 held by connections that
// presented a valid token, a third connection is not served while both
// are open (neither is closed for it), and is served once one of them
// closes.
func TestAPIConnectionCap(t *testing.T) {
	e := startSingle(t, apiConfig(func(c *router.APIConfig) { c.MaxConns = 2 }))
	held := []net.Conn{rawConn(t, e), rawConn(t, e)}
	for _, c := range held { // both are being served
		br := bufio.NewReader(c)
		io.WriteString(c, "GET /v1/events?wait=0 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+agentToken+"\r\n\r\n")
		if resp := readResponse(t, c, br, 10*time.Second); resp.StatusCode != http.StatusOK {
			t.Fatalf("events: %d", resp.StatusCode)
		}
	}
	third := rawConn(t, e)
	br := bufio.NewReader(third)
	io.WriteString(third, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	third.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := br.ReadByte(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a third connection was served past the cap of 2 (%v)", err)
	}
	held[0].Close()
	if resp := readResponse(t, third, br, 10*time.Second); resp.StatusCode != http.StatusOK {
		t.Fatalf("third connection after one closed: %d", resp.StatusCode)
	}
}

// TestAPIStrangersCannotHoldConnections: with the default 1,024
// connections, 1,023 held idle after one GET /healthz each (no token) do
// not keep the agent or cron out: an agent call and a deliver, each on a
// connection of its own kept open, are served while the 1,023 are held.
func TestAPIStrangersCannotHoldConnections(t *testing.T) {
	e := startSingle(t, apiConfig(nil))
	dev := device("strangers")
	phone := e.phone(t, dev)
	for range 1023 {
		c := rawConn(t, e)
		io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp := readResponse(t, c, bufio.NewReader(c), 10*time.Second); resp.StatusCode != http.StatusOK {
			t.Fatalf("healthz: %d", resp.StatusCode)
		}
	}
	post := func(path, token, body string) int {
		c := rawConn(t, e) // kept open: it holds its place in the limit
		io.WriteString(c, "POST "+path+" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+token+
			"\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
		return readResponse(t, c, bufio.NewReader(c), 10*time.Second).StatusCode
	}
	if code := post("/v1/sessions/"+protocol.Session(dev)+"/messages", agentToken, `{"id":"a-1","text":"from the agent"}`); code != http.StatusOK {
		t.Fatalf("the agent's call: %d", code)
	}
	if code := post("/v1/deliver", deliverToken, `{"id":"c-1","target":"`+dev+`","text":"from cron"}`); code != http.StatusOK {
		t.Fatalf("the cron call: %d", code)
	}
	for _, want := range []string{"from the agent", "from cron"} {
		if f := expect(t, phone, protocol.TypeMessage); f.Str("text") != want {
			t.Fatalf("the phone got %s, want %q", f, want)
		}
	}
}

// TestAPIAnonIdleTimeout: a keep-alive connection that never presented a
// valid token is closed after AnonIdleTimeout between requests; one that
// did stays open past it.
func TestAPIAnonIdleTimeout(t *testing.T) {
	const idle = 300 * time.Millisecond
	e := startSingle(t, apiConfig(func(c *router.APIConfig) { c.AnonIdleTimeout = idle }))
	anon, authed := rawConn(t, e), rawConn(t, e)
	anonR, authedR := bufio.NewReader(anon), bufio.NewReader(authed)
	io.WriteString(anon, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	readResponse(t, anon, anonR, 10*time.Second)
	io.WriteString(authed, "GET /v1/events?wait=0 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+agentToken+"\r\n\r\n")
	if resp := readResponse(t, authed, authedR, 10*time.Second); resp.StatusCode != http.StatusOK {
		t.Fatalf("events: %d", resp.StatusCode)
	}
	start := time.Now()
	wantClosed(t, anon, anonR, 10*time.Second)
	if took := time.Since(start); took < idle*8/10 {
		t.Fatalf("the anonymous connection closed after %v, before AnonIdleTimeout %v", took, idle)
	}
	authed.SetReadDeadline(time.Now().Add(3 * idle))
	if _, err := authedR.ReadByte(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the connection that presented a token was closed after %v (%v)", time.Since(start), err)
	}
}
