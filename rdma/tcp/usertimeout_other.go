//go:build !linux

package tcp

import (
	"net"
	"time"
)

// setUserTimeout: TCP_USER_TIMEOUT is Linux's; elsewhere the kernel's
// retransmission limits break a stalled connection.
func setUserTimeout(net.Conn, time.Duration) {}
