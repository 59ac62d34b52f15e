//go:build unix

package cluster

import (
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/fakellm"
	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// journalLease is the routers' journal lease (router.Config.JournalLease's
// default): how long the events of a dead router wait for another one.
const journalLease = 15 * time.Second

// TestRouterKilledMidCall: two routers run AGENT=openai against a fake
// upstream. First, a phone's texts, spread by the queue group over both
// routers, are answered one at a time and in order. Then the upstream
// stalls on one text on purpose; the phone sends two more, which the
// routers acknowledge; the router in the stalled call dies by SIGKILL. The
// other router takes the device's journal over once the lease expires and
// answers all three, in order: no acknowledged event is lost.
func TestRouterKilledMidCall(t *testing.T) {
	t.Parallel()
	c := newCluster(t, options{})
	c.router.Stop(t.Logf) // the demo router leaves; two openai routers take its place

	var srv *fakellm.Server
	var stalledOnce atomic.Bool
	stalled := make(chan string, 1) // the Authorization of the router whose call hangs
	srv = fakellm.New(t, func(w http.ResponseWriter, r *http.Request, n int) {
		req := srv.Requests()[n]
		text := req.Text(len(req.Body.Messages) - 1)
		if strings.HasPrefix(text, "stall") && stalledOnce.CompareAndSwap(false, true) {
			stalled <- req.Auth
			<-r.Context().Done() // until the router is gone
			return
		}
		fakellm.Stream(w, r, 0, "echo: ", text)
	})
	routers := make(map[string]*testsvc.Proc)
	for _, name := range []string{"r1", "r2"} {
		p, _ := testsvc.StartProc(t, "router-"+name, bins.router, nil, append(c.routerEnv(),
			"AGENT=openai", "OPENAI_BASE_URL="+srv.URL+"/v1", "OPENAI_MODEL=test-model", "OPENAI_API_KEY=key-"+name,
		), logMsg("router listening"))
		routers["Bearer key-"+name] = p
	}

	dev := newDevice("tel-rf")
	conn := c.connect(t, "A", dev)
	c.waitReachable(t, dev)

	// Ordering over both routers.
	var want []string
	for i := range 10 {
		id := "n-" + string(rune('0'+i))
		want = append(want, "echo: "+id)
		if err := conn.Text(id, id); err != nil {
			t.Fatal(err)
		}
	}
	got := finals(t, conn, 30*time.Second, want[len(want)-1], acked(t, conn))
	if !slices.Equal(got, want) {
		t.Fatalf("answers in the order %q, want %q", got, want)
	}

	// A router dies mid-call with acknowledged events behind the call.
	if err := conn.Text("stall-1", "stall-1"); err != nil {
		t.Fatal(err)
	}
	var auth string
	select {
	case auth = <-stalled:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream got no request for stall-1 within 10 s")
	}
	for _, id := range []string{"after-1", "after-2"} {
		if err := conn.Text(id, id); err != nil {
			t.Fatal(err)
		}
	}
	early := acked(t, conn)
	victim := routers[auth]
	if victim == nil {
		t.Fatalf("the stalled request came with %q, from no router of the test", auth)
	}
	victim.Kill(t)
	killed := time.Now()

	want = []string{"echo: stall-1", "echo: after-1", "echo: after-2"}
	got = finals(t, conn, journalLease+15*time.Second, want[len(want)-1], early)
	if !slices.Equal(got, want) {
		t.Fatalf("after the kill: answers %q, want %q", got, want)
	}
	if took := time.Since(killed); took > journalLease+10*time.Second {
		t.Fatalf("answered %v after the kill, want within the lease (%v) and a margin", took, journalLease)
	}
	var stalls []string
	for _, r := range srv.Requests() {
		if r.Text(len(r.Body.Messages)-1) == "stall-1" {
			stalls = append(stalls, r.Auth)
		}
	}
	if len(stalls) != 2 || stalls[1] == auth {
		t.Fatalf("stall-1 was asked by %q, want the killed router then the other one", stalls)
	}
}

// acked waits until the edge handled every frame sent before (the routers
// acknowledged the texts), fails the test on an error among them, and
// returns the final texts that came meanwhile.
func acked(t *testing.T, conn *client.Conn) []string {
	t.Helper()
	fs := pingBarrier(t, conn)
	if errs := errorsIn(fs); len(errs) > 0 {
		t.Fatalf("texts refused: %v", errs)
	}
	var out []string
	for _, f := range fs {
		if f.T() == protocol.TypeMessage && f.Bool("final") {
			out = append(out, f.Str("text"))
		}
	}
	return out
}

// finals reads the phone's frames until an agent message ends with the text
// last, within d, and returns the complete texts of the final messages in
// the order they were finished, after those in out.
func finals(t *testing.T, conn *client.Conn, d time.Duration, last string, out []string) []string {
	t.Helper()
	if slices.Contains(out, last) {
		return out
	}
	ctx := within(t, d)
	for {
		f, err := conn.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for %q: %v; final texts so far: %q", last, err, out)
		}
		if ci := f.Close(); ci != nil {
			t.Fatalf("waiting for %q: the server closed the connection (%s)", last, ci)
		}
		if e := client.AsServerError(f); e != nil {
			t.Fatalf("waiting for %q: error %v", last, e)
		}
		if f.T() == protocol.TypeMessage && f.Bool("final") {
			out = append(out, f.Str("text"))
			if f.Str("text") == last {
				return out
			}
		}
	}
}
