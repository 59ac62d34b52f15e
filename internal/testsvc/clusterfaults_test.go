package testsvc

import (
	"context"
	"fmt"
	"slices"
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
