package testsvc

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Server is a private redis-server or nats-server on a loopback port, that
// a test can kill, freeze and restart on the same port, as an outage of
// the real one would look to its clients. StartRedis and StartNATS make one
// for a test; NewRedis and NewNATS for a TestMain.
type Server struct {
	name  string
	bin   string
	port  int
	args  func(port int) []string
	ready func(addr string) error
	logf  func(string) // nil: the output is only kept (LastLines)

	mu   sync.Mutex
	proc *Proc // nil while stopped
	last *Proc // the latest process, for LastLines
}

// StartRedis starts a private redis-server on a free loopback port, without
// persistence unless extra (more redis-server arguments, such as
// "--appendonly", "yes") says otherwise, its files in a t.TempDir and its
// output in t.Log. It is killed when t ends. Without redis-server on PATH
// the test is skipped, or fails under CI.
func StartRedis(t testing.TB, extra ...string) *Server {
	t.Helper()
	s, err := newServer(t, "redis-server", redisArgs(t.TempDir(), extra), RedisPing, func(l string) { t.Log(l) })
	return started(t, s, err)
}

// StartNATS starts a private nats-server with JetStream on a free loopback
// port, its store in a t.TempDir and its output in t.Log; extra are more
// nats-server arguments. It is killed when t ends. Without nats-server on
// PATH the test is skipped, or fails under CI.
func StartNATS(t testing.TB, extra ...string) *Server {
	t.Helper()
	s, err := newServer(t, "nats-server", natsArgs(t.TempDir(), extra), NATSInfo, func(l string) { t.Log(l) })
	return started(t, s, err)
}

// NewRedis is StartRedis without a test: dir holds its files, its output is
// only kept (LastLines), and the caller kills it (Kill).
func NewRedis(dir string, extra ...string) (*Server, error) {
	return newServer(nil, "redis-server", redisArgs(dir, extra), RedisPing, nil)
}

// NewNATS is StartNATS without a test: dir holds the JetStream store, its
// output is only kept (LastLines), and the caller kills it (Kill).
func NewNATS(dir string, extra ...string) (*Server, error) {
	return newServer(nil, "nats-server", natsArgs(dir, extra), NATSInfo, nil)
}

func redisArgs(dir string, extra []string) func(int) []string {
	return func(port int) []string {
		return append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir}, extra...)
	}
}

func natsArgs(dir string, extra []string) func(int) []string {
	return func(port int) []string {
		return append([]string{"-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", dir}, extra...)
	}
}

// errNoBinary is what newServer returns without the server on PATH.
type errNoBinary struct{ name string }

func (e errNoBinary) Error() string {
	return "this test starts its own " + e.name + ": put it on PATH (apt-get install " + e.name + ")"
}

func newServer(t testing.TB, name string, args func(int) []string, ready func(string) error, logf func(string)) (*Server, error) {
	bin, err := exec.LookPath(name)
	if err != nil {
		return nil, errNoBinary{name}
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	s := &Server{name: name, bin: bin, port: port, args: args, ready: ready, logf: logf}
	if t != nil {
		t.Cleanup(s.Kill)
	}
	if err := s.Start(); err != nil {
		return nil, err
	}
	return s, nil
}

// started fails t on err, or skips it when the binary is missing (fails
// under CI).
func started(t testing.TB, s *Server, err error) *Server {
	t.Helper()
	if _, ok := err.(errNoBinary); ok && os.Getenv("CI") == "" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Port is the server's port; it stays the same across restarts.
func (s *Server) Port() int { return s.port }

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// URL is redis://host:port or nats://host:port.
func (s *Server) URL() string {
	if s.name == "redis-server" {
		return "redis://" + s.Addr()
	}
	return "nats://" + s.Addr()
}

// Start starts the stopped server on its port and waits until it answers
// (a Redis PING, a NATS INFO greeting). It fails when it is running.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		return fmt.Errorf("%s on %s is already running", s.name, s.Addr())
	}
	p, _, err := Launch(s.name, s.bin, s.args(s.port), nil, s.logf, nil)
	if err != nil {
		return err
	}
	s.proc, s.last = p, p
	var rerr error
	ok := Eventually(10*time.Second, func() bool {
		select {
		case <-p.Exited():
			return true
		default:
		}
		rerr = s.ready(s.Addr())
		return rerr == nil
	})
	select {
	case <-p.Exited():
		s.proc = nil
		return fmt.Errorf("%s on %s exited at start (%v); its last output:\n%s", s.name, s.Addr(), p.Err(), p.LastLines())
	default:
	}
	if !ok {
		return fmt.Errorf("%s on %s did not answer within %v: %v; its last output:\n%s", s.name, s.Addr(), Slack(10*time.Second), rerr, p.LastLines())
	}
	return nil
}

// Kill sends SIGKILL (a crash: nothing is flushed) and waits until the
// process is gone. It is idempotent, and a frozen server is killed too.
func (s *Server) Kill() {
	s.mu.Lock()
	p := s.proc
	s.proc = nil
	s.mu.Unlock()
	if p == nil {
		return
	}
	_ = p.cmd.Process.Kill() // fails only once it exited
	<-p.Exited()
	p.mu.Lock()
	p.log = nil
	p.mu.Unlock()
}

// Restart kills the server and starts it again on the same port.
func (s *Server) Restart() error {
	s.Kill()
	return s.Start()
}

// Proc is the running process, nil while the server is stopped.
func (s *Server) Proc() *Proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc
}

// Signal sends sig to the running server.
func (s *Server) Signal(sig syscall.Signal) error {
	p := s.Proc()
	if p == nil {
		return fmt.Errorf("%s on %s is not running", s.name, s.Addr())
	}
	return p.cmd.Process.Signal(sig)
}

// Freeze stops the server (SIGSTOP) and returns once it is stopped: it
// keeps its sockets open and answers nothing, as a hung server would.
func (s *Server) Freeze() error {
	if err := s.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	return WaitStopped(s.Proc().Pid())
}

// Thaw resumes a frozen server (SIGCONT).
func (s *Server) Thaw() error { return s.Signal(syscall.SIGCONT) }

// LastLines is the latest process's last lines of output.
func (s *Server) LastLines() string {
	s.mu.Lock()
	p := s.last
	s.mu.Unlock()
	if p == nil {
		return ""
	}
	return p.LastLines()
}

// RedisPing checks that a Redis at addr answers PING, without a client
// library.
func RedisPing(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second)) // a read past it fails below
	if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

// NATSInfo checks that a NATS server at addr greets with INFO.
func NATSInfo(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second)) // a read past it fails below
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "INFO ") {
		return fmt.Errorf("greeting %q", strings.TrimSpace(line))
	}
	return nil
}

// StartRedisForPrefix starts a private redis-server (StartRedis) whose one
// user may touch only the keys and channels under prefix and run no
// dangerous command, as an operator sharing one Redis between gateways
// grants it, and returns its URL with that user.
func StartRedisForPrefix(t testing.TB, prefix string) string {
	t.Helper()
	s := StartRedis(t,
		"--user", "default", "on", "nopass", "resetkeys", "-@all", "+ping", // the readiness check's PING
		"--user", "gw", "on", ">pw", "~"+prefix+"*", "&"+prefix+"*", "+@all", "-@dangerous")
	return "redis://gw:pw@" + s.Addr()
}
