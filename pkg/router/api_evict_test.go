package router_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/router"
)

// request writes a GET of path (with token, unless empty) on c and
// returns the answer's status.
func request(t *testing.T, c net.Conn, br *bufio.Reader, path, token string) int {
	t.Helper()
	auth := ""
	if token != "" {
		auth = "Authorization: Bearer " + token + "\r\n"
	}
	io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n"+auth+"\r\n")
	return readResponse(t, c, br, 10*time.Second).StatusCode
}

// post writes a POST of body to path with token on c and returns the
// answer's status.
func post(t *testing.T, c net.Conn, br *bufio.Reader, path, token, body string) int {
	t.Helper()
	io.WriteString(c, "POST "+path+" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+token+
		"\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
	return readResponse(t, c, br, 10*time.Second).StatusCode
}

// limitConfig sets a limit of 4 connections and deadlines no step of a
// test reaches: only the limit closes connections.
func limitConfig(c *router.APIConfig) {
	c.MaxConns = 4
	c.FirstByteTimeout, c.HeaderTimeout, c.AnonIdleTimeout = time.Minute, time.Minute, time.Minute
}

// TestAPILimitEvictsTheOldestStranger: with MaxConns 4 held by an
// authenticated connection and three strangers (one silent, one in the
// middle of its headers, one idle after a request), exactly the limit is
// held; the 5th connection closes exactly one stranger, the oldest (the
// silent one), and the others are served. Two more connections push out
// the two strangers left, never the authenticated ones.
func TestAPILimitEvictsTheOldestStranger(t *testing.T) {
	e := startSingle(t, apiConfig(limitConfig))
	dev := device("limit")
	msg := func(id string) string { return `{"id":"` + id + `","text":"` + id + `"}` }
	path := "/v1/sessions/" + protocol.Session(dev) + "/messages"

	authed := rawConn(t, e)
	authedR := bufio.NewReader(authed)
	if code := request(t, authed, authedR, "/v1/events?wait=0", agentToken); code != http.StatusOK {
		t.Fatalf("events: %d", code)
	}
	silent := rawConn(t, e)
	half := rawConn(t, e)
	io.WriteString(half, "GET /healthz HTTP/1.1\r\nHost: x\r\n")
	idle := rawConn(t, e)
	idleR := bufio.NewReader(idle)
	// Answered: the router took idle, and silent and half before it (it
	// takes connections in the order they came). The limit is held.
	if code := request(t, idle, idleR, "/healthz", ""); code != http.StatusOK {
		t.Fatalf("healthz: %d", code)
	}

	fifth := rawConn(t, e)
	fifthR := bufio.NewReader(fifth)
	if code := post(t, fifth, fifthR, path, agentToken, msg("a-1")); code != http.StatusOK {
		t.Fatalf("the 5th connection's agent call: %d", code)
	}
	wantClosed(t, silent, bufio.NewReader(silent), 10*time.Second)
	halfR := bufio.NewReader(half)
	io.WriteString(half, "\r\n")
	if resp := readResponse(t, half, halfR, 10*time.Second); resp.StatusCode != http.StatusOK {
		t.Fatalf("the connection in the middle of its headers, finished: %d", resp.StatusCode)
	}
	if code := request(t, idle, idleR, "/healthz", ""); code != http.StatusOK {
		t.Fatalf("the idle connection's next request: %d", code)
	}
	if code := request(t, authed, authedR, "/v1/events?wait=0", agentToken); code != http.StatusOK {
		t.Fatalf("the authenticated connection's next request: %d", code)
	}

	// Open: authed and fifth (authenticated), half then idle (strangers,
	// idle in that order). Each new stranger pushes out the oldest one.
	for _, gone := range []struct {
		c  net.Conn
		br *bufio.Reader
	}{{half, halfR}, {idle, idleR}} {
		c := rawConn(t, e)
		if code := request(t, c, bufio.NewReader(c), "/healthz", ""); code != http.StatusOK {
			t.Fatalf("healthz: %d", code)
		}
		wantClosed(t, gone.c, gone.br, 10*time.Second)
	}
	if code := request(t, authed, authedR, "/v1/events?wait=0", agentToken); code != http.StatusOK {
		t.Fatalf("the first authenticated connection after the strangers came: %d", code)
	}
	if code := post(t, fifth, fifthR, path, agentToken, msg("a-2")); code != http.StatusOK {
		t.Fatalf("the second authenticated connection after the strangers came: %d", code)
	}
}

// TestAPILimitEvictsFromTheBusiestAddress: a flood from one address pushes
// out its own strangers before another address's, even an older one.
// With MaxConns 4: an authenticated connection, a silent stranger from
// 127.0.0.3, then two from 127.0.0.2; a new connection closes the older
// of 127.0.0.2's, and 127.0.0.3's is still served.
func TestAPILimitEvictsFromTheBusiestAddress(t *testing.T) {
	e := startSingle(t, apiConfig(limitConfig))
	dial := func(from string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		c, err := d.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
		if err != nil {
			t.Fatalf("dial from %s: %v", from, err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	authed := rawConn(t, e)
	if code := request(t, authed, bufio.NewReader(authed), "/v1/events?wait=0", agentToken); code != http.StatusOK {
		t.Fatalf("events: %d", code)
	}
	lone := dial("127.0.0.3")
	busy := dial("127.0.0.2")
	busy2 := dial("127.0.0.2")
	if code := request(t, busy2, bufio.NewReader(busy2), "/healthz", ""); code != http.StatusOK {
		t.Fatalf("healthz: %d", code)
	}
	fresh := rawConn(t, e)
	if code := request(t, fresh, bufio.NewReader(fresh), "/healthz", ""); code != http.StatusOK {
		t.Fatalf("the new connection: %d", code)
	}
	wantClosed(t, busy, bufio.NewReader(busy), 10*time.Second)
	if code := request(t, lone, bufio.NewReader(lone), "/healthz", ""); code != http.StatusOK {
		t.Fatalf("the stranger of the quiet address: %d", code)
	}
}

// TestAPIStrangerDeadlines: a new connection is closed FirstByteTimeout
// after it connected when it sends nothing, and HeaderTimeout after when
// it sends the start of its headers in time and no more; one that sends a
// whole request in time is answered. The deadlines are set short, in the
// defaults' ratio (2 s and 5 s).
func TestAPIStrangerDeadlines(t *testing.T) {
	const firstByte, header = 400 * time.Millisecond, time.Second
	e := startSingle(t, apiConfig(func(c *router.APIConfig) {
		c.FirstByteTimeout, c.HeaderTimeout = firstByte, header
	}))
	// closedAfter is how long after start the router closed c.
	closedAfter := func(c net.Conn, start time.Time) time.Duration {
		wantClosed(t, c, bufio.NewReader(c), testsvc.Slack(10*header))
		return time.Since(start)
	}

	start := time.Now()
	silent := rawConn(t, e)
	if took := closedAfter(silent, start); took < firstByte*8/10 || took >= header {
		t.Fatalf("a silent connection closed after %v; want FirstByteTimeout %v (before HeaderTimeout %v)", took, firstByte, header)
	}
	start = time.Now()
	started := rawConn(t, e)
	io.WriteString(started, "GET /healthz HTTP/1.1\r\n")
	if took := closedAfter(started, start); took < header*8/10 {
		t.Fatalf("a connection whose headers began in time closed after %v; want HeaderTimeout %v", took, header)
	}
	whole := rawConn(t, e)
	if code := request(t, whole, bufio.NewReader(whole), "/healthz", ""); code != http.StatusOK {
		t.Fatalf("healthz: %d", code)
	}
}
