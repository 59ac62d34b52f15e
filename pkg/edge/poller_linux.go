//go:build linux

package edge

import (
	"errors"
	"net"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// poller tells when an idle socket has data, so that no goroutine waits on a
// socket that has nothing to say. Each socket is registered one-shot: after
// an event, onReadable runs in a new goroutine and the socket is not watched
// again until it calls resume. The Go runtime keeps doing the actual I/O on
// the socket; epoll here only wakes us up.
type poller struct {
	epfd int

	mu      sync.Mutex
	entries map[int32]*pollEntry // by fd
	gen     uint32               // tells a reused fd from the one it replaced
}

type pollEntry struct {
	fd         int32
	gen        uint32
	onReadable func()
}

// errNotPollable: the connection has no file descriptor (not a TCP socket);
// the caller falls back to a reading goroutine.
var errNotPollable = errors.New("edge: connection cannot be polled")

// sharedPoller is the process's one poller: one epoll instance and one
// waiting goroutine serve every edge server in the process.
var sharedPoller = sync.OnceValues(newPoller)

func newPoller() (*poller, error) {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	p := &poller{epfd: fd, entries: make(map[int32]*pollEntry)}
	go p.wait()
	return p, nil
}

const pollEvents = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT

// add watches c: onReadable runs (in its own goroutine) once per
// readiness. setEntry receives the registration before the first event can
// fire, so onReadable always sees it.
func (p *poller) add(c net.Conn, setEntry func(*pollEntry), onReadable func()) error {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return errNotPollable
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return errNotPollable
	}
	var fd int32 = -1
	if err := raw.Control(func(f uintptr) { fd = int32(f) }); err != nil || fd < 0 {
		return errNotPollable
	}
	p.mu.Lock()
	p.gen++
	e := &pollEntry{fd: fd, gen: p.gen, onReadable: onReadable}
	p.entries[fd] = e
	setEntry(e) // under p.mu: wait() takes it before it runs onReadable
	p.mu.Unlock()
	ev := unix.EpollEvent{Events: pollEvents, Fd: fd, Pad: int32(e.gen)}
	if err := unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, int(fd), &ev); err != nil {
		p.forget(e)
		return err
	}
	return nil
}

// resume arms e for one more event. It does nothing once e was removed: its
// fd may already belong to another socket.
func (p *poller) resume(e *pollEntry) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.entries[e.fd] != e {
		return errNotPollable
	}
	ev := unix.EpollEvent{Events: pollEvents, Fd: e.fd, Pad: int32(e.gen)}
	return unix.EpollCtl(p.epfd, unix.EPOLL_CTL_MOD, int(e.fd), &ev)
}

// remove stops watching e; call it before closing the socket so a reused fd
// is never mistaken for this one.
func (p *poller) remove(e *pollEntry) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.forgetLocked(e) {
		_ = unix.EpollCtl(p.epfd, unix.EPOLL_CTL_DEL, int(e.fd), nil)
	}
}

func (p *poller) forget(e *pollEntry) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.forgetLocked(e)
}

func (p *poller) forgetLocked(e *pollEntry) bool {
	if p.entries[e.fd] == e {
		delete(p.entries, e.fd)
		return true
	}
	return false
}

func (p *poller) wait() {
	events := make([]unix.EpollEvent, 256)
	for {
		n, err := unix.EpollWait(p.epfd, events, -1)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return // closed
		}
		p.mu.Lock()
		for i := 0; i < n; i++ {
			e := p.entries[events[i].Fd]
			if e != nil && e.gen == uint32(events[i].Pad) {
				go e.onReadable()
			}
		}
		p.mu.Unlock()
	}
}
