package testsvc

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisCluster is a Redis Cluster of real redis-server processes on
// loopback ports, made by StartRedisCluster for one test.
type RedisCluster struct {
	// Addrs are the nodes' host:port, masters first (as redis-cli
	// --cluster create was given them).
	Addrs []string
	procs []*exec.Cmd
	// server and args start node i again (Restart).
	server string
	args   [][]string
}

// URL is the cluster URL of go-redis (redis.ParseClusterURL) naming every
// node: the form REDIS_URL takes with REDIS_MODE=cluster.
func (c *RedisCluster) URL() string {
	u := "redis://" + c.Addrs[0]
	for i, a := range c.Addrs[1:] {
		sep := "&"
		if i == 0 {
			sep = "?"
		}
		u += sep + "addr=" + a
	}
	return u
}

// StartRedisCluster starts masters redis-servers with cluster mode on, plus
// replicas per master, joins them with redis-cli --cluster create (slots
// in equal contiguous ranges) and waits until every node reports the
// cluster ok. The processes are killed when t ends. Without redis-server
// or redis-cli the test is skipped, or fails under CI.
func StartRedisCluster(t testing.TB, masters, replicas int) *RedisCluster {
	t.Helper()
	server, err1 := exec.LookPath("redis-server")
	cli, err2 := exec.LookPath("redis-cli")
	if err1 != nil || err2 != nil {
		Missing(t, "this test needs redis-server and redis-cli on PATH")
	}
	dir := t.TempDir()
	c := &RedisCluster{server: server}
	t.Cleanup(func() {
		for _, p := range c.procs {
			if p.ProcessState == nil {
				_ = p.Process.Signal(syscall.SIGKILL)
				_ = p.Wait() // killed: its exit status says so

			}
		}
	})
	for i := range masters * (1 + replicas) {
		c.startNode(t, dir, i)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, a := range c.Addrs {
		WaitFor(t, 60*time.Second, "Redis Cluster node "+a+" to report cluster_state:ok and its role", func() bool {
			return clusterReady(a)
		})
	}
	// A replica fails over only with data of its master fresh enough
	// (cluster-replica-validity-factor): one whose first sync has not
	// finished would never take over a master killed at once.
	WaitFor(t, 60*time.Second, "every Redis Cluster replica to sync with its master", func() bool {
		up := 0
		for _, a := range c.Addrs {
			if replicaUp(a) {
				up++
			}
		}
		return up == masters*replicas
	})
	return c
}

// startNode starts node i of the cluster on a free port, with its files in
// dir/i, and waits until it answers PING. A port FreePort found free can
// be taken by another socket before the server binds it (the kernel hands
// out the same range to outgoing connections): the server then exits
// saying so in its log, and the node starts again on another port.
func (c *RedisCluster) startNode(t testing.TB, dir string, i int) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		nodeDir := filepath.Join(dir, strconv.Itoa(i))
		if attempt > 0 {
			nodeDir += "-" + strconv.Itoa(attempt)
		}
		if err := os.Mkdir(nodeDir, 0o755); err != nil {
			t.Fatal(err)
		}
		logFile := filepath.Join(nodeDir, "log")
		nodeArgs := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000", "--save", "", "--appendonly", "no",
			"--dir", nodeDir, "--logfile", logFile}
		cmd := exec.Command(c.server, nodeArgs...)
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting redis-server: %v", err)
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		if !pingOrBindFailure(t, addr, logFile) {
			_ = cmd.Wait() // it exited: the port was taken
			if attempt == 4 {
				t.Fatalf("redis-server could not listen on five free ports in a row; the last: %s", addr)
			}
			continue
		}
		c.args = append(c.args, nodeArgs)
		c.procs = append(c.procs, cmd)
		c.Addrs = append(c.Addrs, addr)
		return
	}
}

// pingOrBindFailure waits until the Redis at addr answers PING (true) or
// its log says it could not listen (false).
func pingOrBindFailure(t testing.TB, addr, logFile string) bool {
	t.Helper()
	up := false
	WaitFor(t, 30*time.Second, "redis-server at "+addr+" to answer PING", func() bool {
		if log, _ := os.ReadFile(logFile); bytes.Contains(log, []byte("Could not create server TCP listening socket")) {
			return true
		}
		rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		defer rdb.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		up = rdb.Ping(ctx).Err() == nil
		return up
	})
	return up
}

// clusterReady reports whether the node at addr sees the cluster ok with
// every slot served.
func clusterReady(addr string) bool {
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := rdb.ClusterInfo(ctx).Result()
	return err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_slots_ok:16384")
}
