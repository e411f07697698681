package node

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/localsock"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// Local clients reach dsmd through two Unix sockets: the gRPC socket and
// the mapping socket. Both are created with --socket-mode and
// --socket-group, and every peer's credentials (SO_PEERCRED) are checked:
// root, dsmd's user and the socket group's members are admitted, others
// are told why and served nothing. A region's access list (directory.Access)
// further limits who may map, read or write it; callers over the TCP gRPC
// listener are not local users and are not checked here.

// refusalEvery is how often refusals are logged; the others are counted.
const refusalEvery = 10 * time.Second

// refusals logs refused local peers, at most once per refusalEvery.
type refusals struct {
	log        *slog.Logger
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (r *refusals) report(socket string, a *localsock.Addr) {
	r.mu.Lock()
	now := time.Now()
	if !r.last.IsZero() && now.Sub(r.last) < refusalEvery {
		r.suppressed++
		r.mu.Unlock()
		return
	}
	n := r.suppressed
	r.last, r.suppressed = now, 0
	r.mu.Unlock()
	r.log.Warn("local client refused", "socket", socket, "uid", a.UID, "gid", a.GID, "pid", a.PID,
		"err", a.Err, "refusals_not_logged", n)
}

// socketPolicy is who may use the socket at path.
func (n *Node) socketPolicy(path string) localsock.Policy {
	sa, _ := n.cfg.SocketPerm() // validated by New
	return localsock.Policy{Socket: path, Owner: uint32(os.Geteuid()),
		HasGroup: sa.Perm.HasGroup, Group: sa.Perm.Group, GroupName: sa.GroupName}
}

// listenLocal creates a local socket with the configured mode and group,
// and warns when the socket group cannot reach it.
func (n *Node) listenLocal(network, path string) (*localsock.Listener, error) {
	sa, _ := n.cfg.SocketPerm()
	ln, err := localsock.Listen(network, path, sa.Perm)
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	if sa.Perm.HasGroup {
		if dir := localsock.Unreachable(path, true, sa.Perm.Group); dir != "" {
			n.log.Warn("the socket group cannot reach the socket: a directory above it is closed to it",
				"socket", path, "group", n.cfg.SocketGroup, "directory", dir)
		}
	}
	return ln, nil
}

// localPeer is the local process that made the call, or false for a call
// over TCP.
func localPeer(ctx context.Context) (*localsock.Addr, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, false
	}
	return localsock.FromAddr(p.Addr)
}

// admitUnary answers every call of a refused local peer with
// PERMISSION_DENIED.
func admitUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if a, ok := localPeer(ctx); ok && a.Err != nil {
		return nil, status.Error(codes.PermissionDenied, a.Err.Error())
	}
	return h(ctx, req)
}

// admitStream is admitUnary for streams.
func admitStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if a, ok := localPeer(ss.Context()); ok && a.Err != nil {
		return status.Error(codes.PermissionDenied, a.Err.Error())
	}
	return h(srv, ss)
}

// privileged: root and dsmd's own user may do anything.
func privileged(id localsock.Identity) bool {
	return id.UID == 0 || id.UID == uint32(os.Geteuid())
}

// regionAccessError is why id may not use region r (write: write to it),
// or nil.
func regionAccessError(id localsock.Identity, r directory.Region, op string, write bool) error {
	if r.Access == nil || privileged(id) {
		return nil
	}
	groups := append([]uint32{id.GID}, id.Groups...)
	if r.Access.Allows(id.UID, groups, write) {
		return nil
	}
	why := "it is not on the region's access list"
	if write && r.Access.Allows(id.UID, groups, false) {
		why = "it may only read the region"
	}
	return fmt.Errorf("permission denied: uid %d (pid %d) may not %s region %q: %s (access: %s)",
		id.UID, id.PID, op, r.Name, why, r.Access)
}

// checkRegion refuses a local caller the access list does not allow.
func checkRegion(ctx context.Context, r directory.Region, op string, write bool) error {
	a, ok := localPeer(ctx)
	if !ok {
		return nil
	}
	if err := regionAccessError(a.Identity, r, op, write); err != nil {
		return status.Error(codes.PermissionDenied, err.Error())
	}
	return nil
}

// mayMap decides whether a local peer may map region name: a mapping is
// writable memory, so it needs write access.
func (n *Node) mayMap(id localsock.Identity, name string) error {
	r, ok := n.dir.Region(name)
	if !ok {
		return nil // the page cache says it is unknown
	}
	return regionAccessError(id, r, "map (a mapping needs write access)", true)
}

// admitConn judges a peer of the mapping socket.
func (n *Node) admitConn(p localsock.Policy, rf *refusals) func(net.Conn) *localsock.Addr {
	return func(c net.Conn) *localsock.Addr {
		a := p.Judge(c)
		if a.Err != nil {
			rf.report(p.Socket, a)
		}
		return a
	}
}

func accessOf(pb *dsmpb.RegionAccess) *directory.Access {
	if pb == nil {
		return nil
	}
	return &directory.Access{Users: pb.GetUids(), Groups: pb.GetGids(),
		ReadUsers: pb.GetReadOnlyUids(), ReadGroups: pb.GetReadOnlyGids()}
}

func accessPB(a *directory.Access) *dsmpb.RegionAccess {
	if a == nil {
		return nil
	}
	return &dsmpb.RegionAccess{Uids: a.Users, Gids: a.Groups, ReadOnlyUids: a.ReadUsers, ReadOnlyGids: a.ReadGroups}
}

func (s *adminServer) SetRegionAccess(ctx context.Context, req *dsmpb.SetRegionAccessRequest) (*dsmpb.SetRegionAccessResponse, error) {
	if req.GetOpen() && req.GetAccess() != nil {
		return nil, status.Error(codes.InvalidArgument, "open and an access list together: give one")
	}
	if !req.GetOpen() && req.GetAccess() == nil {
		return nil, status.Error(codes.InvalidArgument, "no access list: give one, or open")
	}
	r, err := s.n.freshRegion(ctx, req.GetRegion())
	if err != nil {
		return nil, err
	}
	if err := checkRegion(ctx, r, "change the access of", true); err != nil {
		return nil, err
	}
	r, err = s.n.dir.SetRegionAccess(ctx, r.Name, accessOf(req.GetAccess()))
	if err != nil {
		return nil, statusError(err)
	}
	s.n.log.Info("region access set", "region", r.Name, "access", r.Access.String())
	return &dsmpb.SetRegionAccessResponse{Region: regionPB(r)}, nil
}

// revokeMappings ends the mappings that a region's new access list no
// longer allows; seen holds the lists of the previous view, updated here.
func (n *Node) revokeMappings(v *directory.View, seen map[ids.RegionID]*directory.Access) {
	live := map[ids.RegionID]bool{}
	for _, r := range v.Regions() {
		live[r.ID] = true
		old, known := seen[r.ID]
		seen[r.ID] = r.Access
		if !known || r.Access == nil || r.Access.Equal(old) || n.cache == nil {
			continue
		}
		reason := fmt.Sprintf("region %q: its access list changed and no longer lets this process map it (access: %s)", r.Name, r.Access)
		n.cache.Revoke(r.ID, func(id localsock.Identity) bool {
			return regionAccessError(id, r, "map", true) == nil
		}, reason)
	}
	for id := range seen {
		if !live[id] {
			delete(seen, id)
		}
	}
}
