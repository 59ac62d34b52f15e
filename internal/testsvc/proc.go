package testsvc

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

// StartTimeout bounds how long a process may take to be ready.
const StartTimeout = 20 * time.Second

// Proc is a child process started by StartProc or Launch. Its stdout and
// stderr go, line by line, to a log function (t.Log, prefixed with the
// process name) and to the watchers; the last lines are kept for error
// messages.
type Proc struct {
	Name   string
	cmd    *exec.Cmd
	exited chan struct{} // closed once Wait returned
	err    error         // Wait's error, set before exited is closed

	mu      sync.Mutex
	log     func(string) // nil once the process is reaped
	partial []byte
	tail    []string
	watches []*watch
}

// watch waits for the first line that match accepts.
type watch struct {
	match func(line string) (string, bool)
	found chan string
}

const tailLines = 40

// StartProc starts path with args and env (added to the test's environment
// without the variables the services read, see Launch), its output going to
// t.Log, and waits until a line of it satisfies ready, returning what ready
// extracted (say, the URL it listens on); a nil ready does not wait. The
// process is stopped (Stop) when t ends.
func StartProc(t testing.TB, name, path string, args, env []string, ready func(line string) (string, bool)) (*Proc, string) {
	t.Helper()
	p, v, err := Launch(name, path, args, env, func(s string) { t.Log(s) }, ready)
	if p != nil {
		t.Cleanup(func() { p.Stop(t.Logf) })
	}
	if err != nil {
		t.Fatal(err)
	}
	return p, v
}

// Launch starts the process and waits for ready, as StartProc does, without
// a test: logf (nil: none) gets every line, and the caller stops the
// process. On an error the process, if it started (p is not nil), is still
// to be stopped. The environment is the test's without MOBILE_*, NATS_URL,
// REDIS_URL, REDIS_MODE, REDIS_PREFIX and AGENT, so the developer's shell
// cannot change what the tests start, plus env. On Linux the child is
// killed if the test binary dies first.
func Launch(name, path string, args, env []string, logf func(string), ready func(line string) (string, bool)) (*Proc, string, error) {
	p := &Proc{Name: name, exited: make(chan struct{}), log: logf}
	var w *watch
	if ready != nil {
		w = p.addWatch(ready)
	}
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
	if w == nil {
		return p, "", nil
	}
	select {
	case v := <-w.found:
		return p, v, nil
	case <-p.exited:
		return p, "", fmt.Errorf("%s exited before it was ready (%v); its last output:\n%s", name, p.err, p.LastLines())
	case <-time.After(Slack(StartTimeout)):
		return p, "", fmt.Errorf("%s was not ready within %v; its last output:\n%s", name, Slack(StartTimeout), p.LastLines())
	}
}

// cleanEnv is the environment without the variables the binaries read.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "MOBILE_"), k == "NATS_URL", k == "REDIS_URL", k == "REDIS_MODE", k == "REDIS_PREFIX", k == "AGENT":
			continue
		}
		env = append(env, kv)
	}
	return env
}

// Write implements io.Writer for the process's output.
func (p *Proc) Write(b []byte) (int, error) {
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

func (p *Proc) flushLocked() {
	if len(p.partial) > 0 {
		p.lineLocked(string(p.partial))
		p.partial = nil
	}
}

func (p *Proc) lineLocked(line string) {
	if p.log != nil {
		p.log(p.Name + ": " + line)
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

// Watch reports, on the returned channel, what match extracted from the
// first line from now on that it accepts.
func (p *Proc) Watch(match func(line string) (string, bool)) <-chan string {
	return p.addWatch(match).found
}

func (p *Proc) addWatch(match func(string) (string, bool)) *watch {
	w := &watch{match: match, found: make(chan string, 1)}
	p.mu.Lock()
	p.watches = append(p.watches, w)
	p.mu.Unlock()
	return w
}

// LastLines is the process's last lines of output.
func (p *Proc) LastLines() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.tail, "\n")
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited is closed once the process has exited and been reaped.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// ExitCode is the process's exit code once it exited (-1 when a signal
// ended it), or -1 while it runs.
func (p *Proc) ExitCode() int {
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode()
	default:
		return -1
	}
}

// Err is what waiting for the process returned (nil for exit code 0), once
// it exited; nil while it runs.
func (p *Proc) Err() error {
	select {
	case <-p.exited:
		return p.err
	default:
		return nil
	}
}

// Signal sends sig to the process.
func (p *Proc) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("%s: signal %v: %v", p.Name, sig, err)
	}
}

// WaitExit waits until the process has exited, failing t after limit
// (scaled by Slack).
func (p *Proc) WaitExit(t testing.TB, limit time.Duration) {
	t.Helper()
	WaitChan(t, limit, p.String()+" to exit", p.exited)
}

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Proc) Kill(t testing.TB) {
	t.Helper()
	p.Signal(t, syscall.SIGKILL)
	p.WaitExit(t, 10*time.Second)
}

// Freeze stops the process (SIGSTOP) and returns once every thread of it
// is stopped: it keeps its sockets open and answers nothing, as a hung
// process or a partition would.
func (p *Proc) Freeze(t testing.TB) {
	t.Helper()
	p.Signal(t, syscall.SIGSTOP)
	if err := WaitStopped(p.Pid()); err != nil {
		t.Fatalf("%s: %v", p.Name, err)
	}
}

// Thaw resumes a frozen process (SIGCONT).
func (p *Proc) Thaw(t testing.TB) {
	t.Helper()
	p.Signal(t, syscall.SIGCONT)
}

// Stop ends the process: SIGCONT (it may be frozen) and SIGTERM, SIGKILL if
// it is still there after 3 s; then waits, so no output reaches the log
// function afterwards. logf tells of a process that had to be killed. It is
// idempotent.
func (p *Proc) Stop(logf func(string, ...any)) {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGCONT) // fails only once it exited
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(3 * time.Second):
			if logf != nil {
				logf("%s: still running 3 s after SIGTERM; killing it", p.Name)
			}
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
	p.mu.Lock()
	p.log = nil
	p.mu.Unlock()
}

// String names the process and its pid.
func (p *Proc) String() string { return fmt.Sprintf("%s (pid %d)", p.Name, p.cmd.Process.Pid) }

// WaitStopped waits until process pid is stopped (SIGSTOP): kill returns
// before every thread of the process has stopped, and a test that means
// "while it is frozen" must not race that. It returns an error when the
// state cannot be read (no /proc) or the process does not stop within 10 s.
func WaitStopped(pid int) error {
	stopped := false
	var stat []byte
	var err error
	Eventually(10*time.Second, func() bool {
		stat, err = os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true
		}
		// "pid (comm) S …": the state follows the last ')'.
		i := bytes.LastIndexByte(stat, ')')
		stopped = i > 0 && i+2 < len(stat) && stat[i+2] == 'T'
		return stopped
	})
	switch {
	case err != nil:
		return err
	case !stopped:
		return fmt.Errorf("process %d did not stop within %v: %s", pid, Slack(10*time.Second), stat)
	}
	return nil
}

// exitedNow reports whether the process has exited and been reaped.
func (p *Proc) exitedNow() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL, unless the process exited, and waits until it is
// reaped.
func (p *Proc) kill() {
	if !p.exitedNow() {
		_ = p.cmd.Process.Kill() // fails only once it exited
	}
	<-p.exited
}
