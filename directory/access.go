package directory

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// ErrInvalidAccess: an access list that is too long.
var ErrInvalidAccess = errors.New("directory: invalid region access")

// MaxAccessIDs bounds each list of an Access.
const MaxAccessIDs = 256

// Access says which local users may use a region's memory through dsmd:
// dsmd checks the uid and groups of the process on its socket (from
// SO_PEERCRED) against it on every mapping and memory call. A region
// without an Access (nil) is open to every process allowed on the socket.
// Root and dsmd's own user are always allowed. Ids are numbers: they must
// mean the same users on every machine of the cluster.
//
// An Access is immutable once in a View.
type Access struct {
	// Users and Groups may map, read and write the region.
	Users  []uint32 `json:",omitempty"`
	Groups []uint32 `json:",omitempty"`
	// ReadUsers and ReadGroups may only read it (Load, ReadMemory).
	ReadUsers  []uint32 `json:",omitempty"`
	ReadGroups []uint32 `json:",omitempty"`
}

// Normalize sorts and deduplicates the lists (a nil Access stays nil) and
// checks their lengths.
func (a *Access) Normalize() (*Access, error) {
	if a == nil {
		return nil, nil
	}
	n := &Access{}
	for _, l := range []struct {
		name string
		in   []uint32
		out  *[]uint32
	}{
		{"users", a.Users, &n.Users},
		{"groups", a.Groups, &n.Groups},
		{"read-only users", a.ReadUsers, &n.ReadUsers},
		{"read-only groups", a.ReadGroups, &n.ReadGroups},
	} {
		if len(l.in) > MaxAccessIDs {
			return nil, fmt.Errorf("%w: %d %s, at most %d", ErrInvalidAccess, len(l.in), l.name, MaxAccessIDs)
		}
		if len(l.in) > 0 {
			*l.out = slices.Compact(slices.Sorted(slices.Values(l.in)))
		}
	}
	return n, nil
}

// Equal reports whether a and b allow the same (both normalized).
func (a *Access) Equal(b *Access) bool {
	if a == nil || b == nil {
		return a == b
	}
	return slices.Equal(a.Users, b.Users) && slices.Equal(a.Groups, b.Groups) &&
		slices.Equal(a.ReadUsers, b.ReadUsers) && slices.Equal(a.ReadGroups, b.ReadGroups)
}

// Allows reports whether a user with uid and groups may read (write
// false) or write the region. Privileged users (root, dsmd's) are the
// caller's business: Allows knows only the lists.
func (a *Access) Allows(uid uint32, groups []uint32, write bool) bool {
	if a == nil {
		return true
	}
	in := func(ids []uint32, x uint32) bool {
		_, ok := slices.BinarySearch(ids, x)
		return ok
	}
	anyIn := func(ids []uint32) bool {
		return slices.ContainsFunc(groups, func(g uint32) bool { return in(ids, g) })
	}
	if in(a.Users, uid) || anyIn(a.Groups) {
		return true
	}
	return !write && (in(a.ReadUsers, uid) || anyIn(a.ReadGroups))
}

// String says who may, in one line: "rw uid 1000,1001 gid 50; ro uid 7".
func (a *Access) String() string {
	if a == nil {
		return "open"
	}
	part := func(users, groups []uint32) string {
		var s string
		if len(users) > 0 {
			s = "uid " + joinIDs(users)
		}
		if len(groups) > 0 {
			if s != "" {
				s += " "
			}
			s += "gid " + joinIDs(groups)
		}
		return s
	}
	rw, ro := part(a.Users, a.Groups), part(a.ReadUsers, a.ReadGroups)
	switch {
	case rw == "" && ro == "":
		return "root and dsmd's user only"
	case ro == "":
		return "rw " + rw
	case rw == "":
		return "ro " + ro
	}
	return "rw " + rw + "; ro " + ro
}

func joinIDs(ids []uint32) string {
	var s string
	for i, id := range ids {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprint(id)
	}
	return s
}

// EnsureRegionAccess is EnsureRegion that gives a region it creates the
// access list a (nil: open). A region that exists with the same spec is
// left as it is, access included: the answer says its access.
func (d *Directory) EnsureRegionAccess(ctx context.Context, spec RegionSpec, a *Access) (r Region, created bool, err error) {
	spec, err = spec.Normalize()
	if err != nil {
		return Region{}, false, err
	}
	if a, err = a.Normalize(); err != nil {
		return Region{}, false, err
	}
	c := createRegionCmd(spec, d.cfg.Now())
	c.Access = a
	res, err := d.apply(ctx, encodeCommand(c))
	if err != nil {
		return Region{}, false, err
	}
	return res.Region, res.Created, res.Err
}

// SetRegionAccess replaces the access list of region name (nil: open to
// every process allowed on dsmd's socket). ErrNoRegion if there is none.
func (d *Directory) SetRegionAccess(ctx context.Context, name string, a *Access) (Region, error) {
	if err := validName(name); err != nil {
		return Region{}, err
	}
	a, err := a.Normalize()
	if err != nil {
		return Region{}, err
	}
	res, err := d.apply(ctx, encodeCommand(command{Type: cmdSetRegionAccess, Name: name, Access: a}))
	if err != nil {
		return Region{}, err
	}
	return res.Region, res.Err
}
