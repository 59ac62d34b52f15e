package main

import (
	"github.com/hermes-mobile/gateway/pkg/config"

	"bytes"
	"context"
	"flag"
	"strings"
	"testing"
	"time"
)

// parse reads args as the command line and returns the Config or its error.
func parse(t *testing.T, args ...string) (Config, error) {
	t.Helper()
	var f flagSet
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	f.RegisterFlags(fs)
	if err := config.Parse(fs, append([]string{"-token", "t"}, args...)); err != nil {
		t.Fatalf("flags %q: %v", args, err)
	}
	return f.Config()
}

func TestDefaultsAreValid(t *testing.T) {
	c, err := parse(t)
	if err != nil {
		t.Fatalf("the defaults are refused: %v", err)
	}
	if len(c.URLs) != 1 || c.URLs[0] != "ws://127.0.0.1:8787/ws" || c.RunID == "" {
		t.Errorf("defaults: %+v", c)
	}
}

func TestCapsAtTheBoundary(t *testing.T) {
	for _, c := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"-conns", "9000"}, true},
		{[]string{"-conns", "9001"}, false},
		{[]string{"-conns", "0"}, false},
		{[]string{"-rate", "20000"}, true},
		{[]string{"-rate", "20001"}, false},
		{[]string{"-rate", "0"}, true},
		{[]string{"-soak", "1h"}, true},
		{[]string{"-soak", "1h0m1s"}, false},
		{[]string{"-duration", "1h"}, true},
		{[]string{"-duration", "61m"}, false},
		{[]string{"-answer-wait", "1m"}, true},
		{[]string{"-answer-wait", "61s"}, false},
		{[]string{"-storm", "1"}, true},
		{[]string{"-storm", "1.01"}, false},
		{[]string{"-storm", "-0.1"}, false},
		{[]string{"-dial-concurrency", "1000"}, true},
		{[]string{"-dial-concurrency", "1001"}, false},
		{[]string{"-sources", "253"}, true},
		{[]string{"-sources", "254"}, false},
		{[]string{"-deliver", "http://127.0.0.1:8788", "-deliver-token", "d", "-deliver-rate", "2000"}, true},
		{[]string{"-deliver", "http://127.0.0.1:8788", "-deliver-token", "d", "-deliver-rate", "2001"}, false},
		{[]string{"-deliver", "http://127.0.0.1:8788"}, false}, // no token
		{[]string{"-run", "has space"}, false},
		{[]string{"-progress", "0s"}, true},
		{[]string{"-pace", "phone"}, true},
		{[]string{"-pace", "central"}, true},
		{[]string{"-pace", "phones"}, false},
		{[]string{"-progress", "-1ns"}, false},
	} {
		_, err := parse(t, c.args...)
		if (err == nil) != c.ok {
			t.Errorf("%q: error %v, want ok=%v", c.args, err, c.ok)
		}
	}
}

func TestLoopbackOnly(t *testing.T) {
	for _, c := range []struct {
		flag, url string
		ok        bool
	}{
		{"-url", "ws://127.0.0.1:8787/ws", true},
		{"-url", "ws://127.9.9.9:8787/ws", true},
		{"-url", "ws://[::1]:8787/ws", true},
		{"-url", "ws://localhost:8787/ws", true},
		{"-url", "wss://127.0.0.1/ws", true},
		{"-url", "ws://127.0.0.1:8787/ws,ws://10.0.0.1:8787/ws", false},
		{"-url", "ws://example.com/ws", false},
		{"-url", "ws://0.0.0.0:8787/ws", false},
		{"-url", "http://127.0.0.1:8787/ws", false},
		{"-metrics", "http://127.0.0.1:8789/metrics", true},
		{"-metrics", "http://192.168.1.2:8789/metrics", false},
		{"-metrics", "edge1=http://127.0.0.1:8789/metrics", true},
		{"-metrics", "edge1=http://192.168.1.2:8789/metrics", false},
	} {
		_, err := parse(t, c.flag, c.url)
		if (err == nil) != c.ok {
			t.Errorf("%s %s: error %v, want ok=%v", c.flag, c.url, err, c.ok)
		}
	}
	c, _ := parse(t)
	c.DeliverURL, c.DeliverToken = "http://10.1.1.1:8788", "d"
	if c.Validate() == nil {
		t.Error("a non-loopback router was accepted")
	}
}

func TestSourceAddressesSpread(t *testing.T) {
	c, err := parse(t, "-sources", "3")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for i := range 4 {
		got = append(got, c.sourceAddr(i, "ws://127.0.0.1:1/ws").String())
	}
	if strings.Join(got, " ") != "127.0.0.2 127.0.0.3 127.0.0.4 127.0.0.2" {
		t.Errorf("source addresses %v, want 127.0.0.2-4 in turn", got)
	}
	c.Sources = sourceCount
	if ip := c.sourceAddr(sourceCount-1, "ws://127.0.0.1:1/ws").String(); ip != "127.0.0.254" {
		t.Errorf("the last source address is %s, want 127.0.0.254", ip)
	}
	if a := c.sourceAddr(0, "ws://[::1]:1/ws"); a.IsValid() {
		t.Errorf("an IPv6 target got the source %v, want the system's choice", a)
	}
}

func TestUsageErrorsExitTwo(t *testing.T) {
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if code := realMain(ctx, []string{"-token", "t", "-conns", "9001"}, &out, &errOut); code != exitUsage {
		t.Errorf("exit status %d, want %d", code, exitUsage)
	}
	if !strings.Contains(errOut.String(), "-conns") {
		t.Errorf("stderr does not name -conns: %q", errOut.String())
	}
}
