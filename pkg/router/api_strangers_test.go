package router_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// flood holds n connections to an API that never finish a request: two of
// three send nothing, the third stops in the middle of its headers. Each
// is opened again as soon as the router closes it, until the test ends.
type flood struct {
	started atomic.Int64 // connections that have dialed once
	closed  atomic.Int64 // closed by the router
}

func startFlood(t *testing.T, e *env, n int) *flood {
	t.Helper()
	f := &flood{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	var d net.Dialer
	addr := strings.TrimPrefix(e.url, "http://")
	for i := range n {
		wg.Go(func() {
			first := true
			for ctx.Err() == nil {
				c, err := d.DialContext(ctx, "tcp", addr)
				if err != nil {
					continue
				}
				if i%3 == 2 {
					io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n")
				}
				if first {
					f.started.Add(1)
					first = false
				}
				stop := context.AfterFunc(ctx, func() { c.Close() })
				if _, err := c.Read(make([]byte, 1)); err != nil && ctx.Err() == nil {
					f.closed.Add(1)
				}
				stop()
				c.Close()
			}
		})
	}
	testsvc.WaitFor(t, 30*time.Second, "the strangers to connect", func() bool { return f.started.Load() == int64(n) })
	return f
}

// freshCall makes one request on a new connection, as an agent or cron
// arriving during a flood does, and reports its status (0: no answer
// within limit) and how long the answer took.
func freshCall(e *env, method, path, token, body string, limit time.Duration) (int, time.Duration) {
	start := time.Now()
	d := net.Dialer{Timeout: limit}
	c, err := d.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		return 0, time.Since(start)
	}
	defer c.Close()
	c.SetDeadline(start.Add(limit))
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		method, path, token, len(body), body)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, time.Since(start)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, time.Since(start)
}

// TestAPIStrangersCannotLockTheAPI is the review's attack on the default
// limit of 1,024 connections: 1,100 connections that never finish a
// request (two thirds send no byte, a third stop in their headers), each
// opened again as soon as the router closes it. Four agent calls and a
// deliver, each on a new connection, are all answered, each within 1.5 s:
// less than FirstByteTimeout (2 s), so it is the eviction of strangers
// that lets them in, not the deadlines. Before, strangers that had not
// sent a whole request were never closed for a new connection: 0 of 5
// calls were answered within 1.5 s, the first after 10.2 s, when the
// header timeout (then 10 s) closed strangers (the review: 0 of 4, the
// slowest after 9.97 s).
func TestAPIStrangersCannotLockTheAPI(t *testing.T) {
	const strangers = 1100
	const limit = 1500 * time.Millisecond
	e := startSingle(t, apiConfig(nil))
	dev := device("flooded")
	phone := e.phone(t, dev)
	f := startFlood(t, e, strangers)

	type call struct{ path, token, body string }
	var calls []call
	for i := range 4 {
		calls = append(calls, call{"/v1/sessions/" + protocol.Session(dev) + "/messages", agentToken, fmt.Sprintf(`{"id":"a-%d","text":"agent %d"}`, i, i)})
	}
	calls = append(calls, call{"/v1/deliver", deliverToken, `{"id":"c-1","target":"` + dev + `","text":"cron"}`})
	answered, slowest := 0, time.Duration(0)
	for _, c := range calls {
		status, took := freshCall(e, "POST", c.path, c.token, c.body, limit)
		if status == http.StatusOK {
			answered++
		} else {
			t.Errorf("POST %s: status %d after %v", c.path, status, took)
		}
		slowest = max(slowest, took)
	}
	t.Logf("%d strangers' connections (%d closed by the router so far): %d of %d fresh calls answered, the slowest after %v",
		strangers, f.closed.Load(), answered, len(calls), slowest)
	if answered != len(calls) {
		t.Fatalf("%d of %d fresh calls answered within %v", answered, len(calls), limit)
	}
	for _, want := range []string{"agent 0", "agent 1", "agent 2", "agent 3", "cron"} {
		if f := expect(t, phone, protocol.TypeMessage); f.Str("text") != want {
			t.Fatalf("the phone got %s, want %q", f, want)
		}
	}
}
