package testsvc

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// The faults of a Redis Cluster: a master killed, its replica promoted, the
// killed node started again on its port and directory, where it finds its
// nodes.conf and rejoins as a replica of the node that took its slots.

func (c *RedisCluster) index(addr string) (int, error) {
	i := slices.Index(c.Addrs, addr)
	if i < 0 {
		return 0, fmt.Errorf("redis cluster: no node %s", addr)
	}
	return i, nil
}

// Masters returns the nodes that serve slots now, as a live node sees them,
// in the order of Addrs.
func (c *RedisCluster) Masters() ([]string, error) {
	var last error
	for _, a := range c.Addrs {
		nodes, err := clusterNodes(a)
		if err != nil {
			last = err
			continue
		}
		var out []string
		for _, n := range c.Addrs {
			if f, ok := nodes[n]; ok && f.master && !f.fail && f.slots {
				out = append(out, n)
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("redis cluster: no node answers CLUSTER NODES: %w", last)
}

// Kill sends SIGKILL to the node at addr and waits until it is gone.
func (c *RedisCluster) Kill(addr string) error {
	i, err := c.index(addr)
	if err != nil {
		return err
	}
	p := c.procs[i]
	if p.ProcessState != nil {
		return fmt.Errorf("redis cluster: %s is not running", addr)
	}
	if err := p.Process.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	_ = p.Wait() // killed: its exit status says so
	return nil
}

// WaitFailedOver waits until the other nodes marked the killed master at
// addr failed and one of its replicas serves its slots: every live node
// sees the cluster ok with no slot on addr.
func (c *RedisCluster) WaitFailedOver(addr string, limit time.Duration) error {
	if !Eventually(limit, func() bool { return c.failedOver(addr) }) {
		return fmt.Errorf("redis cluster: %s not failed over within %v", addr, Slack(limit))
	}
	return nil
}

func (c *RedisCluster) failedOver(addr string) bool {
	for i, a := range c.Addrs {
		if a == addr || c.procs[i].ProcessState != nil {
			continue
		}
		nodes, err := clusterNodes(a)
		if err != nil {
			return false
		}
		if f := nodes[addr]; !f.fail || f.slots {
			return false
		}
		if !clusterReady(a) {
			return false
		}
	}
	return true
}

// Restart starts the killed node at addr again on its port and directory,
// and waits until it is a replica whose link to its master is up and every
// node sees the cluster ok.
func (c *RedisCluster) Restart(addr string, limit time.Duration) error {
	i, err := c.index(addr)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(limit)
	if err := waitPortFree(addr, deadline); err != nil {
		return err
	}
	cmd := exec.Command(c.server, c.args[i]...)
	if err := cmd.Start(); err != nil {
		return err
	}
	c.procs[i] = cmd
	if !Eventually(time.Until(deadline), func() bool { return replicaUp(addr) && c.allReady() }) {
		return fmt.Errorf("redis cluster: %s did not rejoin as a replica within %v", addr, limit)
	}
	return nil
}

// waitPortFree waits until nothing listens on addr: a killed server's
// port may linger for a moment.
func waitPortFree(addr string, deadline time.Time) error {
	for {
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			return ln.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s still in use: %w", addr, err)
		}
		time.Sleep(50 * time.Millisecond) // poll interval
	}
}

func (c *RedisCluster) allReady() bool {
	for i, a := range c.Addrs {
		if c.procs[i].ProcessState != nil {
			continue
		}
		if !clusterReady(a) {
			return false
		}
	}
	return true
}

// replicaUp reports whether the node at addr is a replica in sync with its
// master.
func replicaUp(addr string) bool {
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := rdb.Info(ctx, "replication").Result()
	return err == nil && strings.Contains(info, "role:slave") && strings.Contains(info, "master_link_status:up")
}

type nodeFlags struct{ master, fail, slots bool }

// clusterNodes reads CLUSTER NODES at addr: each node's flags by host:port.
func clusterNodes(addr string) (map[string]nodeFlags, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	s, err := rdb.ClusterNodes(ctx).Result()
	if err != nil {
		return nil, err
	}
	out := make(map[string]nodeFlags)
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		hostport, _, _ := strings.Cut(f[1], "@")
		flags := strings.Split(f[2], ",")
		out[hostport] = nodeFlags{
			master: slices.Contains(flags, "master"),
			fail:   slices.Contains(flags, "fail"),
			slots:  len(f) > 8,
		}
	}
	return out, nil
}
