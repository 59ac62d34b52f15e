package edge

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestDrainSchedule: the closes of a drain are spread over its window, one
// in each equal slot, in order, none after the window, whatever the random
// draws are (the lowest, the highest, and seeded random ones).
func TestDrainSchedule(t *testing.T) {
	const window = 2 * time.Second
	lowest := func(time.Duration) time.Duration { return 0 }
	highest := func(k time.Duration) time.Duration { return k - 1 }
	r := rand.New(rand.NewPCG(1, 2))
	seeded := func(k time.Duration) time.Duration { return time.Duration(r.Int64N(int64(k))) }
	for _, n := range []int{0, 1, 2, 7, 200, 10_000} {
		for name, rnd := range map[string]func(time.Duration) time.Duration{"lowest": lowest, "highest": highest, "seeded": seeded} {
			got := drainSchedule(n, window, rnd)
			if len(got) != n {
				t.Fatalf("n=%d %s: %d offsets", n, name, len(got))
			}
			slot := window / time.Duration(max(n, 1))
			for i, at := range got {
				if lo, hi := slot*time.Duration(i), slot*time.Duration(i+1); at < lo || at > hi || at > window {
					t.Fatalf("n=%d %s: close %d at %v, want within its slot [%v, %v] and the window %v", n, name, i, at, lo, hi, window)
				}
				if i > 0 && at < got[i-1] {
					t.Fatalf("n=%d %s: close %d at %v before close %d at %v", n, name, i, at, i-1, got[i-1])
				}
			}
			// Spread: any tenth of the window holds at most a tenth of
			// the closes, plus one for a slot across its edge.
			if n >= 10 {
				tenths := make([]int, 10)
				for _, at := range got {
					tenths[min(9, int(10*at/window))]++
				}
				for i, k := range tenths {
					if k > n/10+1 {
						t.Fatalf("n=%d %s: %d closes in tenth %d of the window: %v", n, name, k, i, tenths)
					}
				}
			}
		}
	}
}
