// Package sockaddr holds the address rules shared by dsmctl and the dsm
// library: how an address names a Unix socket or a TCP endpoint, and how a
// failure to reach it is said in words.
package sockaddr

import (
	"context"
	"errors"
	"net"
	"strings"
	"syscall"
)

// Split turns an address into a network and an address: unix:///path,
// unix:path and anything with a slash or without a colon are Unix socket
// paths; tcp://host:port and the rest are TCP.
func Split(addr string) (network, address string) {
	switch {
	case strings.HasPrefix(addr, "unix://"):
		return "unix", strings.TrimPrefix(addr, "unix://")
	case strings.HasPrefix(addr, "unix:"):
		return "unix", strings.TrimPrefix(addr, "unix:")
	case strings.HasPrefix(addr, "tcp://"):
		return "tcp", strings.TrimPrefix(addr, "tcp://")
	case strings.Contains(addr, "/") || !strings.Contains(addr, ":"):
		return "unix", addr
	}
	return "tcp", addr
}

// DialReason says in words (one line) why a socket could not be reached.
func DialReason(err error) string {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ENOENT):
		return "no socket there"
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return "permission denied (run as a member of the socket's group)"
	case errors.Is(err, context.DeadlineExceeded):
		return "connection timed out"
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		err = op.Err
	}
	return strings.Join(strings.Fields(err.Error()), " ")
}
