//go:build unix

package fault

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/tenant"
)

// config of a run: the short form by default, the long form from the
// environment (FAULT_DURATION=3m FAULT_FAULTS=15 FAULT_PHONES=200).
type config struct {
	duration time.Duration // of the fault phase
	quiet    time.Duration // the longest the quiet phase may take
	faults   int
	phones   int
	crons    int
	seed     uint64
	strict   bool // lost texts fail the test (unless FAULT_STRICT=0)
}

func readConfig(t *testing.T, backend string) config {
	c := config{duration: 35 * time.Second, quiet: 60 * time.Second, faults: 6, phones: 40, crons: 4}
	if backend == cluster {
		// The short form in CI: a Redis Cluster and a NATS cluster take
		// longer to start, and a failover to happen.
		c.duration, c.phones = 30*time.Second, 30
	}
	// Lost texts, lost acknowledged deliveries and misroutes fail the test.
	// FAULT_STRICT=0 only reports lost texts, to look at a run's whole
	// history past a loss.
	c.strict = os.Getenv("FAULT_STRICT") != "0"
	if v := os.Getenv("FAULT_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("FAULT_DURATION=%q: %v", v, err)
		}
		c.duration = d
	}
	for _, e := range []struct {
		name string
		dst  *int
	}{{"FAULT_FAULTS", &c.faults}, {"FAULT_PHONES", &c.phones}} {
		if v := os.Getenv(e.name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				t.Fatalf("%s=%q: want a number", e.name, v)
			}
			*e.dst = n
		}
	}
	c.seed = uint64(time.Now().UnixNano())
	if v := os.Getenv("FAULT_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("FAULT_SEED=%q: want a number", v)
		}
		c.seed = n
	}
	c.crons = max(4, c.phones/20)
	c.quiet = max(c.quiet, c.duration*2/3)
	return c
}

// TestFault runs the gateway on one Redis and one NATS server through
// faults with app-like phones and cron, then checks that nothing
// acknowledged was lost and nothing misrouted.
func TestFault(t *testing.T) {
	if testing.Short() {
		t.Skip("the fault test takes about a minute")
	}
	runFault(t, single, false)
}

// TestFaultOwners is TestFault with a tenants file of two owners beside the
// legacy owner: a third of the phones each, saying the same device ids
// (ann's p-000, bob's p-000 and the legacy p-000 are three phones), each
// owner's cron with its own deliver key, and ann flooding made-up
// sleeping devices with big deliveries past the store's outbox bound.
// Nothing acknowledged of any owner is lost, nothing reaches another
// owner's phone, and the flood loses only its own items.
func TestFaultOwners(t *testing.T) {
	if testing.Short() {
		t.Skip("the fault test takes about a minute")
	}
	runFault(t, single, true)
}

// TestFaultCluster is TestFault on a Redis Cluster (3 masters, 3 replicas)
// and a 3-node NATS cluster, the edges and routers on different NATS
// servers, with a Redis master killed (its replica promoted, the killed
// node back as a replica) and a NATS server killed among the faults.
func TestFaultCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("the fault test takes about a minute")
	}
	runFault(t, cluster, false)
}

func runFault(t *testing.T, backend string, owners bool) {
	cfg := readConfig(t, backend)
	if owners {
		backend += "+owners" // in the summary; the world is single's
	}
	t.Logf("fault: backend=%s seed=%d (FAULT_SEED=%d repeats the plan)", backend, cfg.seed, cfg.seed)
	dir, err := os.MkdirTemp("", "hermes-fault-")
	if err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "processes.log"))
	if err != nil {
		t.Fatal(err)
	}
	keep := false
	t.Cleanup(func() {
		logf.Close()
		if keep || t.Failed() {
			t.Logf("the processes' output and Redis's AOF are kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	world := strings.TrimSuffix(backend, "+owners")
	w := newWorld(t, world, dir, &syncWriter{w: logf}, owners)

	rng := mrand.New(mrand.NewPCG(cfg.seed, 0x5eed))
	faults := plan(rng, faultKinds[world], cfg.faults, cfg.duration, patience)
	rec := &recorder{h: History{Wire: make(map[string]string)}}
	ph := &phase{sending: true}
	run := testsvc.RandomHex(3)

	phonesCtx, stopPhones := context.WithCancel(context.Background())
	defer stopPhones()
	var phones []*phone
	var targets []target
	var wg sync.WaitGroup
	for i := range cfg.phones {
		// With owners, phone i is the legacy owner's or an owner's, in
		// turn, and the three of a turn say the same device id.
		wire, o := fmt.Sprintf("p%s-%03d", run, i), -1
		if len(w.owners) > 0 {
			wire, o = fmt.Sprintf("p%s-%03d", run, i/(len(w.owners)+1)), i%(len(w.owners)+1)-1
		}
		p := &phone{
			dev: wire, wire: wire, key: wire, token: w.token, w: w, rec: rec,
			rng:        mrand.New(mrand.NewPCG(cfg.seed, uint64(i+1))),
			unanswered: make(map[string]string),
			silentReq:  make(chan *silentOrder, 1),
			// Asleep for 12 s up to a quarter of the fault phase more.
			sleepFor: sleepMin + cfg.duration/4,
		}
		to := target{dev: wire, wire: wire, deliver: w.deliverToken}
		if o >= 0 {
			p.dev, p.key, p.token = w.owners[o].id+"/"+wire, tenant.DeviceKey(w.owners[o].id, wire), w.owners[o].app
			to = target{dev: p.dev, wire: wire, deliver: w.owners[o].deliver}
			rec.h.Wire[p.dev] = wire
		}
		phones = append(phones, p)
		targets = append(targets, to)
		wg.Add(1)
		go func() { defer wg.Done(); p.run(phonesCtx, ph) }()
	}
	w.phones = phones
	cronCtx, stopCron := context.WithCancel(context.Background())
	defer stopCron()
	var cronWG sync.WaitGroup
	var delivered atomic.Int64
	for i := range cfg.crons {
		cronWG.Add(1)
		r := mrand.New(mrand.NewPCG(cfg.seed, uint64(1<<32+i)))
		go func() { defer cronWG.Done(); cron(cronCtx, w, rec, r, targets, &delivered) }()
	}
	var flooded atomic.Int64
	for _, o := range w.owners {
		if o.id == flooder {
			cronWG.Add(1)
			r := mrand.New(mrand.NewPCG(cfg.seed, 0xf100d))
			go func() { defer cronWG.Done(); flood(cronCtx, w, r, o, &flooded) }()
		}
	}

	// The fault phase.
	start := time.Now()
	var done []string
	for _, f := range faults {
		if d := time.Until(start.Add(f.at)); d > 0 {
			time.Sleep(d) // the plan's schedule
		}
		t.Logf("fault %d: %v", len(done)+1, f)
		if err := w.inject(f); err != nil {
			t.Fatalf("fault %v: %v", f, err)
		}
		done = append(done, f.kind)
	}
	if d := time.Until(start.Add(cfg.duration)); d > 0 {
		time.Sleep(d) // the rest of the fault phase, as long as the run asks
	}

	// The quiet phase: no new texts nor deliveries; phones resend until
	// every text is answered or the deadline.
	ph.quiet()
	stopCron()
	cronWG.Wait()
	quietStart := time.Now()
	// Not a failure when the deadline passes: what is still unanswered, or
	// owed and not received (a sleeping phone's queued deliveries), is
	// counted as lost below.
	testsvc.Eventually(cfg.quiet, func() bool {
		left := 0
		for _, p := range phones {
			left += p.pending()
		}
		return left == 0 && len(Check(rec.history()).LostDeliveries) == 0
	})
	t.Logf("quiet phase: %v", time.Since(quietStart).Round(100*time.Millisecond))
	stopPhones()
	wg.Wait()

	conns, gaveUp, sleeps := 0, 0, 0
	for _, p := range phones {
		conns += p.conn
		gaveUp += p.gaveUp
		sleeps += p.sleeps
	}
	t.Logf("phones: %d connections, %d given up for want of a pong, %d sleeps", conns, gaveUp, sleeps)
	unread := w.unread()
	if len(w.owners) > 0 {
		// The flood must have met its owner's outbox quota, and the quota
		// held it: its items went, not the others' (which Check counts as
		// lost).
		var held int64
		for i := range floodDevices {
			held += w.outboxLen(tenant.DeviceKey(flooder, fmt.Sprintf("flood-%d", i)))
		}
		t.Logf("flood: %d deliveries of %d bytes queued, %d of them still held (the quota: %d MiB)", flooded.Load(), floodBytes, held, floodQuotaMiB)
		if bound := int64(floodQuotaMiB<<20) / floodBytes; flooded.Load() <= bound || held > bound {
			t.Errorf("the flood queued %d and the store holds %d of them: want more than %d queued and at most %d held", flooded.Load(), held, bound, bound)
		}
	}

	h := rec.history()
	r := Check(h)
	summary := fmt.Sprintf("fault: backend=%s seed=%d faults=%d texts=%d deliveries=%d delivered=%d queued=%d lost=%d misrouted=%d duplicates=%d reordered=%d silent=%d sleeps=%d unread=%d",
		backend, cfg.seed, len(done), r.Texts, r.Deliveries, r.Delivered, r.Queued, r.Lost(), len(r.Misrouted), r.Duplicates, r.Reordered, w.silent, sleeps, unread)
	t.Log(summary)
	fmt.Println(summary)
	if r.Lost() == 0 && len(r.Misrouted) == 0 {
		return
	}
	fail := cfg.strict || len(r.LostDeliveries) > 0 || len(r.Misrouted) > 0
	keep = true
	var b strings.Builder
	fmt.Fprintf(&b, "lost texts %v\nlost deliveries %v\nmisrouted %q\n", r.LostTexts, r.LostDeliveries, r.Misrouted)
	devSeen := make(map[string]bool)
	for _, id := range append(append([]string(nil), r.LostTexts...), r.LostDeliveries...) {
		dev, _, _ := strings.Cut(id, "-t")
		dev, _, _ = strings.Cut(dev, ".d")
		if devSeen[dev] || len(devSeen) >= 5 {
			continue
		}
		devSeen[dev] = true
		fmt.Fprintf(&b, "history of %s:\n%s", dev, Trace(h, dev))
	}
	if fail {
		t.Fatal(b.String())
	}
	t.Log(b.String())
	t.Logf("%d texts lost (see above): reported, not failed, as FAULT_STRICT=0 asks", len(r.LostTexts))
}

// syncWriter serialises the processes' writes to the log file.
type syncWriter struct {
	mu sync.Mutex
	w  *os.File
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
