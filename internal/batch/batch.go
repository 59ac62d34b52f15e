// Package batch runs calls of many goroutines in groups, one group at a
// time: a call made while a group is in flight waits for the next group,
// sent as soon as the first is answered with every call made meanwhile
// (group commit). Idle, a call goes at once, alone; under load the groups
// grow and the cost per call (a round trip, a system call) falls.
//
// Every call is run by a group that starts after the call was made, never
// by one already in flight: a read made after a write sees the write.
package batch

import "sync"

// Batcher groups calls of In into runs of Run. The zero value is not
// usable; set Run.
type Batcher[In, Out any] struct {
	// Run answers a group, one Out per In, in order. It runs on a goroutine
	// of Go's, one group at a time.
	Run func(in []In) []Out
	// Max bounds a group's size; 0 means no bound.
	Max int
	// Go starts a goroutine; nil means the go statement.
	Go func(func())

	mu      sync.Mutex
	busy    bool // a goroutine is running groups
	pending []call[In, Out]
}

type call[In, Out any] struct {
	in   In
	done func(Out)
}

// Add queues in; done gets its Out, on the group's goroutine, so it must
// not block.
func (b *Batcher[In, Out]) Add(in In, done func(Out)) {
	b.mu.Lock()
	b.pending = append(b.pending, call[In, Out]{in, done})
	if b.busy {
		b.mu.Unlock()
		return
	}
	b.busy = true
	b.mu.Unlock()
	if b.Go != nil {
		b.Go(b.loop)
	} else {
		go b.loop()
	}
}

// Do is Add that waits for the Out.
func (b *Batcher[In, Out]) Do(in In) Out {
	got := make(chan Out, 1)
	b.Add(in, func(o Out) { got <- o })
	return <-got
}

// loop runs groups until nothing is pending.
func (b *Batcher[In, Out]) loop() {
	for {
		b.mu.Lock()
		group := b.pending
		if b.Max > 0 && len(group) > b.Max {
			group = group[:b.Max:b.Max]
			b.pending = b.pending[b.Max:]
		} else {
			b.pending = nil
		}
		if len(group) == 0 {
			b.busy = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		in := make([]In, len(group))
		for i, c := range group {
			in[i] = c.in
		}
		out := b.Run(in)
		for i, c := range group {
			c.done(out[i])
		}
	}
}
