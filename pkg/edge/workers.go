package edge

import (
	"sync"
	"sync/atomic"
	"time"
)

// The goroutines that run a delivery's write, a socket's flush or a
// handshake wait a moment, once their function returned, for the next
// function to run. A new goroutine for each started on the minimum stack
// and grew it again every time: at 5,000 deliveries a second that copying
// was a fifth of the edge's CPU.
const (
	// maxIdleWorkers bounds the goroutines waiting for work (with their
	// stacks, a few KiB each); one more that finishes ends.
	maxIdleWorkers = 64
	// workerIdle is how long one waits before it ends.
	workerIdle = 250 * time.Millisecond
)

// workers runs functions on goroutines that are reused (newWorkers).
type workers struct {
	work     chan func() // unbuffered: a send succeeds only to a waiting worker
	quit     chan struct{}
	stopOnce sync.Once
	maxIdle  int32
	idleFor  time.Duration
	idle     atomic.Int32 // workers waiting
	started  atomic.Int64 // goroutines started
}

func newWorkers() *workers {
	return &workers{work: make(chan func()), quit: make(chan struct{}), maxIdle: maxIdleWorkers, idleFor: workerIdle}
}

// run runs f on a waiting worker, or on a new one when none waits.
func (w *workers) run(f func()) {
	select {
	case w.work <- f:
	default:
		w.started.Add(1)
		go w.loop(f)
	}
}

// stop ends the waiting workers, and each busy one when its function
// returns; run still runs functions, each on a goroutine of its own.
func (w *workers) stop() { w.stopOnce.Do(func() { close(w.quit) }) }

func (w *workers) loop(f func()) {
	var t *time.Timer
	for {
		f()
		if w.idle.Add(1) > w.maxIdle {
			w.idle.Add(-1)
			return
		}
		if t == nil {
			t = time.NewTimer(w.idleFor)
		} else {
			t.Reset(w.idleFor)
		}
		select {
		case f = <-w.work:
			w.idle.Add(-1)
		case <-t.C:
			w.idle.Add(-1)
			return
		case <-w.quit:
			w.idle.Add(-1)
			return
		}
	}
}
