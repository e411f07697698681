//go:build linux

package localsock

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Cred is a local peer as the kernel recorded it when it connected.
type Cred struct {
	PID int32
	UID uint32
	GID uint32 // primary group
}

func (c Cred) String() string {
	return fmt.Sprintf("uid %d gid %d pid %d", c.UID, c.GID, c.PID)
}

// Identity is a peer with all its groups.
type Identity struct {
	Cred
	// Groups are the supplementary groups (from /proc/PID/status); nil
	// when they could not be read.
	Groups []uint32
}

// InGroup reports whether gid is the primary or a supplementary group.
func (id Identity) InGroup(gid uint32) bool {
	return id.GID == gid || slices.Contains(id.Groups, gid)
}

// InAnyGroup reports whether one of gids is a group of the peer.
func (id Identity) InAnyGroup(gids []uint32) bool {
	return slices.ContainsFunc(gids, id.InGroup)
}

// PeerCred reads SO_PEERCRED of a connected Unix socket.
func PeerCred(conn syscall.Conn) (Cred, error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return Cred{}, fmt.Errorf("localsock: peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		cred, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Cred{}, fmt.Errorf("localsock: peer credentials: %w", err)
	}
	if gerr != nil {
		return Cred{}, fmt.Errorf("localsock: peer credentials: %w", gerr)
	}
	return Cred{PID: cred.Pid, UID: cred.Uid, GID: cred.Gid}, nil
}

// ErrNoGroups: the Groups: line of a status file is missing or malformed.
var ErrNoGroups = errors.New("localsock: no Groups: line")

// ParseGroups reads the supplementary groups from the text of
// /proc/PID/status ("Groups:\t4 24 27 \n"; an empty list is "Groups:").
func ParseGroups(r io.Reader) ([]uint32, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "Groups:")
		if !ok {
			continue
		}
		gids := []uint32{}
		for _, f := range strings.Fields(rest) {
			g, err := strconv.ParseUint(f, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("%w: bad group %q", ErrNoGroups, f)
			}
			gids = append(gids, uint32(g))
		}
		return gids, nil
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("localsock: status: %w", err)
	}
	return nil, ErrNoGroups
}

// procRoot is where Groups reads /PID/status; tests point it elsewhere.
var procRoot = "/proc"

// Groups returns the supplementary groups of process pid.
func Groups(pid int32) ([]uint32, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("localsock: no pid to read groups of")
	}
	f, err := os.Open(fmt.Sprintf("%s/%d/status", procRoot, pid))
	if err != nil {
		return nil, fmt.Errorf("localsock: groups of pid %d: %w", pid, err)
	}
	defer f.Close()
	return ParseGroups(f)
}

// Identify reads the peer's credentials and supplementary groups. Groups
// is nil when they cannot be read (the process is gone): the peer is then
// judged by its uid and primary group alone.
func Identify(conn syscall.Conn) (Identity, error) {
	c, err := PeerCred(conn)
	if err != nil {
		return Identity{}, err
	}
	id := Identity{Cred: c}
	if g, err := Groups(c.PID); err == nil {
		id.Groups = g
	}
	return id, nil
}
