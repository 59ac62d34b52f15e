package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/hermes-mobile/gateway/pkg/store"
)

var uploadTests = []test{
	{"PartialReturnsNil", testPartialReturnsNil},
	{"SinglePartFile", testSinglePartFile},
	{"AssemblesInIndexOrder", testAssemblesInIndexOrder},
	{"RepeatedIndexReplaces", testRepeatedIndexReplaces},
	{"RepeatedIndexAccounting", testRepeatedIndexAccounting},
	{"CountMismatchDiscards", testCountMismatchDiscards},
	{"MaxOpen", testMaxOpen},
	{"MaxBytes", testMaxBytes},
	{"MaxFileBytes", testMaxFileBytes},
	{"LimitsPerDevice", testLimitsPerDevice},
	{"DropUploadsOneConn", testDropUploadsOneConn},
	{"DataCopied", testUploadDataCopied},
	{"ConcurrentOpenLimit", testConcurrentOpenLimit},
	{"ConcurrentByteLimit", testConcurrentByteLimit},
	{"ConcurrentMixed", testConcurrentMixed},
	{"ConcurrentCompletion", testConcurrentCompletion},
}

// roomy limits that no upload test reaches unless it means to.
var roomy = store.UploadLimits{MaxOpen: 8, MaxFileBytes: 1 << 20, MaxBytes: 1 << 20}

// fill returns n bytes of c.
func fill(c byte, n int) []byte { return bytes.Repeat([]byte{c}, n) }

// part is a Part of upload id on device's conn "c1".
func part(device, id string, index, count int, data []byte) store.Part {
	return store.Part{Device: device, Conn: "c1", ID: id, Index: index, Count: count, Data: data}
}

// put stores p and fails t on an error.
func put(t *testing.T, s store.Store, p store.Part, lim store.UploadLimits) *store.Upload {
	t.Helper()
	up, err := s.PutPart(t.Context(), p, lim)
	if err != nil {
		t.Fatalf("PutPart(%s part %d/%d, %d bytes): %v", p.ID, p.Index, p.Count, len(p.Data), err)
	}
	return up
}

// putOpen stores p, which must not complete its file.
func putOpen(t *testing.T, s store.Store, p store.Part, lim store.UploadLimits) {
	t.Helper()
	if up := put(t, s, p, lim); up != nil {
		t.Fatalf("PutPart(%s part %d/%d) completed the file (%d bytes); want nil", p.ID, p.Index, p.Count, len(up.Data))
	}
}

// putDone stores p, which must complete its file with want.
func putDone(t *testing.T, s store.Store, p store.Part, lim store.UploadLimits, want []byte) *store.Upload {
	t.Helper()
	up := put(t, s, p, lim)
	if up == nil {
		t.Fatalf("PutPart(%s part %d/%d) = nil; want the completed file", p.ID, p.Index, p.Count)
	}
	if !bytes.Equal(up.Data, want) {
		t.Fatalf("file %s = %q, want %q", p.ID, abbrev(up.Data), abbrev(want))
	}
	return up
}

// putErr stores p, which must fail with want.
func putErr(t *testing.T, s store.Store, p store.Part, lim store.UploadLimits, want error) {
	t.Helper()
	up, err := s.PutPart(t.Context(), p, lim)
	if !errors.Is(err, want) {
		t.Fatalf("PutPart(%s part %d/%d, %d bytes) = %v, %v; want %v", p.ID, p.Index, p.Count, len(p.Data), up != nil, err, want)
	}
	if up != nil {
		t.Fatalf("PutPart returned a file with error %v", err)
	}
}

func wantBytes(t *testing.T, s store.Store, device string, want int) {
	t.Helper()
	got, err := s.UploadBytes(t.Context(), device)
	if err != nil {
		t.Fatalf("UploadBytes: %v", err)
	}
	if got != want {
		t.Fatalf("UploadBytes = %d, want %d", got, want)
	}
}

func abbrev(b []byte) string {
	if len(b) > 40 {
		return fmt.Sprintf("%s…(%d bytes)", b[:40], len(b))
	}
	return string(b)
}

func testPartialReturnsNil(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	wantBytes(t, s, dev, 0)
	putOpen(t, s, part(dev, "f1", 0, 2, []byte("hello")), roomy)
	wantBytes(t, s, dev, 5)
	putDone(t, s, part(dev, "f1", 1, 2, []byte(" world")), roomy, []byte("hello world"))
	wantBytes(t, s, dev, 0)
}

func testSinglePartFile(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	p := part(dev, "f1", 0, 1, []byte("whole"))
	p.Meta = []byte(`{"mime":"image/png"}`)
	up := putDone(t, s, p, roomy, []byte("whole"))
	if !bytes.Equal(up.Meta, p.Meta) {
		t.Fatalf("Meta = %q, want %q", up.Meta, p.Meta)
	}
	wantBytes(t, s, dev, 0)
}

func testAssemblesInIndexOrder(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	order := []int{3, 0, 4, 1, 2}
	sent := 0
	for i, idx := range order {
		p := part(dev, "f1", idx, len(order), fmt.Appendf(nil, "<%d>", idx))
		p.Meta = fmt.Appendf(nil, "meta-%d", idx)
		if i < len(order)-1 {
			putOpen(t, s, p, roomy)
			sent += len(p.Data)
			wantBytes(t, s, dev, sent)
			continue
		}
		up := putDone(t, s, p, roomy, []byte("<0><1><2><3><4>"))
		if string(up.Meta) != "meta-3" {
			t.Fatalf("Meta = %q, want the first part's %q", up.Meta, "meta-3")
		}
	}
	wantBytes(t, s, dev, 0)
	// The buffer is gone: the same file id starts over.
	putOpen(t, s, part(dev, "f1", 0, len(order), []byte("<0>")), roomy)
	wantBytes(t, s, dev, 3)
}

func testRepeatedIndexReplaces(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	putOpen(t, s, part(dev, "f1", 0, 2, []byte("aaaa")), roomy)
	putOpen(t, s, part(dev, "f1", 0, 2, []byte("bb")), roomy)
	wantBytes(t, s, dev, 2)
	putDone(t, s, part(dev, "f1", 1, 2, []byte("c")), roomy, []byte("bbc"))
	wantBytes(t, s, dev, 0)
}

func testRepeatedIndexAccounting(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	lim := store.UploadLimits{MaxOpen: 8, MaxFileBytes: 10, MaxBytes: 10}
	putOpen(t, s, part(dev, "f1", 0, 3, fill('a', 10)), lim)
	// Resending a part must not count its bytes twice.
	putOpen(t, s, part(dev, "f1", 0, 3, fill('b', 10)), lim)
	wantBytes(t, s, dev, 10)
	putOpen(t, s, part(dev, "f1", 0, 3, fill('c', 4)), lim)
	wantBytes(t, s, dev, 4)
	putOpen(t, s, part(dev, "f1", 1, 3, fill('d', 6)), lim)
	wantBytes(t, s, dev, 10)
	putOpen(t, s, part(dev, "f1", 1, 3, fill('e', 6)), lim)
	wantBytes(t, s, dev, 10)
	putDone(t, s, part(dev, "f1", 2, 3, nil), lim, []byte("cccceeeeee"))
	wantBytes(t, s, dev, 0)
}

func testCountMismatchDiscards(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	putOpen(t, s, part(dev, "f1", 0, 2, []byte("first")), roomy)
	putOpen(t, s, part(dev, "f2", 0, 2, []byte("other")), roomy)
	putErr(t, s, part(dev, "f1", 1, 3, []byte("x")), roomy, store.ErrUploadMismatch)
	wantBytes(t, s, dev, 5) // f1 discarded, f2 kept
	// f1 starts over: its part 0 is gone, so part 1 completes nothing.
	putOpen(t, s, part(dev, "f1", 1, 2, []byte("second")), roomy)
	putDone(t, s, part(dev, "f2", 1, 2, []byte("!")), roomy, []byte("other!"))
}

func testMaxOpen(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	lim := store.UploadLimits{MaxOpen: 3, MaxFileBytes: 100, MaxBytes: 1000}
	for i := range 3 {
		putOpen(t, s, part(dev, fmt.Sprint("f", i), 0, 3, fill(byte('a'+i), 10)), lim)
	}
	putErr(t, s, part(dev, "f3", 0, 3, fill('x', 10)), lim, store.ErrTooManyUploads)
	wantBytes(t, s, dev, 30)
	// The open uploads are intact and still take parts.
	for i := range 3 {
		putOpen(t, s, part(dev, fmt.Sprint("f", i), 1, 3, fill(byte('a'+i), 1)), lim)
	}
	wantBytes(t, s, dev, 33)
	putErr(t, s, part(dev, "f3", 0, 3, fill('x', 10)), lim, store.ErrTooManyUploads)
	putDone(t, s, part(dev, "f0", 2, 3, nil), lim, fill('a', 11))
	// A completed upload frees its slot.
	putOpen(t, s, part(dev, "f3", 0, 3, fill('x', 10)), lim)
	putDone(t, s, part(dev, "f1", 2, 3, nil), lim, fill('b', 11))
	putDone(t, s, part(dev, "f2", 2, 3, nil), lim, fill('c', 11))
	wantBytes(t, s, dev, 10)
}

func testMaxBytes(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	lim := store.UploadLimits{MaxOpen: 8, MaxFileBytes: 100, MaxBytes: 100}
	putOpen(t, s, part(dev, "a", 0, 3, fill('a', 60)), lim)
	putOpen(t, s, part(dev, "b", 0, 2, fill('b', 40)), lim)
	wantBytes(t, s, dev, 100) // exactly the limit
	// One byte more in a new upload: refused, nothing kept.
	putErr(t, s, part(dev, "c", 0, 2, fill('c', 1)), lim, store.ErrUploadTooBig)
	wantBytes(t, s, dev, 100)
	// One byte more in an open upload: that upload is discarded.
	putErr(t, s, part(dev, "a", 1, 3, fill('a', 1)), lim, store.ErrUploadTooBig)
	wantBytes(t, s, dev, 40)
	putOpen(t, s, part(dev, "a", 2, 3, fill('A', 1)), lim) // a starts over
	wantBytes(t, s, dev, 41)
	putDone(t, s, part(dev, "b", 1, 2, fill('b', 10)), lim, fill('b', 50))
	wantBytes(t, s, dev, 1)
}

func testMaxFileBytes(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	lim := store.UploadLimits{MaxOpen: 8, MaxFileBytes: 50, MaxBytes: 1000}
	putOpen(t, s, part(dev, "a", 0, 3, fill('a', 30)), lim)
	putOpen(t, s, part(dev, "a", 1, 3, fill('a', 20)), lim)
	wantBytes(t, s, dev, 50) // exactly the file limit
	putErr(t, s, part(dev, "a", 2, 3, fill('a', 1)), lim, store.ErrUploadTooBig)
	wantBytes(t, s, dev, 0)
	putOpen(t, s, part(dev, "a", 2, 3, fill('A', 1)), lim) // a starts over
	wantBytes(t, s, dev, 1)

	putErr(t, s, part(dev, "b", 0, 2, fill('b', 51)), lim, store.ErrUploadTooBig)
	wantBytes(t, s, dev, 1)
	putDone(t, s, part(dev, "c", 0, 1, fill('c', 50)), lim, fill('c', 50))
	putErr(t, s, part(dev, "d", 0, 1, fill('d', 51)), lim, store.ErrUploadTooBig)
	wantBytes(t, s, dev, 1)
}

func testLimitsPerDevice(t *testing.T, s store.Store) {
	d1, d2 := name(t, "dev1"), name(t, "dev2")
	lim := store.UploadLimits{MaxOpen: 2, MaxFileBytes: 200, MaxBytes: 200}
	putOpen(t, s, part(d1, "a", 0, 2, fill('a', 100)), lim)
	putOpen(t, s, part(d1, "b", 0, 2, fill('b', 100)), lim)
	// d1 is at both limits: a third upload breaks MaxOpen and MaxBytes.
	up, err := s.PutPart(t.Context(), part(d1, "c", 0, 2, fill('c', 1)), lim)
	if up != nil || !errors.Is(err, store.ErrTooManyUploads) && !errors.Is(err, store.ErrUploadTooBig) {
		t.Fatalf("PutPart beyond both limits = %v, %v; want ErrTooManyUploads or ErrUploadTooBig", up != nil, err)
	}
	// The same file ids, conn and limits on another device start from zero.
	putOpen(t, s, part(d2, "a", 0, 2, fill('A', 100)), lim)
	putOpen(t, s, part(d2, "b", 0, 2, fill('B', 100)), lim)
	wantBytes(t, s, d1, 200)
	wantBytes(t, s, d2, 200)
	putDone(t, s, part(d2, "a", 1, 2, nil), lim, fill('A', 100))
	putDone(t, s, part(d1, "a", 1, 2, nil), lim, fill('a', 100))
	wantBytes(t, s, d1, 100)
	wantBytes(t, s, d2, 100)
}

func testDropUploadsOneConn(t *testing.T, s store.Store) {
	d1, d2 := name(t, "dev1"), name(t, "dev2")
	on := func(device, conn, id string, index int, data string) store.Part {
		return store.Part{Device: device, Conn: conn, ID: id, Index: index, Count: 2, Data: []byte(data)}
	}
	putOpen(t, s, on(d1, "old", "u1", 0, "1111111111"), roomy)
	putOpen(t, s, on(d1, "old", "u2", 0, "22222222222222222222"), roomy)
	putOpen(t, s, on(d1, "new", "u3", 0, "333"), roomy)
	putOpen(t, s, on(d2, "old", "u4", 0, "4444"), roomy) // same conn name, other device
	if err := s.DropUploads(t.Context(), d1, "old"); err != nil {
		t.Fatalf("DropUploads: %v", err)
	}
	wantBytes(t, s, d1, 3)
	wantBytes(t, s, d2, 4)
	putOpen(t, s, on(d1, "old", "u1", 1, "x"), roomy) // u1 was freed: starts over
	putDone(t, s, on(d1, "new", "u3", 1, "!"), roomy, []byte("333!"))
	putDone(t, s, on(d2, "old", "u4", 1, "!"), roomy, []byte("4444!"))
	if err := s.DropUploads(t.Context(), name(t, "nobody"), "old"); err != nil {
		t.Fatalf("DropUploads of a device without uploads: %v", err)
	}
	if err := s.DropUploads(t.Context(), d1, "old"); err != nil {
		t.Fatalf("DropUploads: %v", err)
	}
	wantBytes(t, s, d1, 0)
}

func testUploadDataCopied(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	data, meta := []byte("abc"), []byte("meta")
	p := part(dev, "f1", 0, 2, data)
	p.Meta = meta
	putOpen(t, s, p, roomy)
	copy(data, "XYZ") // the caller reuses its buffers
	copy(meta, "XXXX")
	up := putDone(t, s, part(dev, "f1", 1, 2, []byte("d")), roomy, []byte("abcd"))
	if string(up.Meta) != "meta" {
		t.Fatalf("Meta = %q, want %q", up.Meta, "meta")
	}
}

// testConcurrentOpenLimit races more new uploads than MaxOpen: exactly
// MaxOpen are accepted.
func testConcurrentOpenLimit(t *testing.T, s store.Store) {
	const workers = 24
	dev := name(t, "dev")
	lim := store.UploadLimits{MaxOpen: 4, MaxFileBytes: 1000, MaxBytes: 10000}
	var accepted atomic.Int32
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			id := fmt.Sprint("f", i)
			for idx := range 2 {
				up, err := s.PutPart(t.Context(), part(dev, id, idx, 3, fill('x', 100)), lim)
				switch {
				case errors.Is(err, store.ErrTooManyUploads) && idx == 0:
					return
				case err != nil || up != nil:
					t.Errorf("PutPart(%s part %d) = %v, %v", id, idx, up != nil, err)
					return
				}
			}
			accepted.Add(1)
		})
	}
	wg.Wait()
	if got := accepted.Load(); got != int32(lim.MaxOpen) {
		t.Fatalf("%d uploads accepted, want MaxOpen = %d", got, lim.MaxOpen)
	}
	wantBytes(t, s, dev, lim.MaxOpen*200)
}

// testConcurrentByteLimit races more bytes than MaxBytes in new uploads:
// exactly MaxBytes are accepted and no reader ever sees more.
func testConcurrentByteLimit(t *testing.T, s store.Store) {
	const workers = 24
	dev := name(t, "dev")
	lim := store.UploadLimits{MaxOpen: 100, MaxFileBytes: 1000, MaxBytes: 1000}
	stop := watchBytes(t, s, dev, lim.MaxBytes)
	var accepted atomic.Int32
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			up, err := s.PutPart(t.Context(), part(dev, fmt.Sprint("f", i), 0, 2, fill('x', 100)), lim)
			switch {
			case errors.Is(err, store.ErrUploadTooBig):
			case err != nil || up != nil:
				t.Errorf("PutPart(f%d) = %v, %v", i, up != nil, err)
			default:
				accepted.Add(1)
			}
		})
	}
	wg.Wait()
	stop()
	if got := accepted.Load(); got != 10 {
		t.Fatalf("%d uploads of 100 bytes accepted under MaxBytes 1000, want 10", got)
	}
	wantBytes(t, s, dev, 1000)
}

// testConcurrentMixed races uploads that grow by random parts: the limits
// hold throughout and UploadBytes matches what the writers were told.
func testConcurrentMixed(t *testing.T, s store.Store) {
	const workers = 16
	dev := name(t, "dev")
	lim := store.UploadLimits{MaxOpen: 5, MaxFileBytes: 400, MaxBytes: 1000}
	stop := watchBytes(t, s, dev, lim.MaxBytes)
	held := make([]int, workers) // bytes each worker's upload holds at the end
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			id := fmt.Sprint("f", w)
			for idx := range 6 {
				n := 10 + rng.IntN(60)
				up, err := s.PutPart(t.Context(), part(dev, id, idx, 8, fill('x', n)), lim)
				switch {
				case errors.Is(err, store.ErrTooManyUploads), errors.Is(err, store.ErrUploadTooBig):
					held[w] = 0 // refused or discarded
					return
				case err != nil || up != nil:
					t.Errorf("PutPart(%s part %d) = %v, %v", id, idx, up != nil, err)
					return
				}
				held[w] += n
			}
		})
	}
	wg.Wait()
	stop()
	sum, open := 0, 0
	for _, n := range held {
		sum += n
		if n > 0 {
			open++
		}
	}
	if open > lim.MaxOpen {
		t.Fatalf("%d uploads open, MaxOpen %d", open, lim.MaxOpen)
	}
	wantBytes(t, s, dev, sum)
}

// testConcurrentCompletion races the parts of one file: exactly one writer
// gets the file, assembled in order.
func testConcurrentCompletion(t *testing.T, s store.Store) {
	const count = 16
	dev := name(t, "dev")
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		files []*store.Upload
	)
	var want []byte
	for i := range count {
		want = fmt.Appendf(want, "<%02d>", i)
	}
	for i := range count {
		wg.Go(func() {
			up, err := s.PutPart(t.Context(), part(dev, "f", i, count, fmt.Appendf(nil, "<%02d>", i)), roomy)
			if err != nil {
				t.Errorf("PutPart(part %d): %v", i, err)
			}
			if up != nil {
				mu.Lock()
				files = append(files, up)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(files) != 1 {
		t.Fatalf("%d writers got the file, want 1", len(files))
	}
	if !bytes.Equal(files[0].Data, want) {
		t.Fatalf("file = %q, want %q", files[0].Data, want)
	}
	wantBytes(t, s, dev, 0)
}

// watchBytes polls UploadBytes of device until the returned stop is called
// and fails t if it ever exceeds max.
func watchBytes(t *testing.T, s store.Store, device string, max int) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			n, err := s.UploadBytes(t.Context(), device)
			if err != nil {
				t.Errorf("UploadBytes: %v", err)
				return
			}
			if n > max {
				t.Errorf("UploadBytes = %d, above MaxBytes %d", n, max)
				return
			}
			select {
			case <-done:
				return
			default:
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}
