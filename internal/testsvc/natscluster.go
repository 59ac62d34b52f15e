package testsvc

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
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
	args     [][]string // what Restart starts server i with
	monitors []int
	routes   []string // host:port of each server's route listener
	procs    []*Proc
}

// StartNATSCluster starts n nats-servers joined by routes and returns once
// each routes to all the others. Their output is kept for the messages of
// failures. The processes are killed when t ends. Without nats-server the
// test is skipped, or fails under CI.
//
// The servers start one after the other, each routing to those started
// before it (the routes between the others it learns from them), so a
// server whose port was taken between FreePort and its bind, which exits
// at once, starts again on other ports without any other server having
// been told its old ones.
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
		Missing(t, "this test needs nats-server on PATH (apt-get install nats-server)")
	}
	c := &NATSCluster{bin: bin}
	t.Cleanup(func() {
		for _, p := range c.procs {
			p.kill()
		}
	})
	for i := range n {
		c.startServer(t, i)
	}
	// A server started again routes to every other one itself.
	for i := range n {
		var others []string
		for j, r := range c.routes {
			if j != i {
				others = append(others, r)
			}
		}
		c.args[i] = c.serverArgs(i, c.clientPort(i), c.routes[i], c.monitors[i], others)
	}
	for i := range n {
		var exited *Proc
		if !Eventually(30*time.Second, func() bool {
			for _, p := range c.procs {
				if p.exitedNow() {
					exited = p
					return true
				}
			}
			return c.routed(i)
		}) {
			t.Fatalf("waited %v for nats-%d to route to the %d others; its last output:\n%s", Slack(30*time.Second), i, n-1, c.procs[i].LastLines())
		}
		if exited != nil {
			t.Fatalf("%s exited (%v) while the cluster formed; its last output:\n%s", exited, exited.Err(), exited.LastLines())
		}
	}
	return c
}

// startServer starts server i on free ports, routing to the servers
// started before it, and waits until it listens for routes, the last of
// its three listeners. When one of its ports was taken since FreePort
// chose it, the server exits at once saying so ("address already in use")
// and starts again on other ports.
func (c *NATSCluster) startServer(t testing.TB, i int) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		var client, route, monitor int
		for _, q := range []*int{&client, &route, &monitor} {
			v, err := FreePort()
			if err != nil {
				t.Fatal(err)
			}
			*q = v
		}
		routeAddr := "127.0.0.1:" + strconv.Itoa(route)
		args := c.serverArgs(i, client, routeAddr, monitor, c.routes)
		name := "nats-" + strconv.Itoa(i)
		p, _, err := Launch(name, c.bin, args, nil, nil, func(line string) (string, bool) {
			return "", strings.Contains(line, "Listening for route connections on")
		})
		if err == nil {
			c.procs = append(c.procs, p)
			c.args = append(c.args, args)
			c.URLs = append(c.URLs, "nats://127.0.0.1:"+strconv.Itoa(client))
			c.routes = append(c.routes, routeAddr)
			c.monitors = append(c.monitors, monitor)
			return
		}
		if p == nil {
			t.Fatal(err)
		}
		p.kill()
		if !strings.Contains(p.LastLines(), "address already in use") {
			t.Fatal(err)
		}
		if attempt == 4 {
			t.Fatalf("%s could not listen on five sets of free ports in a row: %v", name, err)
		}
	}
}

// serverArgs are the arguments of server i listening on the given ports
// and routing to routes (host:port, none for the first server).
func (c *NATSCluster) serverArgs(i, client int, route string, monitor int, routes []string) []string {
	args := []string{"-a", "127.0.0.1", "-p", strconv.Itoa(client), "-m", strconv.Itoa(monitor),
		"-n", "nats-" + strconv.Itoa(i), "--cluster_name", "hermes-test", "--cluster", "nats://" + route}
	if len(routes) > 0 {
		var urls []string
		for _, r := range routes {
			urls = append(urls, "nats://"+r)
		}
		args = append(args, "--routes", strings.Join(urls, ","))
	}
	return args
}

func (c *NATSCluster) clientPort(i int) int {
	_, p, _ := strings.Cut(strings.TrimPrefix(c.URLs[i], "nats://"), ":")
	n, _ := strconv.Atoi(p)
	return n
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
	if p.exitedNow() {
		return fmt.Errorf("nats cluster: nats-%d is not running", i)
	}
	p.kill()
	return nil
}

// Restart starts the killed server i again on its ports and waits, at most
// limit, until it routes to every other server.
func (c *NATSCluster) Restart(i int, limit time.Duration) error {
	if !c.procs[i].exitedNow() {
		return fmt.Errorf("nats cluster: nats-%d is running", i)
	}
	deadline := time.Now().Add(limit)
	addr := strings.TrimPrefix(c.URLs[i], "nats://")
	for _, a := range []string{addr, c.routes[i], "127.0.0.1:" + strconv.Itoa(c.monitors[i])} {
		if err := waitPortFree(a, deadline); err != nil {
			return err
		}
	}
	p, _, err := Launch("nats-"+strconv.Itoa(i), c.bin, c.args[i], nil, nil, nil)
	if err != nil {
		return err
	}
	c.procs[i] = p
	if !Eventually(time.Until(deadline), func() bool { return p.exitedNow() || c.routed(i) }) {
		return fmt.Errorf("nats cluster: nats-%d did not route to the others within %v; its last output:\n%s", i, limit, p.LastLines())
	}
	if p.exitedNow() {
		return fmt.Errorf("nats cluster: nats-%d exited at its restart (%v); its last output:\n%s", i, p.Err(), p.LastLines())
	}
	return nil
}
