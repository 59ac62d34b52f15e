package batch

import (
	"fmt"
	"slices"
	"sync"
	"testing"
)

// gate is a Run that records each group and holds the first one until
// open is closed.
type gate struct {
	entered, open chan struct{}

	mu     sync.Mutex
	groups [][]int
}

func newGate() *gate { return &gate{entered: make(chan struct{}), open: make(chan struct{})} }

func (g *gate) run(in []int) []string {
	g.mu.Lock()
	g.groups = append(g.groups, slices.Clone(in))
	first := len(g.groups) == 1
	g.mu.Unlock()
	if first {
		close(g.entered)
		<-g.open
	}
	out := make([]string, len(in))
	for i, v := range in {
		out[i] = fmt.Sprint("r", v)
	}
	return out
}

func (g *gate) sizes() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	var n []int
	for _, gr := range g.groups {
		n = append(n, len(gr))
	}
	return n
}

// TestGroupsAfterTheCall: a call made while a group is in flight goes in
// the next group, never the running one, and every call gets its own Out.
func TestGroupsAfterTheCall(t *testing.T) {
	g := newGate()
	var wg sync.WaitGroup
	b := &Batcher[int, string]{Run: g.run, Go: func(f func()) { wg.Go(f) }}
	got := make(chan string, 4)
	b.Add(1, func(s string) { got <- s })
	<-g.entered
	for i := 2; i <= 4; i++ {
		b.Add(i, func(s string) { got <- fmt.Sprint(i, s) })
	}
	close(g.open)
	wg.Wait()
	if want := [][]int{{1}, {2, 3, 4}}; !slices.EqualFunc(g.groups, want, slices.Equal) {
		t.Fatalf("groups = %v, want %v", g.groups, want)
	}
	var outs []string
	for range 4 {
		outs = append(outs, <-got)
	}
	slices.Sort(outs)
	if want := []string{"2r2", "3r3", "4r4", "r1"}; !slices.Equal(outs, want) {
		t.Fatalf("outs = %q, want %q", outs, want)
	}
	// Idle again: the next call runs alone, at once.
	if out := b.Do(5); out != "r5" {
		t.Fatalf("Do(5) = %q", out)
	}
	if n := g.sizes(); !slices.Equal(n, []int{1, 3, 1}) {
		t.Fatalf("group sizes = %v, want [1 3 1]", n)
	}
}

// TestMax: a group holds at most Max calls: exactly Max waiting calls make
// one group, one more makes a second.
func TestMax(t *testing.T) {
	const max = 16
	for _, n := range []int{max, max + 1} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			g := newGate()
			b := &Batcher[int, string]{Run: g.run, Max: max}
			var answered sync.WaitGroup
			answered.Add(1 + n)
			done := func(string) { answered.Done() }
			b.Add(0, done)
			<-g.entered
			for i := range n {
				b.Add(i+1, done)
			}
			close(g.open)
			answered.Wait()
			want := []int{1, max}
			if n > max {
				want = append(want, n-max)
			}
			if got := g.sizes(); !slices.Equal(got, want) {
				t.Fatalf("group sizes = %v, want %v", got, want)
			}
		})
	}
}

// TestConcurrent: many goroutines' calls each get their own answer.
func TestConcurrent(t *testing.T) {
	b := &Batcher[int, int]{Run: func(in []int) []int {
		out := make([]int, len(in))
		for i, v := range in {
			out[i] = v * 2
		}
		return out
	}, Max: 7}
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Go(func() {
			if got := b.Do(i); got != 2*i {
				t.Errorf("Do(%d) = %d", i, got)
			}
		})
	}
	wg.Wait()
}
