//go:build linux

package localsock

import (
	"io/fs"
	"syscall"
)

func fileGID(fi fs.FileInfo) (uint32, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return st.Gid, true
}
