package edge

import (
	"context"
	"sync"

	"golang.org/x/sync/semaphore"
)

// cronQueue runs the deliver frames of a connection allowed to send them
// (cron, hermes send). Frames to one target run one after the other in the
// order they were read; frames to different targets run at once. A sender
// that writes frames without waiting for their answers (pipelining) is
// held to one round trip per target, not per frame.
//
// The frames taken and not yet answered weigh at most maxCronBytes
// together, each at least cronFrameWeight (so at most 256 small frames):
// past that the connection is not read until one is answered. Nothing is
// refused; TCP holds the sender back.
type cronQueue struct {
	slots *semaphore.Weighted

	mu       sync.Mutex
	byTarget map[string][]cronItem // frames waiting, by target; present while its goroutine runs
	inFlight sync.WaitGroup        // frames taken and not answered
}

type cronItem struct {
	weight int64
	run    func()
}

const (
	maxCronBytes    = 16 << 20
	cronFrameWeight = 64 << 10
)

func newCronQueue() *cronQueue {
	return &cronQueue{slots: semaphore.NewWeighted(maxCronBytes), byTarget: make(map[string][]cronItem)}
}

// push takes run, a frame to target of size bytes: it waits for room (or
// ctx), then queues run behind target's earlier frames, starting their
// goroutine with goFunc when none runs. It is called by the reading
// goroutine only, under the connection's handleMu, so that wait can hold
// back new frames.
func (q *cronQueue) push(ctx context.Context, goFunc func(func()), target string, size int, run func()) error {
	w := min(max(int64(size), cronFrameWeight), maxCronBytes)
	if !q.slots.TryAcquire(w) {
		if err := q.slots.Acquire(ctx, w); err != nil {
			return err
		}
	}
	q.inFlight.Add(1)
	q.mu.Lock()
	items, busy := q.byTarget[target]
	q.byTarget[target] = append(items, cronItem{weight: w, run: run})
	q.mu.Unlock()
	if !busy {
		goFunc(func() { q.runTarget(target) })
	}
	return nil
}

// runTarget runs target's frames, oldest first, until none is left.
func (q *cronQueue) runTarget(target string) {
	for {
		q.mu.Lock()
		items := q.byTarget[target]
		if len(items) == 0 {
			delete(q.byTarget, target)
			q.mu.Unlock()
			return
		}
		it := items[0]
		items[0] = cronItem{}
		q.byTarget[target] = items[1:]
		q.mu.Unlock()
		it.run()
		q.slots.Release(it.weight)
		q.inFlight.Done()
	}
}

// wait returns once every frame taken has been answered. The caller holds
// handleMu, so no frame is taken meanwhile.
func (q *cronQueue) wait() { q.inFlight.Wait() }
