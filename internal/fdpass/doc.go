// Package fdpass sends and receives file descriptors over a Unix socket
// (SCM_RIGHTS) with a small payload alongside: how a client hands its
// userfaultfd to dsmd and how dsmd hands a region's memfd to a client.
//
// Use a SOCK_SEQPACKET socket ("unixpacket"): each Send is one message and
// its descriptors arrive with it. Recv takes the most descriptors the
// protocol allows at that point; a message with more is refused and every
// descriptor it carried is closed, as are the descriptors of a message whose
// payload did not fit. Received descriptors are close-on-exec and belong to
// the caller.
//
// ParseRights, the decoder of received control data, trusts nothing: a
// malformed header or length is ErrBadControl, other control messages are
// ErrUnexpectedControl, and every descriptor found is returned even with an
// error so that the caller can close it. It has a fuzz target.
package fdpass
