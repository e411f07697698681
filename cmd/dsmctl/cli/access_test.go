package cli

import (
	"slices"
	"strings"
	"testing"
)

func TestAccessFlags(t *testing.T) {
	var f accessFlags
	if a, err := f.access(); a != nil || err != nil {
		t.Fatalf("no flags: %v, %v", a, err)
	}
	f = accessFlags{uids: []string{"1000", "root"}, gids: []string{"0"}, roUIDs: []string{"7"}}
	a, err := f.access()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a.Uids, []uint32{1000, 0}) || !slices.Equal(a.Gids, []uint32{0}) || !slices.Equal(a.ReadOnlyUids, []uint32{7}) || a.ReadOnlyGids != nil {
		t.Fatalf("access %v", a)
	}
	f = accessFlags{roGIDs: []string{"no-such-group-anywhere"}}
	if _, err := f.access(); err == nil || !strings.Contains(err.Error(), `--read-only-gid: no group "no-such-group-anywhere"`) {
		t.Fatalf("unknown group: %v", err)
	}
	if got := accessLine(accessView(a)); got != "read-write: uid 1000,0 gid 0; read-only: uid 7 (and root, dsmd's user)" {
		t.Errorf("accessLine = %q", got)
	}
	if got := accessLine(nil); !strings.Contains(got, "open") {
		t.Errorf("accessLine(nil) = %q", got)
	}
}
