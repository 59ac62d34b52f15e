//go:build unix

package cluster

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// startTimeout bounds how long a process may take to say it is listening.
const startTimeout = 20 * time.Second

// proc is a child process. Its stdout and stderr go, line by line, to a log
// function (t.Log, prefixed with the process name) and to the watchers.
type proc struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{} // closed once Wait returned
	err    error         // Wait's error, set before exited is closed

	mu      sync.Mutex
	log     func(string) // nil once the process is reaped
	partial []byte
	tail    []string // the last lines, for error messages
	watches []*watch
}

// watch waits for the first line that match accepts.
type watch struct {
	match func(line string) (string, bool)
	found chan string
}

const tailLines = 40

// startProc starts path with args and env (added to a cleaned copy of the
// test's environment), its output going to t.Log, and waits until a line of
// it satisfies ready, returning what ready extracted (say, the URL it listens
// on). The process is stopped when the test ends.
func startProc(t testing.TB, name, path string, args, env []string, ready func(string) (string, bool)) (*proc, string) {
	t.Helper()
	p, v, err := launch(name, path, args, env, func(s string) { t.Log(s) }, ready)
	if p != nil {
		t.Cleanup(func() { p.stop(t.Logf) })
	}
	if err != nil {
		t.Fatal(err)
	}
	return p, v
}

// launch starts the process and waits for ready, as startProc does; logf
// (nil: none) gets every line. On an error the process, if it started, is
// still to be stopped.
func launch(name, path string, args, env []string, logf func(string), ready func(string) (string, bool)) (*proc, string, error) {
	p := &proc{name: name, exited: make(chan struct{}), log: logf}
	w := p.addWatch(ready)
	p.cmd = exec.Command(path, args...)
	p.cmd.Env = append(cleanEnv(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p, p
	p.cmd.WaitDelay = 5 * time.Second
	setProcAttr(p.cmd)
	if err := p.cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		err := p.cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.flushLocked()
		p.mu.Unlock()
		close(p.exited)
	}()
	select {
	case v := <-w.found:
		return p, v, nil
	case <-p.exited:
		return p, "", fmt.Errorf("%s exited before it was ready (%v); its last output:\n%s", name, p.err, p.lastLines())
	case <-time.After(startTimeout):
		return p, "", fmt.Errorf("%s was not ready within %v; its last output:\n%s", name, startTimeout, p.lastLines())
	}
}

// cleanEnv is the environment without the variables the binaries read, so
// the developer's shell cannot change what the tests start.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "MOBILE_"), k == "NATS_URL", k == "REDIS_URL", k == "REDIS_PREFIX", k == "AGENT":
			continue
		}
		env = append(env, kv)
	}
	return env
}

// Write implements io.Writer for the process's output.
func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.partial = append(p.partial, b...)
	for {
		i := bytes.IndexByte(p.partial, '\n')
		if i < 0 {
			break
		}
		p.lineLocked(string(p.partial[:i]))
		p.partial = p.partial[i+1:]
	}
	return len(b), nil
}

func (p *proc) flushLocked() {
	if len(p.partial) > 0 {
		p.lineLocked(string(p.partial))
		p.partial = nil
	}
}

func (p *proc) lineLocked(line string) {
	if p.log != nil {
		p.log(p.name + ": " + line)
	}
	p.tail = append(p.tail, line)
	if len(p.tail) > tailLines {
		p.tail = p.tail[len(p.tail)-tailLines:]
	}
	kept := p.watches[:0]
	for _, w := range p.watches {
		if v, ok := w.match(line); ok {
			w.found <- v
			continue
		}
		kept = append(kept, w)
	}
	p.watches = kept
}

// addWatch reports, on the returned watch's channel, the first line from now
// on that match accepts.
func (p *proc) addWatch(match func(string) (string, bool)) *watch {
	w := &watch{match: match, found: make(chan string, 1)}
	p.mu.Lock()
	p.watches = append(p.watches, w)
	p.mu.Unlock()
	return w
}

func (p *proc) lastLines() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.tail, "\n")
}

func (p *proc) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("%s: signal %v: %v", p.name, sig, err)
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill(t testing.TB) {
	t.Helper()
	p.signal(t, syscall.SIGKILL)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: still running 10 s after SIGKILL", p.name)
	}
}

// stop ends the process: SIGCONT (it may be stopped) and SIGTERM, SIGKILL
// if it is still there after 3 s; then waits, so no output reaches t.Log
// after the test. logf tells of a process that had to be killed.
func (p *proc) stop(logf func(string, ...any)) {
	select {
	case <-p.exited:
	default:
		p.cmd.Process.Signal(syscall.SIGCONT)
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(3 * time.Second):
			logf("%s: still running 3 s after SIGTERM; killing it", p.name)
			p.cmd.Process.Kill()
			<-p.exited
		}
	}
	p.mu.Lock()
	p.log = nil
	p.mu.Unlock()
}

// String names the process and its pid.
func (p *proc) String() string { return fmt.Sprintf("%s (pid %d)", p.name, p.cmd.Process.Pid) }
