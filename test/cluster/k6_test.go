//go:build unix

package cluster

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
)

// k6VUs is how many phones the k6 soak script runs in TestK6SoakThroughDrain.
const k6VUs = 6

// TestK6SoakThroughDrain runs loadtest/k6/soak.js, through the k6 shim
// (loadtest/k6/shim: k6 itself cannot be installed here), against edge D
// behind a TCP balancer that sends a connection to D while D accepts and
// to B otherwise, as HAProxy does with a health check. Once every phone
// has had answers on D, D gets SIGTERM and drains: every phone must see
// close 1001, reconnect (through the balancer, to B), resend what was
// unanswered and end its session with every text answered and no error,
// so that the script's own thresholds pass. The answer-time threshold is
// 5 s rather than the soak's 2 s, for a machine loaded by other tests; a
// delivery left to its 15 s timeout during the drain still fails it.
func TestK6SoakThroughDrain(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		testsvc.Missing(t, "this test needs node (20 or later): apt-get install nodejs")
	}
	root, err := testsvc.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, options{})
	d, _ := startAdminEdge(t, c, "D", "MOBILE_DRAIN_WINDOW=1")
	lb := balance(t, hostOf(t, d.url), hostOf(t, c.edge("B").url))

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--experimental-websocket", "--no-warnings",
		filepath.Join(root, "loadtest/k6/shim/run.mjs"), filepath.Join(root, "loadtest/k6/soak.js"))
	cmd.Env = append(os.Environ(), "URL=ws://"+lb+"/ws", "MOBILE_TOKEN="+c.token,
		"VUS="+strconv.Itoa(k6VUs), "SESSION=20", "MESSAGE_EVERY=0.25", "ANSWER_WAIT=8",
		"RECONNECT_DELAY=0.2", "ANSWER_P99_MS=5000", "RUN="+testsvc.RandomHex(3))
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}

	// The shim prints each counter's running total: once the phones have
	// had answers on D (all of them are there), D drains.
	var tail []string
	answered, drained := 0, false
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "k6shim ") {
			tail = append(tail, line)
			continue
		}
		f := strings.Fields(line)
		if len(f) == 3 && f[1] == "hermes_answered" {
			answered, _ = strconv.Atoi(f[2])
		}
		if !drained && answered >= 3*k6VUs {
			t.Logf("%d answers on D: SIGTERM to D", answered)
			d.Signal(t, syscall.SIGTERM)
			drained = true
		}
	}
	err = cmd.Wait()
	if !drained {
		t.Fatalf("the phones never had %d answers on D (%d); the script said: %s", 3*k6VUs, answered, strings.Join(tail, "\n"))
	}
	var sum struct {
		Metrics map[string]struct {
			Sum   float64            `json:"sum"`
			ByTag map[string]float64 `json:"byTag"`
		} `json:"metrics"`
		Thresholds map[string]bool `json:"thresholds"`
	}
	if jerr := json.Unmarshal(stdout.Bytes(), &sum); jerr != nil {
		t.Fatalf("the shim's summary %q: %v (exit %v); stderr: %s", stdout.String(), jerr, err, strings.Join(tail, "\n"))
	}
	t.Logf("summary: %s", stdout.String())
	if err != nil {
		t.Errorf("the soak script failed (%v): thresholds %v; stderr: %s", err, sum.Thresholds, strings.Join(tail, "\n"))
	}
	m := sum.Metrics
	if got := m["hermes_reconnects"].ByTag["code:1001"]; got < k6VUs {
		t.Errorf("reconnections after close 1001: %v, want every phone's (%d): the drain was not exercised", got, k6VUs)
	}
	if sent, answered := m["hermes_sent"].Sum, m["hermes_answered"].Sum; sent == 0 || answered != sent {
		t.Errorf("answered %v of %v texts", answered, sent)
	}
	if lost, errs := m["hermes_lost"].Sum, m["hermes_errors"].Sum; lost != 0 || errs != 0 {
		t.Errorf("lost %v, errors %v (%v), want none", lost, errs, m["hermes_errors"].ByTag)
	}
}

// balance listens on loopback and pipes each connection to the first of
// backends that accepts it. It returns its address.
func balance(t *testing.T, backends ...string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { pipeToFirst(in, backends) })
		}
	})
	return ln.Addr().String()
}

func pipeToFirst(in net.Conn, backends []string) {
	defer in.Close()
	var out net.Conn
	for _, b := range backends {
		c, err := net.DialTimeout("tcp", b, time.Second)
		if err == nil {
			out = c
			break
		}
	}
	if out == nil {
		return
	}
	defer out.Close()
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, err := io.Copy(dst, src)
		if err == nil || errors.Is(err, net.ErrClosed) {
			if tc, ok := dst.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
		}
		done <- struct{}{}
	}
	go cp(out, in)
	go cp(in, out)
	<-done
	<-done
}
