package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

var contextTests = []test{
	{"Canceled", testContextCanceled},
}

// testContextCanceled calls every method with a canceled context: each
// returns an error wrapping context.Canceled, and a canceled Claim records
// nothing.
func testContextCanceled(t *testing.T, s store.Store) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	dev, key := name(t, "dev"), name(t, "key")
	calls := []struct {
		name string
		call func() error
	}{
		{"Claim", func() error { _, err := s.Claim(ctx, key, "a1", time.Minute); return err }},
		{"Release", func() error { return s.Release(ctx, key, "a1") }},
		{"Seen", func() error { _, err := s.Seen(ctx, key); return err }},
		{"PutPart", func() error { _, err := s.PutPart(ctx, part(dev, "f", 0, 2, []byte("x")), roomy); return err }},
		{"DropUploads", func() error { return s.DropUploads(ctx, dev, "c1") }},
		{"UploadBytes", func() error { _, err := s.UploadBytes(ctx, dev); return err }},
		{"PutPrompt", func() error { return s.PutPrompt(ctx, card(t, "p", dev, time.Now().Add(time.Hour))) }},
		{"TakePrompt", func() error { _, err := s.TakePrompt(ctx, name(t, "p"), dev); return err }},
		{"TakeExpired", func() error { _, err := s.TakeExpired(ctx, time.Now(), 10); return err }},
		{"ClaimDevice", func() error { _, err := s.ClaimDevice(ctx, dev, "edge-1", time.Minute); return err }},
		{"ClaimDeviceAcks", func() error { _, err := s.ClaimDeviceAcks(ctx, dev, "edge-1", time.Minute); return err }},
		{"SetDeviceAcks", func() error { return s.SetDeviceAcks(ctx, dev, time.Minute) }},
		{"DeviceOwner", func() error { _, err := s.DeviceOwner(ctx, dev); return err }},
		{"DeviceOwners", func() error { _, err := s.DeviceOwners(ctx, []string{dev}); return err }},
		{"RefreshDevices", func() error { _, err := s.RefreshDevices(ctx, map[string]int64{dev: 1}, time.Minute); return err }},
		{"ReleaseDevice", func() error { return s.ReleaseDevice(ctx, dev, 1) }},
		{"PushOutbox", func() error {
			_, err := s.PushOutbox(ctx, dev, []byte("x"), store.OutboxLimits{MaxItems: 10, TTL: time.Minute})
			return err
		}},
		{"PeekOutbox", func() error { _, err := s.PeekOutbox(ctx, dev, 0); return err }},
		{"AckOutbox", func() error { _, err := s.AckOutbox(ctx, dev, 1, 1); return err }},
		{"PutBlob", func() error { _, err := s.PutBlob(ctx, []byte("x"), time.Minute); return err }},
		{"GetBlob", func() error { _, err := s.GetBlob(ctx, "0123456789abcdef"); return err }},
		{"AppendHistory", func() error { return s.AppendHistory(ctx, dev, [][]byte{[]byte("x")}, roomyHistory) }},
		{"History", func() error { _, err := s.History(ctx, dev); return err }},
		{"AppendJournal", func() error { _, err := s.AppendJournal(ctx, dev, "r1", []byte("x"), jlim); return err }},
		{"NextJournal", func() error { _, _, err := s.NextJournal(ctx, dev, "r1", 0, time.Minute); return err }},
		{"RenewJournal", func() error { return s.RenewJournal(ctx, dev, "r1", time.Minute) }},
		{"ReleaseJournal", func() error { return s.ReleaseJournal(ctx, dev, "r1") }},
		{"TakeJournals", func() error { _, err := s.TakeJournals(ctx, "r1", time.Minute, 10); return err }},
		{"AddUsage", func() error {
			return s.AddUsage(ctx, map[string]store.UsageCounts{dev: {"n": 1}}, time.Now(), time.Minute)
		}},
		{"Usage", func() error { _, _, err := s.Usage(ctx, dev); return err }},
	}
	for _, c := range calls {
		if err := c.call(); !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a canceled context = %v, want context.Canceled", c.name, err)
		}
	}
	wantSeen(t, s, key, false)
}
