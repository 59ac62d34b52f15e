//go:build unix

package fault

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// startTimeout bounds how long a process may take to say it is ready.
const startTimeout = 20 * time.Second

// proc is a child process. Its output goes, line by line, to a log file
// and to the watchers.
type proc struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{} // closed once Wait returned
	err    error         // Wait's error, set before exited is closed

	mu      sync.Mutex
	log     io.Writer
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

// launch starts path with args and env (added to a cleaned copy of the
// test's environment), its output going to log, and waits until a line of
// it satisfies ready (nil: returns at once), returning what ready extracted.
// On an error the process, if it started, is still to be stopped.
func launch(name, path string, args, env []string, log io.Writer, ready func(string) (string, bool)) (*proc, string, error) {
	p := &proc{name: name, exited: make(chan struct{}), log: log}
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
		return p, "", fmt.Errorf("%s exited before it was ready (%v); its last output:\n%s", name, p.err, p.lastLines())
	case <-time.After(startTimeout):
		return p, "", fmt.Errorf("%s was not ready within %v; its last output:\n%s", name, startTimeout, p.lastLines())
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
		fmt.Fprintf(p.log, "%s %s: %s\n", time.Now().UTC().Format("15:04:05.000"), p.name, line)
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

func (p *proc) signal(sig syscall.Signal) error {
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("%s: signal %v: %w", p.name, sig, err)
	}
	return nil
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill() error {
	if err := p.signal(syscall.SIGKILL); err != nil {
		return err
	}
	select {
	case <-p.exited:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s: still running 10 s after SIGKILL", p.name)
	}
}

// stop ends the process: SIGCONT (it may be stopped) and SIGTERM, SIGKILL
// if it is still there after 3 s; then waits.
func (p *proc) stop() {
	select {
	case <-p.exited:
	default:
		p.cmd.Process.Signal(syscall.SIGCONT)
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(3 * time.Second):
			p.cmd.Process.Kill()
			<-p.exited
		}
	}
}

func (p *proc) String() string { return fmt.Sprintf("%s (pid %d)", p.name, p.cmd.Process.Pid) }
