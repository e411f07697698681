package tcp

import (
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// setUserTimeout sets TCP_USER_TIMEOUT on nc (Config.UserTimeout): data
// it sent that stays unacknowledged for d breaks the connection. d <= 0
// leaves the kernel's default. A failure is harmless (the connection only
// takes longer to break) and ignored.
func setUserTimeout(nc net.Conn, d time.Duration) {
	tc, ok := nc.(*net.TCPConn)
	if !ok || d <= 0 {
		return
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) {
		_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds()))
	})
}
