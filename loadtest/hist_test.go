package main

import (
	"encoding/json"
	"math"
	"testing"
	"time"
)

// within reports whether got is within 0.5% of want (a bucket's half width).
func within(got, want time.Duration) bool {
	return math.Abs(float64(got-want)) <= 0.005*float64(want)+1
}

func TestPercentilesOfAUniformRange(t *testing.T) {
	var h Histogram
	for i := 1; i <= 1000; i++ {
		h.Record(time.Duration(i) * time.Millisecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{
		{0.50, 500 * time.Millisecond},
		{0.99, 990 * time.Millisecond},
		{0.999, 999 * time.Millisecond},
		{0.001, 1 * time.Millisecond},
	} {
		if got := h.Percentile(c.q); !within(got, c.want) {
			t.Errorf("p%g = %v, want %v ±0.5%%", c.q*100, got, c.want)
		}
	}
	if got := h.Percentile(1); got != time.Second {
		t.Errorf("p100 = %v, want exactly the largest sample, 1s", got)
	}
	s := h.Summary()
	if s.Count != 1000 || s.Min != 1 || s.Max != 1000 || math.Abs(s.Mean-500.5) > 1e-9 {
		t.Errorf("summary = %+v, want count 1000, min 1, max 1000, mean 500.5 ms", s)
	}
}

func TestPercentilesAtTheTail(t *testing.T) {
	// 999 fast samples and one slow one: p99.9 is the 999th sample, still
	// fast; only the largest is slow.
	var h Histogram
	for range 999 {
		h.Record(2 * time.Millisecond)
	}
	h.Record(3 * time.Second)
	if got := h.Percentile(0.999); !within(got, 2*time.Millisecond) {
		t.Errorf("p99.9 = %v, want 2ms: 999 of 1000 samples are 2ms", got)
	}
	// One more slow sample moves the 999th of 1001 ranks (ceil) onto it.
	h.Record(3 * time.Second)
	if got := h.Percentile(0.999); !within(got, 3*time.Second) {
		t.Errorf("p99.9 of 1001 samples = %v, want 3s (rank 1000 is slow)", got)
	}
}

func TestPercentileNeverLeavesTheSampleRange(t *testing.T) {
	var h Histogram
	h.Record(1234567 * time.Nanosecond)
	for _, q := range []float64{0, 0.5, 0.999, 1} {
		if got := h.Percentile(q); got != 1234567*time.Nanosecond {
			t.Errorf("p%g of one sample = %v, want that sample", q*100, got)
		}
	}
	var empty Histogram
	if got := empty.Percentile(0.5); got != 0 {
		t.Errorf("p50 of nothing = %v, want 0", got)
	}
	if s := empty.Summary(); s != (Summary{}) {
		t.Errorf("summary of nothing = %+v, want zeros", s)
	}
}

func TestBucketsAreOnePercentWide(t *testing.T) {
	if got := bucketOf(999 * time.Nanosecond); got != 0 {
		t.Errorf("bucket of 999ns = %d, want 0 (under 1µs)", got)
	}
	if got := bucketOf(time.Microsecond); got != 1 {
		t.Errorf("bucket of 1µs = %d, want 1", got)
	}
	if a, b := bucketOf(100*time.Millisecond), bucketOf(101*time.Millisecond+time.Microsecond); b != a+1 {
		t.Errorf("100ms and 101.001ms are buckets %d and %d, want neighbours", a, b)
	}
	if got := bucketOf(100 * time.Hour); got != maxBucket {
		t.Errorf("bucket of 100h = %d, want the last, %d", got, maxBucket)
	}
	if got := bucketOf(time.Hour); got >= maxBucket {
		t.Errorf("bucket of 1h = %d, want below the cap %d", got, maxBucket)
	}
}

func TestMergeEqualsRecordingEverything(t *testing.T) {
	var a, b, all Histogram
	for i := range 5000 {
		d := time.Duration(i*i) * time.Microsecond
		all.Record(d)
		if i%3 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
	}
	a.Merge(&b)
	if a.Summary() != all.Summary() {
		t.Errorf("merged %+v, want %+v", a.Summary(), all.Summary())
	}
}

func TestHistogramJSONRoundTrip(t *testing.T) {
	var h Histogram
	for i := 1; i <= 300; i++ {
		h.Record(time.Duration(i) * 37 * time.Microsecond)
	}
	b, err := json.Marshal(&h)
	if err != nil {
		t.Fatal(err)
	}
	var back Histogram
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Summary() != h.Summary() {
		t.Errorf("after JSON %+v, want %+v", back.Summary(), h.Summary())
	}
	var bad Histogram
	if err := json.Unmarshal([]byte(`{"count":3,"buckets":{"10":2}}`), &bad); err == nil {
		t.Error("a histogram whose buckets do not add up to its count was accepted")
	}
}
