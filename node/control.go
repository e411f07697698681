package node

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/dsmkit/dsm/internal/localsock"
	"github.com/dsmkit/dsm/internal/mapproto"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
	"github.com/dsmkit/dsm/node/localcache"
)

// control answers a control request of the mapping socket (mapproto "A
// control session", used by the C library) by running the Client gRPC
// call it stands for, as if peer had made that call on the gRPC socket:
// the same checks of the region's access list apply, and the same errors
// come back (as mapproto codes).
func (n *Node) control(ctx context.Context, id localsock.Identity, req mapproto.Ctl) (mapproto.Ctl, error) {
	ctx = peer.NewContext(ctx, &peer.Peer{Addr: &localsock.Addr{Identity: id}})
	cs := &clientServer{n: n}
	switch req.Type {
	case mapproto.TypeCreate:
		d := dsmpb.Durability_DURABILITY_MEMORY
		if req.Durability == mapproto.DurabilityDurable {
			d = dsmpb.Durability_DURABILITY_DURABLE
		}
		resp, err := cs.CreateRegion(ctx, &dsmpb.CreateRegionRequest{Name: req.Name, Size: req.Size, PageSize: req.PageSize, Durability: d})
		if err != nil {
			return mapproto.Ctl{}, controlError(err)
		}
		return regionCtl(resp.GetRegion(), resp.GetExisted()), nil
	case mapproto.TypeLookup:
		resp, err := cs.GetRegion(ctx, &dsmpb.GetRegionRequest{Name: req.Name})
		if err != nil {
			return mapproto.Ctl{}, controlError(err)
		}
		if why := resp.GetNotServed(); why != "" {
			return mapproto.Ctl{}, localcache.Refuse(mapproto.CodeUnavailable, controlText{why})
		}
		return regionCtl(resp.GetRegion(), false), nil
	case mapproto.TypeDelete:
		resp, err := cs.DeleteRegion(ctx, &dsmpb.DeleteRegionRequest{Name: req.Name, Force: req.Force})
		if err != nil {
			return mapproto.Ctl{}, controlError(err)
		}
		return mapproto.Ctl{Type: mapproto.TypeDone, Count: resp.GetMappings()}, nil
	case mapproto.TypeSync:
		resp, err := cs.Sync(ctx, &dsmpb.SyncRequest{Region: req.Name, Offset: req.Offset, Length: req.Len})
		if err != nil {
			return mapproto.Ctl{}, controlError(err)
		}
		return mapproto.Ctl{Type: mapproto.TypeDone, Count: resp.GetPagesWritten()}, nil
	case mapproto.TypeSessionsAlive:
		states := n.sessionsAlive(ctx, req.Tokens, false)
		out := mapproto.Ctl{Type: mapproto.TypeStates, States: make([]mapproto.SessionState, len(states))}
		for i, s := range states {
			switch s {
			case dsmpb.SessionState_SESSION_STATE_ALIVE:
				out.States[i] = mapproto.SessionAlive
			case dsmpb.SessionState_SESSION_STATE_DEAD:
				out.States[i] = mapproto.SessionDead
			default:
				out.States[i] = mapproto.SessionUnknown
			}
		}
		return out, nil
	}
	return mapproto.Ctl{}, localcache.Refuse(mapproto.CodeBadRequest, status.Errorf(codes.InvalidArgument, "%s is no control request", req.Type))
}

func regionCtl(r *dsmpb.Region, existed bool) mapproto.Ctl {
	d := mapproto.DurabilityMemory
	if r.GetDurability() == dsmpb.Durability_DURABILITY_DURABLE {
		d = mapproto.DurabilityDurable
	}
	return mapproto.Ctl{Type: mapproto.TypeRegion, Region: r.GetId(), Size: r.GetSize(), PageSize: r.GetPageSize(), Durability: d, Existed: existed}
}

// controlError turns the error of a gRPC call into the refusal of a
// control request, with the gRPC status's message.
func controlError(err error) error {
	st := status.Convert(statusError(err))
	code := mapproto.CodeInternal
	switch st.Code() {
	case codes.NotFound:
		code = mapproto.CodeUnknownRegion
	case codes.InvalidArgument, codes.OutOfRange:
		code = mapproto.CodeBadRequest
	case codes.AlreadyExists:
		code = mapproto.CodeExists
	case codes.FailedPrecondition:
		code = mapproto.CodeBusy
	case codes.PermissionDenied:
		code = mapproto.CodePermissionDenied
	case codes.ResourceExhausted:
		code = mapproto.CodeNoSpace
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted:
		code = mapproto.CodeUnavailable
	}
	return localcache.Refuse(code, controlText{st.Message()})
}

// controlText is an error that is its text.
type controlText struct{ s string }

func (e controlText) Error() string { return e.s }
