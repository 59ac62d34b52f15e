package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

var blobTests = []test{
	{"RoundTrip", testBlobRoundTrip},
	{"Empty", testBlobEmpty},
	{"Unknown", testBlobUnknown},
	{"Expires", testBlobExpires},
	{"Copied", testBlobCopied},
	{"Concurrent", testBlobConcurrent},
}

func putBlob(t *testing.T, s store.Store, data []byte, ttl time.Duration) string {
	t.Helper()
	key, err := s.PutBlob(t.Context(), data, ttl)
	if err != nil {
		t.Fatalf("PutBlob(%d bytes): %v", len(data), err)
	}
	if key == "" {
		t.Fatal("PutBlob returned an empty key")
	}
	return key
}

func wantBlob(t *testing.T, s store.Store, key string, want []byte) {
	t.Helper()
	got, err := s.GetBlob(t.Context(), key)
	if err != nil {
		t.Fatalf("GetBlob: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("GetBlob = %q, want %q", abbrev(got), abbrev(want))
	}
}

func blobGone(t *testing.T, s store.Store, key string) bool {
	t.Helper()
	_, err := s.GetBlob(t.Context(), key)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("GetBlob: %v", err)
	}
	return err != nil
}

func testBlobRoundTrip(t *testing.T, s store.Store) {
	data := []byte("\x00binary\xffmedia")
	k1 := putBlob(t, s, data, time.Minute)
	k2 := putBlob(t, s, data, time.Minute)
	if k1 == k2 {
		t.Fatalf("two PutBlob calls returned the same key %q", k1)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	k3 := putBlob(t, s, big, time.Minute)
	wantBlob(t, s, k1, data)
	wantBlob(t, s, k1, data) // GetBlob does not consume
	wantBlob(t, s, k2, data)
	wantBlob(t, s, k3, big)
}

func testBlobEmpty(t *testing.T, s store.Store) {
	wantBlob(t, s, putBlob(t, s, nil, time.Minute), nil)
	wantBlob(t, s, putBlob(t, s, []byte{}, time.Minute), nil)
}

func testBlobUnknown(t *testing.T, s store.Store) {
	for _, key := range []string{name(t, "nope"), "0123456789abcdef0123456789abcdef", ""} {
		if got, err := s.GetBlob(t.Context(), key); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("GetBlob(%q) = %q, %v; want ErrNotFound", key, got, err)
		}
	}
}

func testBlobExpires(t *testing.T, s store.Store) {
	short := putBlob(t, s, []byte("short"), time.Second)
	long := putBlob(t, s, []byte("long"), time.Minute)
	wantBlob(t, s, short, []byte("short"))
	eventually(t, expiryWait, "blob stored for 1s is readable", func() bool { return blobGone(t, s, short) })
	wantBlob(t, s, long, []byte("long"))
}

func testBlobCopied(t *testing.T, s store.Store) {
	data := []byte("media")
	key := putBlob(t, s, data, time.Minute)
	copy(data, "XXXXX")
	got, err := s.GetBlob(t.Context(), key)
	if err != nil {
		t.Fatalf("GetBlob: %v", err)
	}
	if string(got) != "media" {
		t.Fatalf("GetBlob = %q after the caller changed its buffer, want %q", got, "media")
	}
	copy(got, "YYYYY")
	wantBlob(t, s, key, []byte("media"))
}

func testBlobConcurrent(t *testing.T, s store.Store) {
	const workers, each = 8, 10
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		keys = map[string]bool{}
	)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				data := fmt.Appendf(nil, "blob %d/%d", w, i)
				key, err := s.PutBlob(t.Context(), data, time.Minute)
				if err != nil {
					t.Errorf("PutBlob: %v", err)
					return
				}
				got, err := s.GetBlob(t.Context(), key)
				if err != nil || !bytes.Equal(got, data) {
					t.Errorf("GetBlob = %q, %v; want %q", got, err, data)
					return
				}
				mu.Lock()
				keys[key] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(keys) != workers*each {
		t.Fatalf("%d distinct keys for %d blobs", len(keys), workers*each)
	}
}
