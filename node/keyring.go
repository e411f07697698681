package node

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/internal/ids"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// keyringTimeout bounds a keyring operation without a deadline of its own.
const keyringTimeout = 10 * time.Second

// gossipKeys are the keys of --gossip-key or --gossip-keyring-file.
func (c Config) gossipKeys() ([][]byte, error) {
	switch {
	case c.GossipKey != "" && c.GossipKeyringFile != "":
		return nil, &ConfigError{"gossip-key", "give --gossip-key or --gossip-keyring-file, not both"}
	case c.GossipKey != "":
		k, err := directory.ParseGossipKey(c.GossipKey)
		if err != nil {
			return nil, &ConfigError{"gossip-key", err.Error()}
		}
		return [][]byte{k}, nil
	case c.GossipKeyringFile != "":
		b, err := os.ReadFile(c.GossipKeyringFile)
		if err != nil {
			return nil, &ConfigError{"gossip-keyring-file", err.Error()}
		}
		keys, err := directory.ParseKeyringFile(b)
		if err != nil {
			return nil, &ConfigError{"gossip-keyring-file", fmt.Sprintf("%s: %v", c.GossipKeyringFile, err)}
		}
		return keys, nil
	}
	return nil, nil
}

var keyringOps = map[dsmpb.KeyringOp]directory.KeyringOp{
	dsmpb.KeyringOp_KEYRING_OP_LIST:    directory.KeyringList,
	dsmpb.KeyringOp_KEYRING_OP_INSTALL: directory.KeyringInstall,
	dsmpb.KeyringOp_KEYRING_OP_USE:     directory.KeyringUse,
	dsmpb.KeyringOp_KEYRING_OP_REMOVE:  directory.KeyringRemove,
}

func (s *adminServer) Keyring(ctx context.Context, req *dsmpb.KeyringRequest) (*dsmpb.KeyringResponse, error) {
	if a, ok := localPeer(ctx); ok && !privileged(a.Identity) {
		return nil, status.Errorf(codes.PermissionDenied, "permission denied: uid %d (pid %d) may not manage the gossip keys: only root and dsmd's user (uid %d) may",
			a.UID, a.PID, os.Geteuid())
	}
	op, ok := keyringOps[req.GetOp()]
	if !ok {
		return nil, status.Errorf(codes.InvalidArgument, "unknown keyring operation %v", req.GetOp())
	}
	var key []byte
	if op != directory.KeyringList {
		k, err := directory.ParseGossipKey(req.GetKey())
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		key = k
	}
	// Leave a second of the caller's deadline for the answer, so that
	// members that do not answer are reported, not lost in a
	// DEADLINE_EXCEEDED.
	dl, ok := ctx.Deadline()
	switch {
	case !ok:
		dl = time.Now().Add(keyringTimeout)
	case time.Until(dl) > 2*time.Second:
		dl = dl.Add(-time.Second)
	}
	ctx, cancel := context.WithDeadline(ctx, dl)
	defer cancel()
	res, err := s.n.dir.Keyring(ctx, op, key)
	if err != nil {
		return nil, statusError(err)
	}
	if op != directory.KeyringList {
		s.n.log.Info("gossip keyring changed on the members", "op", op, "members", res.Members, "failed", len(res.Errors))
	}
	resp := &dsmpb.KeyringResponse{Members: uint32(res.Members)}
	for _, k := range res.Keys {
		resp.Keys = append(resp.Keys, &dsmpb.KeyringKey{Key: directory.EncodeGossipKey(k.Key),
			Installed: uint32(k.Installed), Primary: uint32(k.Primary)})
	}
	for _, id := range slices.Sorted(func(yield func(ids.NodeID) bool) {
		for id := range res.Errors {
			if !yield(id) {
				return
			}
		}
	}) {
		resp.Errors = append(resp.Errors, &dsmpb.KeyringNodeError{NodeId: uint32(id), Error: res.Errors[id]})
	}
	return resp, nil
}
