package edge

import (
	"context"
	"errors"
	"sync"
	"testing"
)

// TestCronQueueBound: frames are taken while they weigh at most
// maxCronBytes together, small ones at cronFrameWeight each; one past the
// bound waits (here: fails on a done context) until a frame is answered.
// Frames to one target run in order.
func TestCronQueueBound(t *testing.T) {
	q := newCronQueue()
	done, cancel := context.WithCancel(context.Background())
	cancel() // Acquire succeeds without waiting when there is room, else fails
	release := make(chan struct{})
	var mu sync.Mutex
	var order []int
	goFunc := func(f func()) { go f() }
	const slots = maxCronBytes / cronFrameWeight
	for i := range slots {
		if err := q.push(done, goFunc, "a", 1, func() {
			<-release
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
		}); err != nil {
			t.Fatalf("frame %d of %d: %v", i+1, slots, err)
		}
	}
	if err := q.push(done, goFunc, "b", 1, func() {}); !errors.Is(err, context.Canceled) {
		t.Fatalf("frame %d: %v, want it to wait for room", slots+1, err)
	}
	release <- struct{}{} // the first frame is answered: room for one
	if err := q.push(context.Background(), goFunc, "b", 1, func() {}); err != nil {
		t.Fatal(err)
	}
	close(release)
	q.wait()
	if len(order) != slots {
		t.Fatalf("%d frames ran, want %d", len(order), slots)
	}
	for i, v := range order {
		if v != i {
			t.Fatalf("frames to one target ran in the order %v", order)
		}
	}
	// A frame of the largest size takes the whole bound, and fits it.
	if err := q.push(done, goFunc, "c", maxCronBytes, func() {}); err != nil {
		t.Fatal(err)
	}
	q.wait()
}
