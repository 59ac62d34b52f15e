//go:build unix

package fault

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/tenant"
)

// The backends a run's gateway stands on.
const (
	// single: one Redis (AOF, fsync always) and one NATS server.
	single = "single"
	// cluster: a Redis Cluster of 3 masters and 3 replicas and a 3-node
	// NATS cluster, each edge and router on its own NATS server.
	cluster = "cluster"
)

// world is one run's gateway: a Redis and a NATS of its own (one server
// each, or a Redis Cluster and a NATS cluster), three edges and two
// routers, all processes. Edges come back on a new port after a kill;
// Redis and NATS servers on the same one.
type world struct {
	t       *testing.T
	backend string    // single or cluster
	dir     string    // Redis's AOF and every process's log
	log     io.Writer // the processes' output

	token, deliverToken string
	// owners are the tenants file's owners, none without one (the legacy
	// owner's phones and cron only).
	owners      []owner
	redis, nats *testsvc.Server       // single
	rc          *testsvc.RedisCluster // cluster
	nc          *testsvc.NATSCluster  // cluster
	// rdb reads the store as the gateway writes it: which devices ack
	// (acks:{D}) and which have an outbox (outbox:{D}).
	rdb            redis.UniversalClient
	mu             sync.Mutex
	edges, routers []*node
	stopping       bool

	// The silent-network faults: the phones they may pick, the blackholes
	// they made, and how many went through (ready passed, then silence).
	phones []*phone
	holes  []*blackhole
	silent int
}

// node is an edge or a router. While it is down or stopped, phones and
// cron do not pick it (as a load balancer's health check would not).
type node struct {
	name  string
	bus   int // which server of a NATS cluster it uses
	p     *testsvc.Proc
	url   string // ws://…/ws for an edge, http://… for a router
	state string // "up", "stopped", "down"
}

// owner is an owner of the run's tenants file: its phones connect with its
// app key, its cron with its deliver key.
type owner struct{ id, app, deliver string }

// flooder is the owner whose deliver key floods made-up sleeping devices
// (floodDevices of them, a text of floodBytes a delivery, under the
// 12,000 characters a text may hold) beside its phones and
// cron, as fast as the routers take them: its outbox fills past its
// quota, floodQuotaMiB (outbox_mib), while the other owner's (and the
// legacy owner's) queued deliveries must all arrive.
const (
	flooder       = "ann"
	floodDevices  = 16
	floodBytes    = 11_000
	floodQuotaMiB = 1
)

// newWorld starts everything and returns once it all listens. It is all
// stopped when the test ends. With owners, the edges and routers read a
// tenants file of two owners, ann and bob, beside the legacy tokens.
func newWorld(t *testing.T, backend, dir string, log io.Writer, owners bool) *world {
	w := &world{
		t: t, backend: backend, dir: dir, log: log,
		token:        "app-" + testsvc.RandomHex(12),
		deliverToken: "cron-" + testsvc.RandomHex(12),
	}
	if owners {
		var file strings.Builder
		file.WriteString("tenants:\n")
		for _, id := range []string{flooder, "bob"} {
			app, cron := testsvc.RandomHex(12), testsvc.RandomHex(12)
			fmt.Fprintf(&file, "  - id: %s\n    keys:\n      - {id: app, kind: app, secret: %q}\n      - {id: cron, kind: deliver, secret: %q}\n", id, app, cron)
			if id == flooder {
				fmt.Fprintf(&file, "    quota: {outbox_mib: %d}\n", floodQuotaMiB)
			}
			w.owners = append(w.owners, owner{id: id, app: tenant.Credential(id, "app", app), deliver: tenant.Credential(id, "cron", cron)})
		}
		if err := os.WriteFile(filepath.Join(dir, "tenants.yaml"), []byte(file.String()), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if backend == cluster {
		w.rc = testsvc.StartRedisCluster(t, 3, 1)
		w.nc = testsvc.StartNATSCluster(t, 3)
		w.rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: w.rc.Addrs})
	}
	t.Cleanup(w.stopAll)
	if backend == single {
		// Redis with its AOF in dir, fsync always: a restart after SIGKILL
		// has every write it acknowledged.
		var err error
		w.redis, err = testsvc.NewRedis(dir, "--appendonly", "yes", "--appendfsync", "always")
		if err == nil {
			w.nats, err = testsvc.NewNATS(filepath.Join(dir, "nats"))
		}
		if err != nil {
			msg := "the fault test needs redis-server and nats-server (apt-get install redis-server nats-server): " + err.Error()
			if os.Getenv("CI") == "" && strings.Contains(err.Error(), "PATH") {
				t.Skip(msg)
			}
			t.Fatal(msg)
		}
		w.rdb = redis.NewClient(&redis.Options{Addr: w.redis.Addr()})
	}
	for i := range 3 {
		n := &node{name: fmt.Sprintf("edge-%d", i+1), bus: i}
		if err := w.startEdge(n); err != nil {
			t.Fatal(err)
		}
		w.edges = append(w.edges, n)
	}
	for i := range 2 {
		n := &node{name: fmt.Sprintf("router-%d", i+1), bus: i + 1}
		if err := w.startRouter(n); err != nil {
			t.Fatal(err)
		}
		w.routers = append(w.routers, n)
	}
	return w
}

// restart starts a killed Redis or NATS again on its port, trying again
// while the port lingers after the kill.
func restart(s *testsvc.Server) error {
	var err error
	if testsvc.Eventually(10*time.Second, func() bool { err = s.Start(); return err == nil }) {
		return nil
	}
	return err
}

// keyPrefix is REDIS_PREFIX of every process.
const keyPrefix = "hermes-fault:"

// common is the environment of every edge and router; n's NATS server, in
// a NATS cluster, is n.bus's (it learns the others from it).
func (w *world) common(n *node) []string {
	redisMode, natsURL, redisURL := "single", "", ""
	if w.backend == single {
		redisURL, natsURL = w.redis.URL(), w.nats.URL()
	}
	if w.backend == cluster {
		redisMode, redisURL, natsURL = "cluster", w.rc.URL(), w.nc.URLs[n.bus%len(w.nc.URLs)]
	}
	env := []string{
		"NATS_URL=" + natsURL,
		"REDIS_MODE=" + redisMode,
		"REDIS_URL=" + redisURL,
		"REDIS_PREFIX=" + keyPrefix,
		"MOBILE_DELIVER_TOKENS=" + w.deliverToken,
		"MOBILE_LOG_LEVEL=info",
		"MOBILE_ADMIN_LISTEN=127.0.0.1:0",
	}
	if w.owners != nil {
		env = append(env, "MOBILE_TENANTS_FILE="+filepath.Join(w.dir, "tenants.yaml"))
	}
	return env
}

// startEdge starts n as an edge on a new port.
func (w *world) startEdge(n *node) error {
	p, url, err := testsvc.Launch(n.name, bins.edge, nil, append(w.common(n),
		"MOBILE_LISTEN=127.0.0.1:0",
		"MOBILE_TOKEN="+w.token,
		"MOBILE_ROUTER=off",
	), w.logLine, logMsg("gateway listening"))
	if err != nil {
		if p != nil {
			p.Stop(nil)
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
	p, url, err := testsvc.Launch(n.name, bins.router, nil, append(w.common(n),
		"MOBILE_ROUTER_LISTEN=127.0.0.1:0",
		"MOBILE_AGENT_TOKENS=agent-"+testsvc.RandomHex(8),
		"AGENT=demo",
	), w.logLine, logMsg("router listening"))
	if err != nil {
		if p != nil {
			p.Stop(nil)
		}
		return err
	}
	w.mu.Lock()
	n.p, n.url, n.state = p, strings.TrimSuffix(url, "/"), "up"
	w.mu.Unlock()
	return nil
}

// pick returns the URL of a random node of ns that is up, other than
// avoid ("" when none is).
func (w *world) pick(ns []*node, rng *mrand.Rand, avoid string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var up []string
	for _, n := range ns {
		if n.state == "up" && n.url != avoid {
			up = append(up, n.url)
		}
	}
	if len(up) == 0 {
		return ""
	}
	return up[rng.IntN(len(up))]
}

func (w *world) edgeURL(rng *mrand.Rand) string   { return w.pick(w.edges, rng, "") }
func (w *world) routerURL(rng *mrand.Rand) string { return w.pick(w.routers, rng, "") }

// edgeURLExcept is edgeURL, but never avoid.
func (w *world) edgeURLExcept(rng *mrand.Rand, avoid string) string {
	return w.pick(w.edges, rng, avoid)
}

func (w *world) setState(n *node, s string) {
	w.mu.Lock()
	n.state = s
	w.mu.Unlock()
}

// logLine writes a line of a process's output ("name: line") to the run's
// log file with the time: a long run's processes write far too much for
// t.Log, and the file is kept when the run fails.
func (w *world) logLine(line string) {
	fmt.Fprintf(w.log, "%s %s\n", time.Now().UTC().Format("15:04:05.000"), line)
}

func (w *world) stopAll() {
	w.mu.Lock()
	w.stopping = true
	ns := append(append([]*node(nil), w.edges...), w.routers...)
	w.mu.Unlock()
	for _, n := range ns {
		if n.p != nil {
			n.p.Stop(w.t.Logf)
		}
	}
	if w.nats != nil {
		w.nats.Kill()
	}
	if w.redis != nil {
		w.redis.Kill()
	}
	if w.rdb != nil {
		w.rdb.Close()
	}
}

// ---- faults ----

// fault is one fault of a run: what, to which node, when (from the start
// of the fault phase) and for how long (the pause, or the time down before
// the restart).
type fault struct {
	kind   string // one of faultKinds
	target int    // index of the edge, router, Redis master or NATS server; for silent, of the phone to try first
	at     time.Duration
	hold   time.Duration
}

func (f fault) String() string {
	s := f.kind
	switch f.kind {
	case "kill-edge", "stop-edge":
		s += fmt.Sprintf(" edge-%d", f.target+1)
	case "kill-router":
		s += fmt.Sprintf(" router-%d", f.target+1)
	case "kill-redis-master":
		s += fmt.Sprintf(" master-%d", f.target+1)
	case "kill-nats-server":
		s += fmt.Sprintf(" nats-%d", f.target)
	case "silent":
		return fmt.Sprintf("%s at %v", s, f.at.Round(100*time.Millisecond))
	}
	return fmt.Sprintf("%s at %v for %v", s, f.at.Round(100*time.Millisecond), f.hold.Round(100*time.Millisecond))
}

// faultKinds are the faults of each backend, SIGSTOP first.
var faultKinds = map[string][]string{
	single:  {"stop-edge", "kill-edge", "kill-router", "kill-redis", "kill-nats", "silent"},
	cluster: {"stop-edge", "kill-edge", "kill-router", "kill-redis-master", "kill-nats-server", "silent"},
}

// plan draws n faults of kinds spread over d: every kind once while n
// allows, the rest at random; in random order, one at a time. A pause
// lasts longer than patience, the phones' limit for a silent socket.
func plan(rng *mrand.Rand, kinds []string, n int, d, patience time.Duration) []fault {
	var drawn []string
	for i := range n {
		if i < len(kinds) {
			drawn = append(drawn, kinds[i])
		} else {
			drawn = append(drawn, kinds[rng.IntN(len(kinds))])
		}
	}
	rng.Shuffle(len(drawn), func(i, j int) { drawn[i], drawn[j] = drawn[j], drawn[i] })
	slot := d / time.Duration(max(n, 1))
	var out []fault
	for i, k := range drawn {
		// Each in its own slot, after a third of it: the first finds the
		// phones connected and talking.
		f := fault{kind: k, at: time.Duration(i)*slot + slot/3 + time.Duration(rng.Int64N(int64(slot/3)+1))}
		switch k {
		case "stop-edge":
			f.target = rng.IntN(3)
			f.hold = patience + time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))
		case "kill-edge", "kill-redis-master", "kill-nats-server":
			f.target = rng.IntN(3)
			f.hold = 500*time.Millisecond + time.Duration(rng.Int64N(int64(2*time.Second)))
		case "kill-router":
			f.target = rng.IntN(2)
			f.hold = 500*time.Millisecond + time.Duration(rng.Int64N(int64(time.Second)))
		case "silent":
			f.target = rng.IntN(1 << 30)
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
			n.p.Freeze(w.t)
			time.Sleep(f.hold) // the fault itself: a pause of this length
			w.setState(n, "up")
			n.p.Thaw(w.t)
			return nil
		}
		n.p.Kill(w.t)
		time.Sleep(f.hold) // the fault itself: down this long
		return w.startEdge(n)
	case "kill-router":
		n := w.routers[f.target]
		w.setState(n, "down")
		n.p.Kill(w.t)
		time.Sleep(f.hold) // the fault itself: down this long
		return w.startRouter(n)
	case "kill-redis":
		w.redis.Kill()
		time.Sleep(f.hold) // the fault itself: down this long
		return restart(w.redis)
	case "kill-nats":
		w.nats.Kill()
		time.Sleep(f.hold) // the fault itself: down this long
		return restart(w.nats)
	case "kill-redis-master":
		return w.killRedisMaster(f)
	case "kill-nats-server":
		if err := w.nc.Kill(f.target); err != nil {
			return err
		}
		time.Sleep(f.hold) // the fault itself: down this long
		return w.nc.Restart(f.target, 30*time.Second)
	case "silent":
		return w.silence(f)
	}
	return fmt.Errorf("unknown fault %q", f.kind)
}

// killRedisMaster SIGKILLs a master of the Redis Cluster, waits until its
// replica serves its slots, and, f.hold later, starts it again: it rejoins
// as the replica of the node that took its slots.
func (w *world) killRedisMaster(f fault) error {
	masters, err := w.rc.Masters()
	if err != nil {
		return err
	}
	if len(masters) == 0 {
		return fmt.Errorf("no Redis master serves slots")
	}
	victim := masters[f.target%len(masters)]
	w.t.Logf("killing Redis master %s", victim)
	if err := w.rc.Kill(victim); err != nil {
		return err
	}
	start := time.Now()
	if err := w.rc.WaitFailedOver(victim, 30*time.Second); err != nil {
		return err
	}
	w.t.Logf("Redis master %s failed over in %v", victim, time.Since(start).Round(100*time.Millisecond))
	time.Sleep(f.hold) // the fault itself: down this long after the failover
	return w.rc.Restart(victim, 60*time.Second)
}

// silence makes the silent-network fault: a phone that acked before (the
// store has acks:{D} for it, so the gateway promises it delivery only once
// acked) sends a few texts and leaves, so that their answers wait in its
// outbox; connects to an edge through a blackhole that lets ready through
// and nothing after, while the edge flushes the outbox; gives that socket
// up without a word and connects to another edge. It returns once the
// phone is ready there.
func (w *world) silence(f fault) error {
	if len(w.phones) == 0 {
		return nil
	}
	for k := range len(w.phones) {
		ph := w.phones[(f.target+k)%len(w.phones)]
		// FAULT_SILENT_ANY=1 takes a phone that acked by its own count,
		// not the store's: to run the fault against binaries from before
		// the store recorded which devices ack (FAULT_BINARIES).
		if !w.acked(ph.key) && (os.Getenv("FAULT_SILENT_ANY") != "1" || !ph.acked.Load()) {
			continue
		}
		o := &silentOrder{done: make(chan silentResult, 1)}
		select {
		case ph.silentReq <- o:
		default:
			continue // it has one already
		}
		select {
		case r := <-o.done:
			w.t.Logf("silent %s: %s", ph.dev, r.what)
			if r.hole != nil {
				w.holes = append(w.holes, r.hole)
			}
			if r.ok {
				w.silent++
			}
		case <-time.After(60 * time.Second):
			return fmt.Errorf("silent %s: the phone did not come back on another edge within 60 s", ph.dev)
		}
		return nil
	}
	w.t.Logf("silent: no phone has acked yet")
	return nil
}

// acked reports whether the store records that dev (a device key) acks.
func (w *world) acked(dev string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	n, err := w.rdb.Exists(ctx, keyPrefix+"acks:{"+dev+"}").Result()
	return err == nil && n == 1
}

// hasOutbox reports whether dev's (a device key's) outbox holds anything.
func (w *world) hasOutbox(dev string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	n, err := w.rdb.Exists(ctx, keyPrefix+"outbox:{"+dev+"}").Result()
	return err == nil && n == 1
}

// outboxLen is the number of items dev's (a device key's) outbox holds.
func (w *world) outboxLen(dev string) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return w.rdb.LLen(ctx, keyPrefix+"outbox:{"+dev+"}").Val()
}

// unread closes the blackholes and counts the messages the edges wrote
// into them that no phone read.
func (w *world) unread() int {
	n := 0
	for _, h := range w.holes {
		n += h.unread()
	}
	return n
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
