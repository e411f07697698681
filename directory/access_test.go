package directory

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestAccessAllows(t *testing.T) {
	a, err := (&Access{Users: []uint32{1000, 1000, 999}, Groups: []uint32{50}, ReadUsers: []uint32{2000}, ReadGroups: []uint32{60, 61}}).Normalize()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a.Users, []uint32{999, 1000}) {
		t.Fatalf("Normalize: users %v", a.Users)
	}
	for _, tc := range []struct {
		uid           uint32
		groups        []uint32
		read, write   bool
		nilRead, nilW bool
	}{
		{1000, nil, true, true, true, true},
		{1001, []uint32{50}, true, true, true, true},
		{2000, nil, true, false, true, true},
		{3000, []uint32{9, 61}, true, false, true, true},
		{3000, []uint32{9}, false, false, true, true},
		{0, nil, false, false, true, true}, // root is the caller's business
	} {
		if got := a.Allows(tc.uid, tc.groups, false); got != tc.read {
			t.Errorf("uid %d groups %v: read %v, want %v", tc.uid, tc.groups, got, tc.read)
		}
		if got := a.Allows(tc.uid, tc.groups, true); got != tc.write {
			t.Errorf("uid %d groups %v: write %v, want %v", tc.uid, tc.groups, got, tc.write)
		}
		var open *Access
		if !open.Allows(tc.uid, tc.groups, true) {
			t.Errorf("an open region refuses uid %d", tc.uid)
		}
	}
	if got := a.String(); got != "rw uid 999,1000 gid 50; ro uid 2000 gid 60,61" {
		t.Errorf("String = %q", got)
	}
	if got := (&Access{}).String(); !strings.Contains(got, "root") {
		t.Errorf("empty access String = %q", got)
	}
	long := &Access{ReadUsers: make([]uint32, MaxAccessIDs+1)}
	if _, err := long.Normalize(); !errors.Is(err, ErrInvalidAccess) {
		t.Errorf("too long a list: %v", err)
	}
}

func TestFSMRegionAccess(t *testing.T) {
	f := newFSM(newNotifier())
	res := applyAll(t, f, []command{
		{Type: cmdPutMember, Member: member(1)},
		withAccess(createRegionCmd(RegionSpec{Name: "r", Size: 4096}, time.Unix(5, 0)), &Access{Users: []uint32{5, 4}}),
		// Creating it again with another list changes nothing.
		withAccess(createRegionCmd(RegionSpec{Name: "r", Size: 4096}, time.Unix(6, 0)), &Access{Users: []uint32{9}}),
		{Type: cmdSetRegionAccess, Name: "r", Access: &Access{ReadUsers: []uint32{8}}},
		{Type: cmdSetRegionAccess, Name: "nope", Access: &Access{}},
	})
	if res[1].Err != nil || !reflect.DeepEqual(res[1].Region.Access, &Access{Users: []uint32{4, 5}}) {
		t.Fatalf("create: %+v", res[1])
	}
	if res[2].Created || !reflect.DeepEqual(res[2].Region.Access, &Access{Users: []uint32{4, 5}}) {
		t.Fatalf("create again: %+v", res[2])
	}
	if !errors.Is(res[4].Err, ErrNoRegion) {
		t.Fatalf("access of a missing region: %v", res[4].Err)
	}
	v, _ := f.current()
	r, _ := v.Region("r")
	if !reflect.DeepEqual(r.Access, &Access{ReadUsers: []uint32{8}}) {
		t.Fatalf("after set: %v", r.Access)
	}
	applyAll(t, f, []command{{Type: cmdSetRegionAccess, Name: "r"}})
	v, _ = f.current()
	if r, _ := v.Region("r"); r.Access != nil {
		t.Fatalf("after opening: %v", r.Access)
	}
	// An access list in a command that has none is malformed.
	if _, err := decodeCommand(encodeCommand(command{Type: cmdDeleteRegion, Name: "r", Access: &Access{}})); !errors.Is(err, ErrBadCommand) {
		t.Fatalf("delete with access: %v", err)
	}
	if _, err := decodeCommand(encodeCommand(command{Type: cmdSetRegionAccess, Name: "r", Access: &Access{Users: make([]uint32, MaxAccessIDs+1)}})); !errors.Is(err, ErrInvalidAccess) {
		t.Fatalf("too long a list: %v", err)
	}
}

// TestSnapshotWithoutAccess: a snapshot written before regions had access
// lists decodes, with every region open; an unsorted list is refused.
func TestSnapshotWithoutAccess(t *testing.T) {
	old := `{"version":2,"epoch":1,"index":3,"next_region":2,` +
		`"members":[{"ID":1,"GRPCAddr":"127.0.0.1:1","VerbsAddr":"127.0.0.1:2","RaftAddr":"127.0.0.1:3","RPCAddr":"127.0.0.1:4","State":1,"Epoch":1,"Incarnation":1,"Nonce":101,"Proto":1}],` +
		`"regions":[{"ID":1,"Name":"a","Size":4096,"PageSize":4096,"ShardSize":65536,"Backups":1,"Durability":1,"CreatedAt":"1970-01-01T00:00:01Z","Homes":[1],"HomeIncarnations":[1]}]}`
	v, err := decodeSnapshot([]byte(old))
	if err != nil {
		t.Fatalf("old snapshot: %v", err)
	}
	if r, ok := v.Region("a"); !ok || r.Access != nil {
		t.Fatalf("region a: %+v %v", r, ok)
	}
	bad := strings.Replace(old, `"HomeIncarnations":[1]`, `"HomeIncarnations":[1],"Access":{"Users":[5,4]}`, 1)
	if _, err := decodeSnapshot([]byte(bad)); !errors.Is(err, ErrBadSnapshot) {
		t.Fatalf("unsorted access list: %v", err)
	}
	good := strings.Replace(old, `"HomeIncarnations":[1]`, `"HomeIncarnations":[1],"Access":{"Users":[4,5]}`, 1)
	v, err = decodeSnapshot([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := v.Region("a"); !reflect.DeepEqual(r.Access, &Access{Users: []uint32{4, 5}}) {
		t.Fatalf("access %v", r.Access)
	}
}
