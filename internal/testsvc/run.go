package testsvc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// Buffer is an io.Writer safe for concurrent use. The zero Buffer works;
// one from NewBuffer also signals on Written after every write, so a test
// can wait for output.
type Buffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	written chan struct{}
}

// NewBuffer returns an empty Buffer.
func NewBuffer() *Buffer { return &Buffer{written: make(chan struct{}, 1)} }

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.b.Write(p)
	select {
	case s.written <- struct{}{}:
	default:
	}
	return n, err
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Written signals (at most one pending signal) after a write.
func (s *Buffer) Written() <-chan struct{} { return s.written }

// RunFunc is a command's run function: it serves until ctx ends.
type RunFunc func(ctx context.Context, stdout, stderr io.Writer) error

// Run starts run in the background and waits for the JSON log line whose
// msg is listening, returning its url attribute, the captured output, and a
// function that cancels run and returns its result (also called when t
// ends).
func Run(t *testing.T, listening string, run RunFunc) (url string, stdout, stderr *Buffer, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stdout, stderr = NewBuffer(), NewBuffer()
	result := make(chan error, 1)
	go func() { result <- run(ctx, stdout, stderr) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-result:
			case <-time.After(20 * time.Second):
				t.Errorf("run did not return within 20 s of the cancel; stderr:\n%s", stderr)
			}
		})
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	deadline := time.After(15 * time.Second)
	for {
		if url = ListeningURL(t, stderr.String(), listening); url != "" {
			return url, stdout, stderr, stop
		}
		select {
		case <-stderr.Written():
		case err := <-result:
			t.Fatalf("run returned %v before listening; stderr:\n%s", err, stderr)
		case <-deadline:
			t.Fatalf("no %q log line; stderr:\n%s", listening, stderr)
		}
	}
}

// ListeningURL returns the url attribute of the JSON log line whose msg is
// listening, or "" when logs has none yet.
func ListeningURL(t testing.TB, logs, listening string) string {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(logs))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasSuffix(line, "}") {
			continue // a line still being written
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %q: %v", line, err)
		}
		if rec["msg"] == listening {
			u, _ := rec["url"].(string)
			if u == "" {
				t.Fatalf("%q has no url: %q", listening, line)
			}
			return u
		}
	}
	return ""
}

// FreePort returns a TCP port on 127.0.0.1 that nothing listened on a
// moment ago and that no earlier FreePort call of this process returned.
// The kernel hands a port it just gave out to the next bind of port 0 as
// readily as any other (nine calls in a row repeat one about once in 200
// runs), so without the memory two servers of one cluster, or a server of
// one test and the port another test's killed server is to restart on,
// could be given the same port.
func FreePort() (int, error) {
	for range 100 {
		port, err := unusedPort()
		if err != nil {
			return 0, err
		}
		portsMu.Lock()
		again := handedOut[port]
		handedOut[port] = true
		hook := freePortHook
		portsMu.Unlock()
		if again {
			continue
		}
		if hook != nil {
			hook(port)
		}
		return port, nil
	}
	return 0, fmt.Errorf("FreePort: the kernel offered 100 ports in a row that this process had handed out already")
}

var (
	portsMu sync.Mutex
	// handedOut holds every port FreePort returned in this process.
	handedOut = map[int]bool{}
	// freePortHook, when set (by a test of this package, under portsMu),
	// sees each port FreePort is about to return: a test takes one so that
	// the server it was meant for cannot listen on it.
	freePortHook func(port int)
)

// unusedPort is a port the kernel finds free on 127.0.0.1 now.
func unusedPort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
