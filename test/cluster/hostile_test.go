//go:build linux

package cluster

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// The hostile-load test: authenticated sockets that announce 16 MiB
// messages and send 15 MiB of each, and devices that open every upload they
// may, against an edge with 64 MiB budgets. The edge's RSS must stay under
// a stated bound (without the budgets the read attack alone buffers
// 48 × 15 MiB). While the read attack holds the read budget, large
// messages of other sockets are refused too (fatal internal_error, the
// phone sends again); small frames are not while a well-behaved phone on the same edge keeps its round
// trip. docs/security.md records the figures.

const (
	hostileBudgetMiB = 64
	// hostileRSSBound is what the edge may reach: its three budgets, plus
	// the Go runtime's headroom over the live read buffers and the
	// process's own baseline.
	hostileRSSBound = 3*hostileBudgetMiB<<20 + 64<<20
	hostileReaders  = 48
	hostileDevices  = 20
)

func TestHostileLoadKeepsMemoryBounded(t *testing.T) {
	c := newCluster(t, options{})
	budget := strconv.Itoa(hostileBudgetMiB)
	e := c.startEdge(t, "H", "MOBILE_MAX_READ_MIB="+budget, "MOBILE_MAX_QUEUED_MIB="+budget, "MOBILE_MAX_UPLOAD_MIB="+budget)
	rss := watchRSS(t, e.Pid())
	calm := c.connect(t, "H", newDevice("calm"))
	rtt := watchRoundTrips(t, calm)

	// Attack 1: every device opens its 8 uploads of 1 MiB.
	var wg sync.WaitGroup
	var partsRefused atomic.Int64
	part := make([]byte, 1<<20)
	for d := range hostileDevices {
		conn := c.hello(t, "H", newDevice(fmt.Sprintf("uploader%d", d)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for u := range protocol.MaxOpenUploads {
				if err := conn.Media(client.MediaUp{ID: fmt.Sprintf("up%d", u), Kind: "document", Mime: "application/octet-stream",
					Filename: "f.bin", Data: part, Part: 0, Parts: 2}); err != nil {
					t.Errorf("upload: %v", err)
					return
				}
			}
			for _, e := range errorsIn(pingBarrier(t, conn)) {
				if e.Code == protocol.CodeInternalError {
					partsRefused.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	opened := int64(hostileDevices*protocol.MaxOpenUploads) - partsRefused.Load()
	t.Logf("upload attack: %d parts of 1 MiB stored, %d refused", opened, partsRefused.Load())
	if opened > hostileBudgetMiB {
		t.Errorf("%d MiB of uploads stored; the upload budget is %d MiB", opened, hostileBudgetMiB)
	}

	// Attack 2 (the uploads hold no read budget: each part is a whole message): messages announced at 16 MiB, sent up to 15 MiB and held.
	var refused, holding atomic.Int64
	chunk := make([]byte, 1<<20)
	for i := range hostileReaders {
		conn := c.hello(t, "H", newDevice(fmt.Sprintf("reader%d", i)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if conn.SendHeaderOnly(16<<20) != nil {
				refused.Add(1)
				return
			}
			for range 15 {
				if conn.SendPayload(chunk) != nil {
					break
				}
			}
			select {
			case <-conn.Done():
				refused.Add(1)
			default:
				if ci, err := conn.ExpectClose(within(t, 2*time.Second)); err == nil && ci.Reason == string(protocol.CodeInternalError) {
					refused.Add(1)
				} else {
					holding.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("read attack: %d sockets refused, %d holding 15 MiB each; edge RSS at most %d MiB so far", refused.Load(), holding.Load(), rss()>>20)
	if h := holding.Load(); h > hostileBudgetMiB/16 {
		t.Errorf("%d sockets hold an unfinished 16 MiB message; the read budget allows %d", h, hostileBudgetMiB/16)
	}

	maxRSS := rss()
	times := rtt()
	t.Logf("edge RSS at most %d MiB (bound %d MiB); calm phone: %d round trips, p50 %v, max %v",
		maxRSS>>20, hostileRSSBound>>20, len(times), times[len(times)/2], times[len(times)-1])
	if maxRSS > hostileRSSBound {
		t.Errorf("edge RSS reached %d MiB; bound %d MiB", maxRSS>>20, hostileRSSBound>>20)
	}
	if worst := times[len(times)-1]; worst > testsvc.Slack(2*time.Second) {
		t.Errorf("the calm phone's slowest round trip took %v during the attacks", worst)
	}
}

// watchRSS samples the resident set of pid until the test ends; the
// function returned gives the largest seen.
func watchRSS(t *testing.T, pid int) func() int64 {
	var max atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	sample := func() {
		if v := readRSS(pid); v > max.Load() {
			max.Store(v)
		}
	}
	go func() {
		defer close(done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				sample()
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return func() int64 { sample(); return max.Load() }
}

// readRSS is VmRSS of pid in bytes (0 when it cannot be read).
func readRSS(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// watchRoundTrips pings on conn, one ping at a time, until the function
// returned is called; it returns the round trips, sorted.
func watchRoundTrips(t *testing.T, conn *client.Conn) func() []time.Duration {
	stop := make(chan struct{})
	done := make(chan []time.Duration, 1)
	go func() {
		var times []time.Duration
		defer func() { slices.Sort(times); done <- times }()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			ts := strconv.Itoa(i)
			start := time.Now()
			if err := conn.Ping(ts); err != nil {
				t.Errorf("calm phone: ping: %v", err)
				return
			}
			for {
				f, err := conn.Next(within(t, 30*time.Second))
				if err != nil {
					t.Errorf("calm phone: waiting for pong %s: %v", ts, err)
					return
				}
				if f.T() == protocol.TypePong && f.Str("ts") == ts {
					break
				}
			}
			times = append(times, time.Since(start))
		}
	}()
	return func() []time.Duration {
		close(stop)
		times := <-done
		if len(times) == 0 {
			t.Fatal("the calm phone made no round trip")
		}
		return times
	}
}
