package edge

import (
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
)

// TestWorkersReuseAWaitingGoroutine: functions run one after the other
// run on the goroutine that ran the one before (it waits for the next), not
// on a new goroutine each; the worker ends once it waited workerIdle.
func TestWorkersReuseAWaitingGoroutine(t *testing.T) {
	w := newWorkers()
	defer w.stop()
	const n = 100
	for range n {
		ran := make(chan struct{})
		w.run(func() { close(ran) })
		<-ran
		// The worker is back waiting (or about to be) before the next.
		testsvc.WaitFor(t, 5*time.Second, "the worker to wait", func() bool { return w.idle.Load() >= 1 })
	}
	// A run that comes between the worker's count and its wait starts a
	// goroutine; each of the others is the waiting one's.
	if got := w.started.Load(); got > n/4 {
		t.Errorf("%d goroutines started for %d functions run one after the other; want the waiting one reused", got, n)
	}
	testsvc.WaitFor(t, 5*time.Second, "the idle workers to end", func() bool { return w.idle.Load() == 0 })
}

// TestWorkersBoundTheIdle: of many functions run at once, every one runs,
// exactly maxIdle goroutines wait afterwards, and stop ends them.
func TestWorkersBoundTheIdle(t *testing.T) {
	w := newWorkers()
	w.idleFor = time.Hour // none ends by waiting: the bound alone keeps them
	const n = 3 * maxIdleWorkers
	var wg sync.WaitGroup
	release := make(chan struct{})
	wg.Add(n)
	for range n {
		w.run(func() { <-release; wg.Done() })
	}
	close(release)
	wg.Wait()
	testsvc.WaitFor(t, 5*time.Second, "maxIdle workers to wait", func() bool { return w.idle.Load() == maxIdleWorkers })
	w.stop()
	testsvc.WaitFor(t, 5*time.Second, "stop to end them", func() bool { return w.idle.Load() == 0 })
}
