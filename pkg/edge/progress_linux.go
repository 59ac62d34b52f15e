package edge

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// peerAcked returns how many bytes the peer's TCP has acknowledged on nc
// since the connection began, from TCP_INFO. ok is false when nc is not a
// TCP socket the kernel can be asked about.
func peerAcked(nc net.Conn) (acked uint64, ok bool) {
	sc, isSys := nc.(syscall.Conn)
	if !isSys {
		return 0, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var info *unix.TCPInfo
	cerr := rc.Control(func(fd uintptr) { info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) })
	if cerr != nil || err != nil {
		return 0, false
	}
	return info.Bytes_acked, true
}
