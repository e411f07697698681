package cli

import (
	"fmt"
	"os/user"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// accessFlags are the flags that give a region an access list.
type accessFlags struct {
	uids, gids, roUIDs, roGIDs []string
}

func (f *accessFlags) add(fs *pflag.FlagSet) {
	fs.StringSliceVar(&f.uids, "allow-uid", nil, "users (names or uids) that may map, read and write the region; repeat or separate with commas")
	fs.StringSliceVar(&f.gids, "allow-gid", nil, "groups (names or gids) whose members may map, read and write the region")
	fs.StringSliceVar(&f.roUIDs, "read-only-uid", nil, "users that may only read the region (Load, dsmctl get); a mapping needs write access")
	fs.StringSliceVar(&f.roGIDs, "read-only-gid", nil, "groups whose members may only read the region")
}

func (f *accessFlags) given() bool {
	return len(f.uids)+len(f.gids)+len(f.roUIDs)+len(f.roGIDs) > 0
}

// access resolves the names to ids; nil when no flag was given.
func (f *accessFlags) access() (*dsmpb.RegionAccess, error) {
	if !f.given() {
		return nil, nil
	}
	var a dsmpb.RegionAccess
	for _, l := range []struct {
		flag  string
		in    []string
		out   *[]uint32
		group bool
	}{
		{"--allow-uid", f.uids, &a.Uids, false},
		{"--allow-gid", f.gids, &a.Gids, true},
		{"--read-only-uid", f.roUIDs, &a.ReadOnlyUids, false},
		{"--read-only-gid", f.roGIDs, &a.ReadOnlyGids, true},
	} {
		for _, s := range l.in {
			id, err := lookupID(strings.TrimSpace(s), l.group)
			if err != nil {
				return nil, usagef("%s: %v", l.flag, err)
			}
			*l.out = append(*l.out, id)
		}
	}
	return &a, nil
}

// lookupID turns a uid, gid, user or group name into a number. Names are
// this machine's: the number is what the directory keeps.
func lookupID(s string, group bool) (uint32, error) {
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		return uint32(n), nil
	}
	if s == "" {
		return 0, fmt.Errorf("empty name")
	}
	var idStr string
	if group {
		g, err := user.LookupGroup(s)
		if err != nil {
			return 0, fmt.Errorf("no group %q on this machine", s)
		}
		idStr = g.Gid
	} else {
		u, err := user.Lookup(s)
		if err != nil {
			return 0, fmt.Errorf("no user %q on this machine", s)
		}
		idStr = u.Uid
	}
	n, err := strconv.ParseUint(idStr, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%q has id %q, not a number", s, idStr)
	}
	return uint32(n), nil
}

type accessJSON struct {
	UIDs         []uint32 `json:"uids"`
	GIDs         []uint32 `json:"gids"`
	ReadOnlyUIDs []uint32 `json:"read_only_uids"`
	ReadOnlyGIDs []uint32 `json:"read_only_gids"`
}

func accessView(a *dsmpb.RegionAccess) *accessJSON {
	if a == nil {
		return nil
	}
	c := func(l []uint32) []uint32 { return append([]uint32{}, l...) }
	return &accessJSON{c(a.Uids), c(a.Gids), c(a.ReadOnlyUids), c(a.ReadOnlyGids)}
}

// accessLine says who may use a region, in one line.
func accessLine(a *accessJSON) string {
	if a == nil {
		return "open to every process allowed on dsmd's socket"
	}
	ids := func(l []uint32) string {
		s := make([]string, len(l))
		for i, x := range l {
			s[i] = strconv.FormatUint(uint64(x), 10)
		}
		return strings.Join(s, ",")
	}
	part := func(users, groups []uint32) string {
		var p []string
		if len(users) > 0 {
			p = append(p, "uid "+ids(users))
		}
		if len(groups) > 0 {
			p = append(p, "gid "+ids(groups))
		}
		return strings.Join(p, " ")
	}
	var out []string
	if rw := part(a.UIDs, a.GIDs); rw != "" {
		out = append(out, "read-write: "+rw)
	}
	if ro := part(a.ReadOnlyUIDs, a.ReadOnlyGIDs); ro != "" {
		out = append(out, "read-only: "+ro)
	}
	if len(out) == 0 {
		return "root and dsmd's user only"
	}
	return strings.Join(out, "; ") + " (and root, dsmd's user)"
}

func (a *app) regionAccessCmd() *cobra.Command {
	var f accessFlags
	var open bool
	c := &cobra.Command{
		Use:   "access NAME",
		Short: "Show or replace who may map, read and write a region",
		Long: `access shows a region's access list, or, with flags, replaces it.

A region without an access list is open to every process that dsmd lets
onto its socket (root, dsmd's user and dsmd's --socket-group). With a list,
dsmd checks the uid and groups of the process on its socket: --allow-uid
and --allow-gid may map, read and write; --read-only-uid and --read-only-gid
may only read (Load, dsmctl get), since a mapping is writable memory. Root
and dsmd's user always may. Names are resolved on this machine; the
directory keeps the numbers, which must mean the same users on every
machine.

Changing the list needs read-write access to the region. --open removes
the list.`,
		Example: "  dsmctl region access feat\n" +
			"  dsmctl region access feat --allow-gid ml --read-only-uid 1001,1002\n" +
			"  dsmctl region access feat --open",
		Args:              args(1, 1, "NAME"),
		ValidArgsFunction: a.completeRegion,
		RunE: func(cmd *cobra.Command, argv []string) error {
			acc, err := f.access()
			if err != nil {
				return err
			}
			if open && acc != nil {
				return usagef("--open removes the access list: give it alone")
			}
			cl, err := a.admin()
			if err != nil {
				return err
			}
			ctx, cancel := a.call(cmd)
			defer cancel()
			var r *dsmpb.Region
			if open || acc != nil {
				resp, err := cl.SetRegionAccess(ctx, &dsmpb.SetRegionAccessRequest{Region: argv[0], Access: acc, Open: open})
				if err != nil {
					return err
				}
				r = resp.GetRegion()
			} else {
				resp, err := cl.RegionInfo(ctx, &dsmpb.RegionInfoRequest{Name: argv[0], MaxShards: 1})
				if err != nil {
					return err
				}
				r = resp.GetRegion()
			}
			v := accessView(r.GetAccess())
			if a.json {
				return a.printJSON(struct {
					Region string      `json:"region"`
					Access *accessJSON `json:"access"`
				}{r.GetName(), v})
			}
			_, err = fmt.Fprintf(a.env.Stdout, "region %s: %s\n", r.GetName(), accessLine(v))
			return err
		},
	}
	f.add(c.Flags())
	c.Flags().BoolVar(&open, "open", false, "remove the access list: every process allowed on dsmd's socket may use the region")
	return c
}
