//go:build linux

package localsock

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Perm is the mode and group a socket file is created with.
type Perm struct {
	// Mode is the socket file's permission bits (0600: its owner only).
	Mode fs.FileMode
	// Group, when HasGroup, is the group the file is given.
	HasGroup bool
	Group    uint32
}

// ErrInUse: a live process serves the socket path.
var ErrInUse = errors.New("localsock: socket path in use by a live process")

// maxPath is the longest path a Unix socket address holds.
const maxPath = 107

// Listener is a Unix socket listener created by Listen. Close removes the
// socket file.
type Listener struct {
	*net.UnixListener
	path string
	once sync.Once
}

// Close stops listening and removes the socket file.
func (l *Listener) Close() error {
	err := l.UnixListener.Close()
	l.once.Do(func() { os.Remove(l.path) })
	return err
}

// Path is the socket's path.
func (l *Listener) Path() string { return l.path }

// Listen binds a Unix socket of network "unix" or "unixpacket" at path with
// perm. A stale socket file left by a dead process is replaced; a live one
// is ErrInUse; any other file at path is an error.
//
// The socket is bound inside a new directory beside path that only this
// process's user can enter, given its mode and group there, and renamed
// into place, so it is never reachable with wider permissions.
func Listen(network, path string, perm Perm) (*Listener, error) {
	if perm.Mode&^fs.ModePerm != 0 {
		return nil, fmt.Errorf("localsock: socket mode %#o has bits beyond 0777", perm.Mode)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&fs.ModeSocket == 0 {
			return nil, fmt.Errorf("localsock: %s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout(network, path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("%w: %s", ErrInUse, path)
		}
	}
	dir, err := os.MkdirTemp(filepath.Dir(path), ".dsmd-")
	if err != nil {
		return nil, fmt.Errorf("localsock: socket %s: %w", path, err)
	}
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, "s")
	if len(tmp) > maxPath {
		return nil, fmt.Errorf("localsock: socket %s: the path is too long (a socket is created at %s first, and a Unix socket path has at most %d bytes)", path, tmp, maxPath)
	}
	ln, err := net.ListenUnix(network, &net.UnixAddr{Name: tmp, Net: network})
	if err != nil {
		return nil, fmt.Errorf("localsock: socket %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(false)
	fail := func(err error) (*Listener, error) {
		ln.Close()
		return nil, fmt.Errorf("localsock: socket %s: %w", path, err)
	}
	if perm.HasGroup {
		if err := os.Lchown(tmp, -1, int(perm.Group)); err != nil {
			return fail(err)
		}
	}
	if err := os.Chmod(tmp, perm.Mode); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(err)
	}
	return &Listener{UnixListener: ln, path: path}, nil
}

// Unreachable names the first directory above path that the members of
// group gid (or, without a group, nobody but its owner) cannot search, so
// that dsmd can warn that its socket group cannot reach the socket. It
// returns "" when every directory lets them through, or on any error.
func Unreachable(path string, hasGroup bool, gid uint32) string {
	dir := filepath.Dir(path)
	for {
		fi, err := os.Stat(dir)
		if err != nil {
			return ""
		}
		mode := fi.Mode().Perm()
		ok := mode&0o001 != 0
		if !ok && hasGroup && mode&0o010 != 0 {
			if g, gok := fileGID(fi); gok && g == gid {
				ok = true
			}
		}
		if !ok {
			return fmt.Sprintf("%s (mode %#o)", dir, mode)
		}
		parent := filepath.Dir(dir)
		if parent == dir || strings.TrimSpace(parent) == "" {
			return ""
		}
		dir = parent
	}
}
