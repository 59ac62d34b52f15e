//go:build unix

package fault

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
)

// world is one run's gateway: a Redis and a NATS of its own, three edges
// and two routers, all processes. Edges come back on a new port after a
// kill; Redis and NATS on the same one.
type world struct {
	t   *testing.T
	dir string    // Redis's AOF and every process's log
	log io.Writer // the processes' output

	redisBin, natsBin   string
	redisPort, natsPort int
	token, deliverToken string
	redis, nats         *proc
	mu                  sync.Mutex
	edges, routers      []*node
	stopping            bool
}

// node is an edge or a router. While it is down or stopped, phones and
// cron do not pick it (as a load balancer's health check would not).
type node struct {
	name  string
	p     *proc
	url   string // ws://…/ws for an edge, http://… for a router
	state string // "up", "stopped", "down"
}

func findBinary(name string, paths ...string) string {
	for _, p := range paths {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// newWorld starts everything and returns once it all listens. It is all
// stopped when the test ends.
func newWorld(t *testing.T, dir string, log io.Writer) *world {
	w := &world{
		t: t, dir: dir, log: log,
		redisBin:     findBinary("redis-server", "/usr/bin/redis-server", "/usr/local/bin/redis-server"),
		natsBin:      findBinary("nats-server", "/usr/sbin/nats-server", "/usr/local/bin/nats-server", "/usr/bin/nats-server"),
		token:        "app-" + randomHex(12),
		deliverToken: "cron-" + randomHex(12),
	}
	if w.redisBin == "" || w.natsBin == "" {
		msg := "the fault test needs redis-server and nats-server (apt-get install redis-server nats-server)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Cleanup(w.stopAll)
	var err error
	if w.redisPort, err = testsvc.FreePort(); err != nil {
		t.Fatal(err)
	}
	if w.natsPort, err = testsvc.FreePort(); err != nil {
		t.Fatal(err)
	}
	if err := w.startRedis(); err != nil {
		t.Fatal(err)
	}
	if err := w.startNATS(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		n := &node{name: fmt.Sprintf("edge-%d", i+1)}
		if err := w.startEdge(n); err != nil {
			t.Fatal(err)
		}
		w.edges = append(w.edges, n)
	}
	for i := range 2 {
		n := &node{name: fmt.Sprintf("router-%d", i+1)}
		if err := w.startRouter(n); err != nil {
			t.Fatal(err)
		}
		w.routers = append(w.routers, n)
	}
	return w
}

func (w *world) redisURL() string { return fmt.Sprintf("redis://127.0.0.1:%d", w.redisPort) }
func (w *world) natsURL() string  { return fmt.Sprintf("nats://127.0.0.1:%d", w.natsPort) }

// startRedis starts Redis on its port with its AOF in dir, fsync always: a
// restart after SIGKILL has every write it acknowledged.
func (w *world) startRedis() error {
	var err error
	for range 50 { // the port may linger for a moment after a kill
		w.redis, _, err = launch("redis", w.redisBin, []string{
			"--port", strconv.Itoa(w.redisPort), "--bind", "127.0.0.1", "--save", "",
			"--appendonly", "yes", "--appendfsync", "always", "--dir", w.dir,
		}, nil, w.log, func(line string) (string, bool) {
			return "", strings.Contains(line, "Ready to accept connections")
		})
		if err == nil {
			return nil
		}
		if w.redis != nil {
			w.redis.stop()
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

func (w *world) startNATS() error {
	var err error
	for range 50 {
		w.nats, _, err = launch("nats", w.natsBin, []string{"-a", "127.0.0.1", "-p", strconv.Itoa(w.natsPort)},
			nil, w.log, func(line string) (string, bool) {
				return "", strings.Contains(line, "Server is ready")
			})
		if err == nil {
			return nil
		}
		if w.nats != nil {
			w.nats.stop()
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

func (w *world) common() []string {
	return []string{
		"NATS_URL=" + w.natsURL(),
		"REDIS_URL=" + w.redisURL(),
		"REDIS_PREFIX=hermes-fault:",
		"MOBILE_DELIVER_TOKENS=" + w.deliverToken,
		"MOBILE_LOG_LEVEL=info",
		"MOBILE_ADMIN_LISTEN=127.0.0.1:0",
	}
}

// startEdge starts n as an edge on a new port.
func (w *world) startEdge(n *node) error {
	p, url, err := launch(n.name, bins.edge, nil, append(w.common(),
		"MOBILE_LISTEN=127.0.0.1:0",
		"MOBILE_TOKEN="+w.token,
		"MOBILE_ROUTER=off",
	), w.log, logMsg("gateway listening"))
	if err != nil {
		if p != nil {
			p.stop()
		}
		return err
	}
	w.mu.Lock()
	n.p, n.url, n.state = p, url, "up"
	w.mu.Unlock()
	return nil
}

// startRouter starts n as a router with the demo agent on a new port.
func (w *world) startRouter(n *node) error {
	p, url, err := launch(n.name, bins.router, nil, append(w.common(),
		"MOBILE_ROUTER_LISTEN=127.0.0.1:0",
		"MOBILE_AGENT_TOKENS=agent-"+randomHex(8),
		"AGENT=demo",
	), w.log, logMsg("router listening"))
	if err != nil {
		if p != nil {
			p.stop()
		}
		return err
	}
	w.mu.Lock()
	n.p, n.url, n.state = p, strings.TrimSuffix(url, "/"), "up"
	w.mu.Unlock()
	return nil
}

// pick returns the URL of a random node of ns that is up ("" when none is).
func (w *world) pick(ns []*node, rng *mrand.Rand) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var up []string
	for _, n := range ns {
		if n.state == "up" {
			up = append(up, n.url)
		}
	}
	if len(up) == 0 {
		return ""
	}
	return up[rng.IntN(len(up))]
}

func (w *world) edgeURL(rng *mrand.Rand) string   { return w.pick(w.edges, rng) }
func (w *world) routerURL(rng *mrand.Rand) string { return w.pick(w.routers, rng) }

func (w *world) setState(n *node, s string) {
	w.mu.Lock()
	n.state = s
	w.mu.Unlock()
}

func (w *world) stopAll() {
	w.mu.Lock()
	w.stopping = true
	ns := append(append([]*node(nil), w.edges...), w.routers...)
	w.mu.Unlock()
	for _, n := range ns {
		if n.p != nil {
			n.p.stop()
		}
	}
	if w.nats != nil {
		w.nats.stop()
	}
	if w.redis != nil {
		w.redis.stop()
	}
}

// ---- faults ----

// fault is one fault of a run: what, to which node, when (from the start
// of the fault phase) and for how long (the pause, or the time down before
// the restart).
type fault struct {
	kind   string // kill-edge, stop-edge, kill-router, kill-redis, kill-nats
	target int    // index of the edge or router
	at     time.Duration
	hold   time.Duration
}

func (f fault) String() string {
	s := f.kind
	if f.kind == "kill-edge" || f.kind == "stop-edge" {
		s += fmt.Sprintf(" edge-%d", f.target+1)
	}
	if f.kind == "kill-router" {
		s += fmt.Sprintf(" router-%d", f.target+1)
	}
	return fmt.Sprintf("%s at %v for %v", s, f.at.Round(100*time.Millisecond), f.hold.Round(100*time.Millisecond))
}

var faultKinds = []string{"stop-edge", "kill-edge", "kill-router", "kill-redis", "kill-nats"}

// plan draws n faults spread over d: every kind once (SIGSTOP first) while
// n allows, the rest at random; in random order, one at a time. A pause
// lasts longer than patience, the phones' limit for a silent socket.
func plan(rng *mrand.Rand, n int, d, patience time.Duration) []fault {
	var kinds []string
	for i := range n {
		if i < len(faultKinds) {
			kinds = append(kinds, faultKinds[i])
		} else {
			kinds = append(kinds, faultKinds[rng.IntN(len(faultKinds))])
		}
	}
	rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	slot := d / time.Duration(max(n, 1))
	var out []fault
	for i, k := range kinds {
		// Each in its own slot, after a third of it: the first finds the
		// phones connected and talking.
		f := fault{kind: k, at: time.Duration(i)*slot + slot/3 + time.Duration(rng.Int64N(int64(slot/3)+1))}
		switch k {
		case "stop-edge":
			f.target = rng.IntN(3)
			f.hold = patience + time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))
		case "kill-edge":
			f.target = rng.IntN(3)
			f.hold = 500*time.Millisecond + time.Duration(rng.Int64N(int64(2*time.Second)))
		case "kill-router":
			f.target = rng.IntN(2)
			f.hold = 500*time.Millisecond + time.Duration(rng.Int64N(int64(time.Second)))
		default:
			f.hold = 500*time.Millisecond + time.Duration(rng.Int64N(int64(time.Second)))
		}
		if limit := slot / 3; f.hold > limit && k != "stop-edge" {
			f.hold = limit
		}
		out = append(out, f)
	}
	return out
}

// inject does f and undoes it after f.hold: SIGCONT, or a restart.
func (w *world) inject(f fault) error {
	switch f.kind {
	case "stop-edge", "kill-edge":
		n := w.edges[f.target]
		w.setState(n, "stopped")
		if f.kind == "stop-edge" {
			if err := n.p.signal(syscall.SIGSTOP); err != nil {
				return err
			}
			time.Sleep(f.hold) // the fault itself: a pause of this length
			w.setState(n, "up")
			return n.p.signal(syscall.SIGCONT)
		}
		if err := n.p.kill(); err != nil {
			return err
		}
		time.Sleep(f.hold)
		return w.startEdge(n)
	case "kill-router":
		n := w.routers[f.target]
		w.setState(n, "down")
		if err := n.p.kill(); err != nil {
			return err
		}
		time.Sleep(f.hold)
		return w.startRouter(n)
	case "kill-redis":
		if err := w.redis.kill(); err != nil {
			return err
		}
		time.Sleep(f.hold)
		return w.startRedis()
	case "kill-nats":
		if err := w.nats.kill(); err != nil {
			return err
		}
		time.Sleep(f.hold)
		return w.startNATS()
	}
	return fmt.Errorf("unknown fault %q", f.kind)
}

// ---- helpers ----

// logMsg matches a JSON log line whose msg is want and returns its url.
func logMsg(want string) func(string) (string, bool) {
	return func(line string) (string, bool) {
		var rec struct {
			Msg string `json:"msg"`
			URL string `json:"url"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil || rec.Msg != want {
			return "", false
		}
		return rec.URL, true
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
