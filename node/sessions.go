package node

import (
	"context"

	"github.com/dsmkit/dsm/directory"
	"github.com/dsmkit/dsm/internal/ids"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
	"github.com/dsmkit/dsm/node/localcache"
)

// Liveness of mapping sessions, by their tokens (localcache.SessionAlive,
// mapproto.FeatureSession): a token names the protocol id of the dsmd
// incarnation that handed it out, and that dsmd alone knows whether the
// session is still served. A departed incarnation's sessions are all dead.

// proto is this incarnation's protocol id, None until the directory has
// recorded this process.
func (n *Node) proto() ids.NodeID {
	if n.eng == nil {
		return ids.None
	}
	return ids.NodeID(n.eng.self.Load())
}

func (s *clientServer) SessionsAlive(ctx context.Context, req *dsmpb.SessionsAliveRequest) (*dsmpb.SessionsAliveResponse, error) {
	return &dsmpb.SessionsAliveResponse{States: s.n.sessionsAlive(ctx, req.GetTokens(), req.GetLocalOnly())}, nil
}

func (n *Node) sessionsAlive(ctx context.Context, tokens []uint64, localOnly bool) []dsmpb.SessionState {
	out := make([]dsmpb.SessionState, len(tokens))
	var pm *protoMap
	if n.eng != nil {
		pm = n.eng.pv.p.Load()
	}
	me := n.proto()
	ask := map[ids.NodeID][]int{} // by node: the tokens of its current incarnation
	for i, t := range tokens {
		out[i] = dsmpb.SessionState_SESSION_STATE_UNKNOWN
		p := localcache.TokenProto(t)
		if p == ids.None || pm == nil {
			continue
		}
		if p == me {
			out[i] = dsmpb.SessionState_SESSION_STATE_DEAD
			if n.cache != nil && n.cache.SessionAlive(t) {
				out[i] = dsmpb.SessionState_SESSION_STATE_ALIVE
			}
			continue
		}
		in, ok := pm.byProto[p]
		switch {
		case !ok: // an id newer than this node's view
		case in.departed:
			out[i] = dsmpb.SessionState_SESSION_STATE_DEAD
		case !localOnly:
			ask[in.node] = append(ask[in.node], i)
		}
	}
	if len(ask) == 0 {
		return out
	}
	addrs := map[ids.NodeID]string{}
	for _, m := range n.dir.Members() {
		if m.State == directory.StateAlive {
			addrs[m.ID] = m.GRPCAddr
		}
	}
	done := make(chan struct{})
	for node, idx := range ask {
		go func() {
			defer func() { done <- struct{}{} }()
			states := n.askSessions(ctx, node, addrs[node], tokens, idx)
			for k, i := range idx {
				out[i] = states[k]
			}
		}()
	}
	for range ask {
		<-done
	}
	return out
}

// askSessions asks member node, at gRPC address addr, about tokens[idx...];
// UNKNOWN for every one it cannot answer.
func (n *Node) askSessions(ctx context.Context, node ids.NodeID, addr string, tokens []uint64, idx []int) []dsmpb.SessionState {
	states := make([]dsmpb.SessionState, len(idx))
	for k := range states {
		states[k] = dsmpb.SessionState_SESSION_STATE_UNKNOWN
	}
	if addr == "" {
		return states
	}
	conn, err := n.dialPeer(addr, node)
	if err != nil {
		return states
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, peerTimeout)
	defer cancel()
	req := &dsmpb.SessionsAliveRequest{LocalOnly: true}
	for _, i := range idx {
		req.Tokens = append(req.Tokens, tokens[i])
	}
	resp, err := dsmpb.NewClientClient(conn).SessionsAlive(cctx, req)
	if err != nil || len(resp.GetStates()) != len(idx) {
		n.log.Debug("session liveness not answered", "member", addr, "err", err)
		return states
	}
	return resp.GetStates()
}
