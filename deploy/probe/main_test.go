package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestProbe: 2xx passes; any other status, a refused connection and a
// server slower than the timeout fail, saying why.
func TestProbe(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz":
			w.Write([]byte(`{"ok":true}`))
		case "/readyz":
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"ok":false}`))
		case "/slow":
			<-release
		}
	}))
	defer srv.Close()
	defer close(release)

	if err := probe(srv.URL+"/healthz", time.Second); err != nil {
		t.Fatalf("healthy: %v", err)
	}
	if err := probe(srv.URL+"/readyz", time.Second); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("503 answer: got %v, want an error naming 503", err)
	}
	start := time.Now()
	if err := probe(srv.URL+"/slow", 200*time.Millisecond); err == nil {
		t.Fatal("a server slower than the timeout passed")
	} else if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the probe took %v with a 200ms timeout", took)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/healthz"
	ln.Close()
	if err := probe(closed, time.Second); err == nil {
		t.Fatal("a closed port passed")
	}
}
