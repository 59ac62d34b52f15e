package main

import (
	"os"
	"strings"
	"testing"
)

// jwt.io's HS256 example under "your-256-bit-secret": the signature any
// JWT library, Centrifugo's too, computes for it.
func TestHS256KnownVector(t *testing.T) {
	const unsigned = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9." +
		"eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ"
	if got := hs256Signature("your-256-bit-secret", unsigned); got != "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c" {
		t.Fatalf("signature %s", got)
	}
}

// hs256 writes the same header, the claims as JSON (keys sorted) and their
// signature.
func TestHS256Token(t *testing.T) {
	got := hs256("your-256-bit-secret", map[string]any{"sub": "1234567890", "name": "John Doe", "iat": 1516239022})
	const unsigned = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9." +
		"eyJpYXQiOjE1MTYyMzkwMjIsIm5hbWUiOiJKb2huIERvZSIsInN1YiI6IjEyMzQ1Njc4OTAifQ"
	if want := unsigned + "." + hs256Signature("your-256-bit-secret", unsigned); got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

func TestRatioOf(t *testing.T) {
	for _, c := range []struct {
		a, b float64
		want string
	}{
		{6025, 7062, "0.85"},
		{4, 2, "2.00"},
		{0, 7062, "–"}, // nothing achieved: no ratio
		{-1, 1.5, "–"}, // a miss
		{1.5, -1, "–"}, // the other's miss
		{10, 0, "–"},   // nothing to divide by
	} {
		if got := ratioOf(c.a, c.b); got != c.want {
			t.Errorf("ratioOf(%g, %g) = %q, want %q", c.a, c.b, got, c.want)
		}
	}
}

func TestSideBySideRatiosPerTarget(t *testing.T) {
	row := sbsRow{values: [][]float64{{0.6, 4.0}, {0.4, 2.0}, {0.3, -1}}}
	got := row.ratios()
	if len(got) != 2 || got[0] != "1.50 / 2.00" || got[1] != "2.00 / –" {
		t.Fatalf("ratios = %q", got)
	}
}

func TestParseTarget(t *testing.T) {
	tg, err := parseTarget("centrifugo-redis=centrifugo,ws://127.0.0.1:8000/connection/websocket,http://127.0.0.1:8000/")
	if err != nil || tg.Name != "centrifugo-redis" || tg.API != "http://127.0.0.1:8000" {
		t.Fatalf("got %+v, %v", tg, err)
	}
	for _, bad := range []string{
		"x=gateway,ws://127.0.0.1:1/ws",                       // no API
		"x=nats,ws://127.0.0.1:1/ws,http://127.0.0.1:2",       // no such kind
		"x=gateway,ws://10.0.0.1:1/ws,http://127.0.0.1:2",     // not loopback
		"gateway,ws://127.0.0.1:1/ws,http://127.0.0.1:2,more", // no name
		"x=floor,ws://127.0.0.1:1/ws,http://127.0.0.1:2",      // a floor has no API
		"x=gateway,ws://127.0.0.1:1/ws,-",                     // a gateway has one
	} {
		if _, err := parseTarget(bad); err == nil {
			t.Errorf("parseTarget(%q) accepted it", bad)
		}
	}
}

func TestParseTargetPids(t *testing.T) {
	tg, err := parseTarget("g=gateway,ws://127.0.0.1:1/ws,http://127.0.0.1:2,12+345")
	if err != nil || len(tg.Pids) != 2 || tg.Pids[0] != 12 || tg.Pids[1] != 345 {
		t.Fatalf("got %+v, %v", tg, err)
	}
	for _, bad := range []string{"g=gateway,ws://127.0.0.1:1/ws,http://127.0.0.1:2,12+x", "g=gateway,ws://127.0.0.1:1/ws,http://127.0.0.1:2,0"} {
		if _, err := parseTarget(bad); err == nil {
			t.Errorf("parseTarget(%q) accepted it", bad)
		}
	}
}

// TestCPUSecondsCountsWork: this process's CPU, read as a target's, grows
// by at least the work done between two readings.
func TestCPUSecondsCountsWork(t *testing.T) {
	pids := []int{os.Getpid()}
	before, err := cpuSeconds(pids)
	if err != nil {
		t.Fatal(err)
	}
	for round := 0; ; round++ {
		if round > 100_000 {
			t.Fatal("no CPU time counted for a busy loop")
		}
		after, err := cpuSeconds(pids)
		if err != nil {
			t.Fatal(err)
		}
		if after-before >= 0.05 {
			break
		}
		x := 0
		for i := range 1_000_000 {
			x ^= i * i
		}
		_ = x
	}
	if _, err := cpuSeconds([]int{1 << 30}); err == nil {
		t.Error("a process that does not exist has a CPU time")
	}
}

func TestParseTargetFloor(t *testing.T) {
	tg, err := parseTarget("floor=floor,ws://127.0.0.1:8000/ws,-")
	if err != nil || tg.Kind != "floor" || tg.WS != "ws://127.0.0.1:8000/ws" {
		t.Fatalf("got %+v, %v", tg, err)
	}
}

// TestSideBySideFloorTakesTheHelloPathOnly: a floor target opens its
// sockets on a real floor, is in the table's hello row, and is sent no
// delivery (it has no API): its delivery rows are unknown, not failures.
func TestSideBySideFloorTakesTheHelloPathOnly(t *testing.T) {
	f := startTestFloor(t)
	var out, errs strings.Builder
	code := sbsMain(testCtx(t), []string{"-target", "floor=floor," + f.URL() + ",-", "-token", testToken,
		"-conns", "20", "-held", "5", "-rates", "100", "-batch-rates", "100", "-step", "1s", "-sources", "1"}, &out, &errs)
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, errs.String())
	}
	if !strings.Contains(errs.String(), "floor: 20 of 20 ready") {
		t.Errorf("the floor's sockets did not all open:\n%s", errs.String())
	}
	for line := range strings.Lines(out.String()) {
		if strings.HasPrefix(line, "single at 100/s") && !strings.Contains(line, "–") {
			t.Errorf("the floor was sent deliveries: %q", line)
		}
		if strings.Contains(line, "miss ") || strings.HasSuffix(strings.TrimSpace(line), "miss") {
			t.Errorf("a step the floor did not run reads as missed: %q", line)
		}
	}
}
