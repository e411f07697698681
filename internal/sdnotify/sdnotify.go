// Package sdnotify tells a service manager about the state of the process,
// the sd_notify(3) protocol of systemd: a datagram of newline-separated
// VAR=VALUE assignments ("READY=1", "STOPPING=1", "STATUS=...") sent to the
// Unix datagram socket named by $NOTIFY_SOCKET. A name that starts with '@'
// is a socket in the abstract namespace.
//
// Without $NOTIFY_SOCKET (dsmd not started by systemd with Type=notify, or
// in a container) Notify does nothing and reports false: a process must
// work the same with and without a service manager.
package sdnotify

import (
	"fmt"
	"net"
	"os"
	"strings"
)

// Env is the variable that names the socket.
const Env = "NOTIFY_SOCKET"

// The states dsmd sends.
const (
	// Ready: start-up is finished, the service serves.
	Ready = "READY=1"
	// Stopping: the service is shutting down.
	Stopping = "STOPPING=1"
	// Reloading: the service reloads its configuration; READY=1 follows.
	Reloading = "RELOADING=1"
)

// Status is a free-form line that systemctl status shows.
func Status(s string) string {
	return "STATUS=" + strings.ReplaceAll(s, "\n", " ")
}

// Notify sends the states, one per line, to the socket in $NOTIFY_SOCKET.
// It reports whether a message was sent; false with a nil error means no
// socket is configured.
func Notify(states ...string) (bool, error) {
	return NotifySocket(os.Getenv(Env), states...)
}

// NotifySocket sends the states to the socket at path ("" : nothing is sent;
// a leading '@' names an abstract socket).
func NotifySocket(path string, states ...string) (bool, error) {
	if path == "" {
		return false, nil
	}
	if path[0] != '/' && path[0] != '@' {
		return false, fmt.Errorf("sdnotify: $%s=%q is not a socket path (an absolute path or @abstract)", Env, path)
	}
	// On Linux, Go turns a leading '@' into the NUL of an abstract name.
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return false, fmt.Errorf("sdnotify: %w", err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(strings.Join(states, "\n"))); err != nil {
		return false, fmt.Errorf("sdnotify: %w", err)
	}
	return true, nil
}
