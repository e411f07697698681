//go:build ofi

package ofi

/*
#include "fab.h"
*/
import "C"

import (
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"unsafe"
)

// shmPrefix starts the name of every shm endpoint this package opens:
// "dsm_ofi_<pid>_<node>_<seq>". The shm provider keeps a file of that name
// in /dev/shm while the endpoint is open and leaves it behind when the
// process dies, so Listen removes the files of processes that are gone.
const shmPrefix = "dsm_ofi_"

const shmDir = "/dev/shm"

func isShm(prov string) bool { return prov == "shm" }

// cleanStaleShm removes the shm files of endpoints whose process is dead.
func cleanStaleShm(log *slog.Logger) {
	ents, err := os.ReadDir(shmDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		name := e.Name()
		rest, ok := strings.CutPrefix(name, shmPrefix)
		if !ok {
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "_")
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid <= 0 || processAlive(pid) {
			continue
		}
		if err := os.Remove(filepath.Join(shmDir, name)); err == nil {
			log.Info("ofi: removed stale shm endpoint file", "file", name)
		}
	}
}

func processAlive(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return err == nil
}

// processRuns reports whether process pid exists and has not exited (a
// zombie, killed and not yet reaped by its parent, has).
func processRuns(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !os.IsNotExist(err)
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || (s[i+2] != 'Z' && s[i+2] != 'X')
}

// removeShm removes this endpoint's own file if the provider left it.
func removeShm(name string) {
	_ = os.Remove(filepath.Join(shmDir, name))
}

// shmLife is the liveness of an shm endpoint of this process. The shm
// provider of libfabric 1.17 reaches an endpoint of the same process
// through that endpoint's own mapping, so a send to it after it closed
// touches unmapped memory and crashes the process. Senders hold mu shared
// around each call into the provider; Close takes it exclusively.
type shmLife struct {
	mu     sync.RWMutex
	closed bool
}

// shmLocal is the registry of this process's shm endpoints. The shm
// provider of libfabric 1.17 maps the region of an endpoint once per
// process, and the progress of an endpoint reads the region header of
// every peer it knows: when an endpoint of the same process closes (and
// unmaps its region), the others fault in fi_cq_read (measured: the pid
// check at the start of the peer's region, about one run of the
// conformance suite in fifteen). So a closed shm endpoint is parked, its
// region left mapped, until no shm endpoint of the process is open, and
// only then closed for good.
var shmLocal = struct {
	sync.Mutex
	m      map[string]*shmLife
	live   int          // endpoints opened and not yet closed
	parked []*Transport // closed endpoints waiting for live to reach 0
}{m: map[string]*shmLife{}}

// shmPark retires an endpoint (nil when it never opened): it is closed for
// good, with every other parked one, once no shm endpoint of the process
// remains open. keep leaves it open for ever (a peer may still write into
// its region).
func shmPark(t *Transport, keep bool) {
	shmLocal.Lock()
	defer shmLocal.Unlock()
	shmLocal.live--
	if t != nil && !keep {
		shmLocal.parked = append(shmLocal.parked, t)
	}
	if shmLocal.live > 0 {
		return
	}
	for _, p := range shmLocal.parked {
		p.closeC()
	}
	shmLocal.parked = nil
}

// shmOpen registers an endpoint of this process as open.
func shmOpen(name string) {
	l := &shmLife{}
	shmLocal.Lock()
	shmLocal.m[name] = l
	shmLocal.live++
	shmLocal.Unlock()
}

// shmShut marks an endpoint of this process closed and forgets it.
func shmShut(name string) {
	shmLocal.Lock()
	l := shmLocal.m[name]
	delete(shmLocal.m, name)
	shmLocal.Unlock()
	if l != nil {
		l.mu.Lock()
		l.closed = true
		l.mu.Unlock()
	}
}

// shmPeerLife returns the liveness of the endpoint an shm address names
// when it belongs to this process (a closed one if it is not open), and
// nil for endpoints of other processes.
func shmPeerLife(name []byte) *shmLife {
	s := strings.TrimSuffix(string(name), "\x00")
	s = strings.TrimPrefix(s, "fi_shm://")
	own := shmPrefix + strconv.Itoa(os.Getpid()) + "_"
	if !strings.HasPrefix(s, own) {
		return nil
	}
	shmLocal.Lock()
	defer shmLocal.Unlock()
	if l := shmLocal.m[s]; l != nil {
		return l
	}
	return &shmLife{closed: true}
}

// bellSuffix ends the name of an endpoint's doorbell socket, which lies
// beside the endpoint's file in /dev/shm (and is removed with it, or by
// cleanStaleShm when its process is gone).
const bellSuffix = ".bell"

// shmPeerOf returns the process id and the doorbell path of the shm
// endpoint an address names, when it is one of this package's endpoints
// (0 and "" otherwise).
func shmPeerOf(name []byte) (pid int, bell string) {
	s := strings.TrimSuffix(string(name), "\x00")
	s = strings.TrimPrefix(s, "fi_shm://")
	rest, ok := strings.CutPrefix(s, shmPrefix)
	if !ok || strings.ContainsAny(s, "/:") {
		return 0, ""
	}
	pidStr, _, ok := strings.Cut(rest, "_")
	if !ok {
		return 0, ""
	}
	pid, err := strconv.Atoi(pidStr)
	if err != nil || pid <= 0 {
		return 0, ""
	}
	return pid, filepath.Join(shmDir, s+bellSuffix)
}

// setBell fills a doorbell address with a socket path.
func setBell(b *C.dsm_bell, path string) {
	// struct sockaddr_un: the family (AF_UNIX, host order), then the path
	// and its terminating zero.
	const famLen = 2
	if famLen+len(path)+1 > len(b.addr) {
		return
	}
	*b = C.dsm_bell{}
	*(*uint16)(unsafe.Pointer(&b.addr[0])) = C.AF_UNIX
	for i := 0; i < len(path); i++ {
		b.addr[famLen+i] = C.char(path[i])
	}
	b.len = C.int(famLen + len(path) + 1)
}
