package testsvc

import (
	"runtime"
	"testing"
	"time"
)

// LiveHeap is the process's live heap once it settled: two readings after
// a collection that agree within 256 KiB, so what earlier tests left
// behind (goroutines still ending) is collected first.
func LiveHeap(t testing.TB) int64 {
	t.Helper()
	read := func() int64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc)
	}
	last := read()
	for range 50 {
		time.Sleep(10 * time.Millisecond) // poll interval: goroutines of earlier tests end
		h := read()
		if d := h - last; d < 256<<10 && d > -256<<10 {
			return h
		}
		last = h
	}
	t.Fatalf("the heap did not settle: %d KiB", last>>10)
	return 0
}
