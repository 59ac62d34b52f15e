package testsvc

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestNATSClusterRestartsOnItsPorts: a killed server of a NATS cluster comes
// back on its client port and routes to the others again.
func TestNATSClusterRestartsOnItsPorts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a NATS cluster")
	}
	c := StartNATSCluster(t, 3)
	if err := c.Kill(1); err != nil {
		t.Fatal(err)
	}
	WaitFor(t, 10*time.Second, "nats-0 to lose its route to the killed nats-1", func() bool { return !c.routed(0) })
	if err := c.Kill(1); err == nil {
		t.Fatal("Kill of a killed server: no error")
	}
	if err := c.Restart(1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		WaitFor(t, 30*time.Second, "every server to route to the two others", func() bool { return c.routed(i) })
	}
	if err := NATSInfo(c.URLs[1][len("nats://"):]); err != nil {
		t.Fatalf("nats-1 on its old client port: %v", err)
	}
}

// TestNATSClusterTakesOtherPortsWhenTaken: a port taken between FreePort
// and the bind of the nats-server it was for (here a route port, a monitor
// port and a client port, of three servers) does not keep the cluster from
// forming promptly: that server starts again on other ports, the others
// route to it there, and a restart brings it back on its new ports.
func TestNATSClusterTakesOtherPortsWhenTaken(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a NATS cluster")
	}
	var mu sync.Mutex
	calls := 0
	var taken []int
	var held []net.Listener
	t.Cleanup(func() {
		for _, ln := range held {
			ln.Close()
		}
	})
	hookFreePort(t, func(port int) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		// Each server takes a client, a route and a monitor port: the 2nd
		// is nats-0's route port; nats-0 starting again takes the 4th to
		// 6th, so the 9th is nats-1's monitor port; nats-1 starting again
		// takes the 10th to 12th, so the 13th is nats-2's client port.
		if calls != 2 && calls != 9 && calls != 13 {
			return
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			t.Errorf("taking port %d: %v", port, err)
			return
		}
		taken = append(taken, port)
		held = append(held, ln)
	})
	start := time.Now()
	c := StartNATSCluster(t, 3)
	elapsed := time.Since(start)
	hookFreePort(t, nil)
	mu.Lock()
	took, n := slices.Clone(taken), calls
	mu.Unlock()
	if len(took) != 3 {
		t.Fatalf("took ports %v of %d FreePort calls; want a route, a monitor and a client port", took, n)
	}
	var ports []int
	for i := range 3 {
		for _, a := range []string{strings.TrimPrefix(c.URLs[i], "nats://"), c.routes[i], "127.0.0.1:" + strconv.Itoa(c.monitors[i])} {
			_, p, _ := net.SplitHostPort(a)
			n, _ := strconv.Atoi(p)
			ports = append(ports, n)
		}
	}
	for _, p := range took {
		if slices.Contains(ports, p) {
			t.Errorf("port %d, taken before its server bound it, is one of the cluster's: %v", p, ports)
		}
	}
	// Started three times over, the servers still route well within the
	// 30 s StartNATSCluster waits for that.
	if limit := Slack(10 * time.Second); elapsed > limit {
		t.Errorf("the cluster formed in %v, want less than %v", elapsed, limit)
	}
	if err := c.Kill(0); err != nil {
		t.Fatal(err)
	}
	WaitFor(t, 10*time.Second, "nats-1 to lose its route to the killed nats-0", func() bool { return !c.routed(1) })
	if err := c.Restart(0, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		WaitFor(t, 30*time.Second, "every server to route to the two others after nats-0's restart", func() bool { return c.routed(i) })
	}
	if err := NATSInfo(strings.TrimPrefix(c.URLs[0], "nats://")); err != nil {
		t.Fatalf("nats-0 on its new client port after the restart: %v", err)
	}
}

// hookFreePort makes FreePort call f with each port it is about to return,
// until t ends (nil: no more).
func hookFreePort(t *testing.T, f func(port int)) {
	set := func(f func(int)) {
		portsMu.Lock()
		freePortHook = f
		portsMu.Unlock()
	}
	set(f)
	t.Cleanup(func() { set(nil) })
}

// TestRedisClusterFailsOverAndRejoins: a killed master's replica takes its
// slots, and the killed node, restarted, is a replica; a key written before
// the kill (and replicated) is still there.
func TestRedisClusterFailsOverAndRejoins(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster and fails a master over")
	}
	c := StartRedisCluster(t, 3, 1)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	masters, err := c.Masters()
	if err != nil || len(masters) != 3 {
		t.Fatalf("Masters = %v, %v; want 3", masters, err)
	}
	keys := make([]string, 30) // on every master
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
		if err := rdb.Set(ctx, keys[i], "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	WaitFor(t, 10*time.Second, "every replica to catch up with its master", func() bool {
		shards, err := rdb.ClusterShards(ctx).Result()
		if err != nil || len(shards) != 3 {
			return false
		}
		for _, s := range shards {
			if len(s.Nodes) != 2 || s.Nodes[0].ReplicationOffset != s.Nodes[1].ReplicationOffset {
				return false
			}
		}
		return true
	})
	victim := masters[0]
	if err := c.Kill(victim); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitFailedOver(victim, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	after, err := c.Masters()
	if err != nil || len(after) != 3 || slices.Contains(after, victim) {
		t.Fatalf("Masters after the failover = %v, %v; want 3 without %s", after, err, victim)
	}
	if err := c.Restart(victim, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	if !replicaUp(victim) {
		t.Fatalf("%s is not a replica after its restart", victim)
	}
	for _, k := range keys {
		if v, err := rdb.Get(ctx, k).Result(); err != nil || v != "v" {
			t.Fatalf("GET %s = %q, %v after the failover; want v", k, v, err)
		}
	}
}
