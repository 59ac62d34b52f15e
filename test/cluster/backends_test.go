//go:build unix

package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/internal/testsvc"
)

// The cross-node behaviour on the store and bus a deployment grows into:
// TestClusteredBackends starts them and runs the behaviour tests again in a
// child test process pointed at them through these variables.
const (
	envRedisMode = "CLUSTER_TEST_REDIS_MODE"
	envRedisURL  = "CLUSTER_TEST_REDIS_URL"
	envNATSURLs  = "CLUSTER_TEST_NATS_URLS" // comma-separated, one per server
	// envNATSPrefix goes in front of the NATS_PREFIX each test of the
	// child picks, when its NATS user may use subjects under it alone.
	envNATSPrefix = "CLUSTER_TEST_NATS_PREFIX"
)

// crossNode are the tests TestClusteredBackends runs on each backend: a
// card answered on another edge, the outbox after a reconnect on another
// edge, delivery through the router's API, a takeover with deliveries
// running through it (its takeover notice and the router's requests reach
// the old edge over different routes of the NATS cluster), dedup across
// edges, and a sleeping phone's outbox and push notification.
const crossNode = "^(TestCardAnsweredOnOtherEdge|TestEdgeKilledMidFlush|TestDeliverThroughRouter|TestTakeoverAcrossEdges|TestDedupAcrossEdges|TestSleepingPhoneMissesNothing)$"
const crossNodeTests = 6

type backendEnv struct {
	redisMode, redisURL string
	natsURLs            []string
	natsPrefix          string
}

// backends is what the parent TestClusteredBackends set, or nothing.
var backends = sync.OnceValue(func() backendEnv {
	b := backendEnv{redisMode: os.Getenv(envRedisMode), redisURL: os.Getenv(envRedisURL), natsPrefix: os.Getenv(envNATSPrefix)}
	if u := os.Getenv(envNATSURLs); u != "" {
		b.natsURLs = strings.Split(u, ",")
	}
	return b
})

// TestClusteredBackends runs the cross-node tests with every edge and the
// router on a different server of a 3-node NATS cluster, and the state on a
// Redis Cluster of 3 masters (each with a replica), then on a master found
// through Redis Sentinel.
func TestClusteredBackends(t *testing.T) {
	if backends().redisURL != "" {
		t.Skip("already the child run")
	}
	if testing.Short() {
		t.Skip("starts a Redis Cluster, Sentinels and a NATS cluster")
	}
	nats := testsvc.StartNATSCluster(t, 3).URLs
	t.Run("RedisCluster", func(t *testing.T) {
		rc := testsvc.StartRedisCluster(t, 3, 1)
		runCrossNode(t, "cluster", rc.URL(), nats)
	})
	t.Run("Sentinel", func(t *testing.T) {
		runCrossNode(t, "sentinel", startSentinels(t), nats)
	})
	t.Run("UsersOfTheirPrefixOnly", func(t *testing.T) {
		redisURL, natsURL := startRestricted(t)
		runCrossNode(t, "single", redisURL, []string{natsURL}, envNATSPrefix+"="+restrictedNATSPrefix)
	})
}

// The prefixes a restricted user may use (startRestricted): the cluster
// tests' Redis keys all begin with the first; each test's NATS_PREFIX
// begins with the second (the tests run in parallel on one server, each
// with prefixes of its own).
const (
	restrictedRedisPrefix = "hermes-cluster-test:"
	restrictedNATSPrefix  = "gwr."
)

// startRestricted starts a Redis and a NATS server of their own whose one
// user may use only the gateway's prefixes, as an operator sharing them
// with other gateways grants it: the Redis ACL user may touch only keys
// and channels under restrictedRedisPrefix and run no dangerous command;
// the NATS user may publish and subscribe only under restrictedNATSPrefix,
// where the gateway's reply inboxes are too (natsbus.InboxPrefix), not
// under the global _INBOX. It returns their URLs, with the users.
func startRestricted(t *testing.T) (redisURL, natsURL string) {
	redisURL = testsvc.StartRedisForPrefix(t, restrictedRedisPrefix)
	conf := filepath.Join(t.TempDir(), "nats.conf")
	perm := fmt.Sprintf("{allow: [%q]}", restrictedNATSPrefix+">")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(
		"authorization { users: [ {user: gw, password: pw, permissions: {publish: %s, subscribe: %s}} ] }\n", perm, perm)), 0o600); err != nil {
		t.Fatal(err)
	}
	ns := testsvc.StartNATS(t, "-c", conf)
	return redisURL, "nats://gw:pw@" + ns.Addr()
}

// runCrossNode runs crossNode in a child process of this test binary.
func runCrossNode(t *testing.T, mode, redisURL string, nats []string, env ...string) {
	args := []string{"-test.run", crossNode, "-test.count=1", "-test.v"}
	if d, ok := t.Deadline(); ok {
		args = append(args, "-test.timeout="+time.Until(d).Round(time.Second).String())
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), envRedisMode+"="+mode, envRedisURL+"="+redisURL, envNATSURLs+"="+strings.Join(nats, ",")), env...)
	out, err := cmd.CombinedOutput()
	passed := strings.Count(string(out), "--- PASS: ")
	if err != nil || passed < crossNodeTests {
		t.Fatalf("the cross-node tests on REDIS_MODE=%s and a NATS cluster: %v, %d passed\n%s", mode, err, passed, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "--- ") || strings.HasPrefix(l, "ok") {
			t.Log(l)
		}
	}
}

// startSentinels starts a master, a replica and three sentinels (quorum 2)
// watching it, and returns the sentinel URL REDIS_MODE=sentinel takes.
func startSentinels(t *testing.T) string {
	t.Helper()
	server := findBinary("redis-server", "/usr/bin/redis-server")
	sentinel := findBinary("redis-sentinel", "/usr/bin/redis-sentinel")
	if server == "" || sentinel == "" {
		unavailable(t, "Redis Sentinel", "put redis-server and redis-sentinel on PATH (apt-get install redis-server redis-sentinel)")
	}
	dir := t.TempDir()
	port := func() int {
		p, err := testsvc.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	redisReady := func(line string) (string, bool) { return "", strings.Contains(line, "Ready to accept connections") }
	master := port()
	testsvc.StartProc(t, "redis-master", server, []string{"--port", strconv.Itoa(master), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir}, nil, redisReady)
	replica := port()
	testsvc.StartProc(t, "redis-replica", server, []string{"--port", strconv.Itoa(replica), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir,
		"--replicaof", "127.0.0.1", strconv.Itoa(master)}, nil, redisReady)
	var addrs []string
	for i := range 3 {
		p := port()
		conf := filepath.Join(dir, fmt.Sprintf("sentinel-%d.conf", i))
		body := fmt.Sprintf("port %d\nbind 127.0.0.1\nsentinel monitor hermes 127.0.0.1 %d 2\nsentinel down-after-milliseconds hermes 2000\nsentinel failover-timeout hermes 10000\n", p, master)
		if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		testsvc.StartProc(t, fmt.Sprintf("sentinel-%d", i), sentinel, []string{conf}, nil, func(line string) (string, bool) {
			return "", strings.Contains(line, "+monitor master hermes")
		})
		addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(p))
	}
	// The sentinels know the master; wait until each also knows the replica
	// and the other sentinels, as a failover would need.
	for _, a := range addrs {
		testsvc.WaitFor(t, 30*time.Second, "sentinel "+a+" to see the replica and the other sentinels", func() bool {
			sc := redis.NewSentinelClient(&redis.Options{Addr: a, MaxRetries: -1})
			defer sc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			m, err := sc.Master(ctx, "hermes").Result()
			return err == nil && m["num-slaves"] == "1" && m["num-other-sentinels"] == "2"
		})
	}
	u := "redis://" + addrs[0] + "?master_name=hermes"
	for _, a := range addrs[1:] {
		u += "&addr=" + a
	}
	return u
}
