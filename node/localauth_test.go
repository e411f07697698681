package node

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/internal/localsock"
)

func TestSocketPerm(t *testing.T) {
	base := []string{"--id", "1", "--data-dir", "/d"}
	for _, tc := range []struct {
		args      []string
		mode      uint32
		group     int64 // -1: none
		groupName string
		err       string
	}{
		{nil, 0o600, -1, "", ""},
		{[]string{"--socket-group", "4242"}, 0o660, 4242, "", ""},
		{[]string{"--socket-group", "root"}, 0o660, 0, "root", ""},
		{[]string{"--socket-group", "4242", "--socket-mode", "0670"}, 0o670, 4242, "", ""},
		{[]string{"--socket-mode", "640"}, 0o640, -1, "", ""},
		{[]string{"--socket-group", "no-such-group-here"}, 0, 0, "", "--socket-group: no group"},
		{[]string{"--socket-mode", "0999"}, 0, 0, "", "--socket-mode"},
		{[]string{"--socket-mode", "01777"}, 0, 0, "", "--socket-mode"},
		{[]string{"--socket-mode", "0066"}, 0, 0, "", "locks dsmd's own user out"},
		{[]string{"--socket-group", "4242", "--socket-mode", "0600"}, 0, 0, "", "does not let --socket-group 4242 in"},
	} {
		cfg, err := ParseFlags(append(append([]string{}, base...), tc.args...), &bytes.Buffer{})
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, ErrConfig) {
				t.Errorf("%v: err %v, want one saying %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", tc.args, err)
			continue
		}
		sa, _ := cfg.SocketPerm()
		if uint32(sa.Perm.Mode) != tc.mode || sa.Perm.HasGroup != (tc.group >= 0) || (tc.group >= 0 && int64(sa.Perm.Group) != tc.group) || sa.GroupName != tc.groupName {
			t.Errorf("%v: %+v", tc.args, sa)
		}
	}
}

func TestRegionAccessError(t *testing.T) {
	id := func(uid, gid uint32, groups ...uint32) localsock.Identity {
		return localsock.Identity{Cred: localsock.Cred{PID: 9, UID: uid, GID: gid}, Groups: groups}
	}
	open := directory.Region{RegionSpec: directory.RegionSpec{Name: "o"}}
	closed := directory.Region{RegionSpec: directory.RegionSpec{Name: "c"},
		Access: &directory.Access{Users: []uint32{1000}, ReadGroups: []uint32{60}}}
	for _, tc := range []struct {
		id    localsock.Identity
		r     directory.Region
		write bool
		err   string
	}{
		{id(5000, 5000), open, true, ""},
		{id(0, 0), closed, true, ""},
		{id(1000, 1000), closed, true, ""},
		{id(2000, 2000, 60), closed, false, ""},
		{id(2000, 60), closed, false, ""},
		{id(2000, 2000, 60), closed, true, "may only read"},
		{id(3000, 3000), closed, false, "not on the region's access list"},
	} {
		err := regionAccessError(tc.id, tc.r, "use", tc.write)
		if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%v on %s (write %v): %v, want %q", tc.id, tc.r.Name, tc.write, err, tc.err)
		}
		if err != nil && !strings.Contains(err.Error(), "permission denied: uid") {
			t.Errorf("refusal %q does not say who", err)
		}
	}
}

func TestRefusalsAreRateLimited(t *testing.T) {
	var buf bytes.Buffer
	rf := &refusals{log: slog.New(slog.NewTextHandler(&buf, nil))}
	a := &localsock.Addr{Identity: localsock.Identity{Cred: localsock.Cred{PID: 1, UID: 2000, GID: 2000}}, Err: errors.New("refused")}
	for range 5 {
		rf.report("/s", a)
	}
	if n := strings.Count(buf.String(), "local client refused"); n != 1 {
		t.Fatalf("%d refusals logged of 5 in a row, want 1:\n%s", n, buf.String())
	}
	rf.last = rf.last.Add(-refusalEvery) // as if the interval had passed
	rf.report("/s", a)
	if !strings.Contains(buf.String(), "refusals_not_logged=4") {
		t.Fatalf("the next log line does not count the 4 refusals not logged:\n%s", buf.String())
	}
}
