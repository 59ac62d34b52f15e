package testsvc

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// NATSCluster is a cluster of real nats-server processes joined by routes
// on loopback ports, made by StartNATSCluster for one test. The gateway
// needs no JetStream, so the servers run without it.
type NATSCluster struct {
	// URLs are the servers' client URLs, one per server.
	URLs     []string
	bin      string
	args     [][]string
	monitors []int
	routes   []string // host:port of each server's route listener
	procs    []*exec.Cmd
}

// StartNATSCluster starts n nats-servers joined by routes and returns once
// each routes to all the others. Each logs to a file in a directory of t's.
// The processes are killed when t ends. Without nats-server the test is
// skipped, or fails under CI.
func StartNATSCluster(t testing.TB, n int) *NATSCluster {
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		for _, p := range []string{"/usr/sbin/nats-server", "/usr/local/bin/nats-server", "/usr/bin/nats-server"} {
			if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
				bin = p
				break
			}
		}
	}
	if bin == "" {
		msg := "this test needs nats-server on PATH (apt-get install nats-server)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dir := t.TempDir()
	c := &NATSCluster{bin: bin}
	t.Cleanup(func() {
		for _, p := range c.procs {
			if p.ProcessState == nil {
				_ = p.Process.Signal(syscall.SIGKILL)
				_ = p.Wait() // killed: its exit status says so
			}
		}
	})
	type ports struct{ client, route, monitor int }
	var ps []ports
	for range n {
		var p ports
		for _, q := range []*int{&p.client, &p.route, &p.monitor} {
			v, err := FreePort()
			if err != nil {
				t.Fatal(err)
			}
			*q = v
		}
		ps = append(ps, p)
	}
	var routes []string
	for _, p := range ps {
		routes = append(routes, "nats://127.0.0.1:"+strconv.Itoa(p.route))
		c.URLs = append(c.URLs, "nats://127.0.0.1:"+strconv.Itoa(p.client))
		c.monitors = append(c.monitors, p.monitor)
		c.routes = append(c.routes, "127.0.0.1:"+strconv.Itoa(p.route))
	}
	for i, p := range ps {
		c.args = append(c.args, []string{"-a", "127.0.0.1", "-p", strconv.Itoa(p.client), "-m", strconv.Itoa(p.monitor),
			"-n", "nats-" + strconv.Itoa(i), "--cluster_name", "hermes-test",
			"--cluster", routes[i], "--routes", strings.Join(routes, ","),
			"-l", filepath.Join(dir, fmt.Sprintf("nats-%d.log", i))})
		cmd := exec.Command(bin, c.args[i]...)
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting nats-server: %v", err)
		}
		c.procs = append(c.procs, cmd)
	}
	for i := range ps {
		WaitFor(t, 30*time.Second, fmt.Sprintf("nats-%d to route to the %d others", i, n-1), func() bool {
			return c.routed(i)
		})
	}
	return c
}

// routed reports whether server i routes to every other server.
func (c *NATSCluster) routed(i int) bool {
	hc := http.Client{Timeout: time.Second}
	resp, err := hc.Get("http://127.0.0.1:" + strconv.Itoa(c.monitors[i]) + "/routez")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var rz struct {
		Routes []struct {
			RemoteID string `json:"remote_id"`
		} `json:"routes"`
	}
	if json.NewDecoder(resp.Body).Decode(&rz) != nil {
		return false
	}
	peers := map[string]bool{}
	for _, r := range rz.Routes {
		peers[r.RemoteID] = true
	}
	return len(peers) == len(c.URLs)-1
}

// Kill sends SIGKILL to server i and waits until it is gone.
func (c *NATSCluster) Kill(i int) error {
	p := c.procs[i]
	if p.ProcessState != nil {
		return fmt.Errorf("nats cluster: nats-%d is not running", i)
	}
	if err := p.Process.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	_ = p.Wait() // killed: its exit status says so
	return nil
}

// Restart starts the killed server i again on its ports and waits, at most
// limit, until it routes to every other server.
func (c *NATSCluster) Restart(i int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	addr := strings.TrimPrefix(c.URLs[i], "nats://")
	for _, a := range []string{addr, c.routes[i]} {
		if err := waitPortFree(a, deadline); err != nil {
			return err
		}
	}
	cmd := exec.Command(c.bin, c.args[i]...)
	if err := cmd.Start(); err != nil {
		return err
	}
	c.procs[i] = cmd
	if !Eventually(time.Until(deadline), func() bool { return c.routed(i) }) {
		return fmt.Errorf("nats cluster: nats-%d did not route to the others within %v", i, limit)
	}
	return nil
}
