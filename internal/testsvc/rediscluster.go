package testsvc

import (
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
		msg := "this test needs redis-server and redis-cli on PATH"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
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
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		nodeDir := filepath.Join(dir, strconv.Itoa(i))
		if err := os.Mkdir(nodeDir, 0o755); err != nil {
			t.Fatal(err)
		}
		nodeArgs := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000", "--save", "", "--appendonly", "no",
			"--dir", nodeDir, "--logfile", filepath.Join(nodeDir, "log")}
		c.args = append(c.args, nodeArgs)
		cmd := exec.Command(server, nodeArgs...)
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting redis-server: %v", err)
		}
		c.procs = append(c.procs, cmd)
		addr := "127.0.0.1:" + strconv.Itoa(port)
		c.Addrs = append(c.Addrs, addr)
		waitPing(t, addr)
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
	return c
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
