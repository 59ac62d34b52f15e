package main

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"
)

// growth is the ratio between the bounds of one histogram bucket: a
// percentile read from the histogram is within 0.5% of the true value
// (the bucket's geometric middle), whatever the range.
const growth = 1.01

// maxBucket bounds the buckets of a histogram: 1.01^2300 µs is far beyond
// any duration a run can measure (its phases are capped at an hour), so a
// histogram holds at most this many counters.
const maxBucket = 2300

var logGrowth = math.Log(growth)

// Histogram counts durations in buckets 1% wide, from 1 µs up: its memory is
// fixed however many samples it takes, and the histograms of several runs
// add up (Merge), so percentiles of a run spread over several processes are
// those of all its samples. The zero value is empty and ready; it is safe
// for concurrent use.
type Histogram struct {
	mu      sync.Mutex
	buckets map[int]uint64
	n       uint64
	sum     time.Duration
	min     time.Duration
	max     time.Duration
}

// bucketOf is the index of d's bucket: 0 for under 1 µs, then i for
// [1.01^(i-1), 1.01^i) µs.
func bucketOf(d time.Duration) int {
	us := float64(d) / float64(time.Microsecond)
	if us < 1 {
		return 0
	}
	return min(maxBucket, 1+int(math.Floor(math.Log(us)/logGrowth)))
}

// bucketValue is the duration that stands for bucket i: the geometric middle
// of its bounds.
func bucketValue(i int) time.Duration {
	if i <= 0 {
		return 0
	}
	us := math.Pow(growth, float64(i)-0.5)
	return time.Duration(us * float64(time.Microsecond))
}

// Record adds one sample. A negative duration counts as 0.
func (h *Histogram) Record(d time.Duration) {
	d = max(d, 0)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.buckets == nil {
		h.buckets = make(map[int]uint64)
	}
	h.buckets[bucketOf(d)]++
	if h.n == 0 || d < h.min {
		h.min = d
	}
	h.max = max(h.max, d)
	h.n++
	h.sum += d
}

// Count is the number of samples.
func (h *Histogram) Count() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

// Percentile returns the duration below or at which a fraction q (0..1) of
// the samples lie, within 0.5%; 0 for an empty histogram. It never reports
// less than the smallest or more than the largest sample, and q = 1 is the
// largest.
func (h *Histogram) Percentile(q float64) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == 0 {
		return 0
	}
	if q >= 1 {
		return h.max
	}
	return h.rankLocked(max(uint64(math.Ceil(q*float64(h.n))), 1))
}

// Rank returns the k-th smallest sample (k from 1), within 0.5%; the
// largest when k is beyond the count, 0 for an empty histogram.
func (h *Histogram) Rank(k uint64) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == 0 {
		return 0
	}
	if k >= h.n {
		return h.max
	}
	return h.rankLocked(max(k, 1))
}

func (h *Histogram) rankLocked(rank uint64) time.Duration {
	keys := make([]int, 0, len(h.buckets))
	for k := range h.buckets {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var seen uint64
	for _, k := range keys {
		seen += h.buckets[k]
		if seen >= rank {
			return min(max(bucketValue(k), h.min), h.max)
		}
	}
	return h.max
}

// Merge adds the samples of o to h.
func (h *Histogram) Merge(o *Histogram) {
	o.mu.Lock()
	s := o.snapshotLocked()
	o.mu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.addLocked(s)
}

// Summary is the usual read-out of a histogram, in milliseconds.
type Summary struct {
	Count uint64  `json:"count"`
	Min   float64 `json:"min_ms"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P99   float64 `json:"p99_ms"`
	P999  float64 `json:"p999_ms"`
	Max   float64 `json:"max_ms"`
}

// Summary reads the count, mean and percentiles of h.
func (h *Histogram) Summary() Summary {
	h.mu.Lock()
	n, sum, lo, hi := h.n, h.sum, h.min, h.max
	h.mu.Unlock()
	s := Summary{Count: n, Min: ms(lo), Max: ms(hi),
		P50: ms(h.Percentile(0.50)), P99: ms(h.Percentile(0.99)), P999: ms(h.Percentile(0.999))}
	if n > 0 {
		s.Mean = ms(sum / time.Duration(n))
	}
	return s
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// histJSON is a histogram in a report: the summary for people, the buckets
// (index → count, see bucketOf) and exact totals for merging.
type histJSON struct {
	Summary
	SumNs   int64          `json:"sum_ns"`
	MinNs   int64          `json:"min_ns"`
	MaxNs   int64          `json:"max_ns"`
	Buckets map[int]uint64 `json:"buckets,omitempty"`
}

func (h *Histogram) snapshotLocked() histJSON {
	s := histJSON{SumNs: int64(h.sum), MinNs: int64(h.min), MaxNs: int64(h.max), Buckets: make(map[int]uint64, len(h.buckets))}
	s.Count = h.n
	for k, v := range h.buckets {
		s.Buckets[k] = v
	}
	return s
}

func (h *Histogram) addLocked(s histJSON) {
	if s.Count == 0 {
		return
	}
	if h.buckets == nil {
		h.buckets = make(map[int]uint64)
	}
	for k, v := range s.Buckets {
		h.buckets[min(max(k, 0), maxBucket)] += v
	}
	if h.n == 0 || time.Duration(s.MinNs) < h.min {
		h.min = time.Duration(s.MinNs)
	}
	h.max = max(h.max, time.Duration(s.MaxNs))
	h.n += s.Count
	h.sum += time.Duration(s.SumNs)
}

// MarshalJSON writes the summary and the buckets.
func (h *Histogram) MarshalJSON() ([]byte, error) {
	h.mu.Lock()
	s := h.snapshotLocked()
	h.mu.Unlock()
	s.Summary = h.Summary()
	return json.Marshal(s)
}

// UnmarshalJSON reads what MarshalJSON wrote; the summary is recomputed
// from the buckets.
func (h *Histogram) UnmarshalJSON(b []byte) error {
	var s histJSON
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	var total uint64
	for _, v := range s.Buckets {
		total += v
	}
	if total != s.Count {
		return fmt.Errorf("histogram: %d samples in the buckets, count says %d", total, s.Count)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.buckets, h.n, h.sum, h.min, h.max = nil, 0, 0, 0, 0
	h.addLocked(s)
	return nil
}
