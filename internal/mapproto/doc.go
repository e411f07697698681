// Package mapproto is the wire format of the local session between a client
// process (package mapclient, under the dsm library) and dsmd's page cache
// (package node/localcache), over a Unix SOCK_SEQPACKET socket.
//
// # A session
//
// One connection is one mapping of one region:
//
//	client                                   dsmd
//	Map{Name, Size}                  ->
//	                                 <-      Mapped{Region, Size, PageSize} + memfd (SCM_RIGHTS)
//	                                         [+ the lease page's memfd: FeatureLeasePage]
//	(maps the memfd, MADV_DONTFORK, opens a userfaultfd,
//	 registers the mapping MISSING|WP|MINOR)
//	Register{Addr, Len} + userfaultfd ->
//	                                 <-      Registered{Session}
//	(plain loads and stores; dsmd serves the faults)
//	close the socket                 ->      dsmd stops serving and forgets the mapping
//
// Any request may instead be answered by Error{Code, Text}, after which dsmd
// closes the connection. End of stream in either direction ends the session:
// for dsmd it means the client is gone; for the client, that dsmd is gone
// (or dropped it), and the mapping must not be trusted any more.
//
// After Registered, dsmd sends nothing, except when the region is deleted
// (and, below, when a page is unavailable):
//
//	client                                   dsmd
//	                                 <-      Error{CodeUnknownRegion, "region \"NAME\" (rN) was deleted"}
//	                                 <-      end of stream (dsmd closes the session)
//	(the mapping is dead: region deleted)
//
// The client then treats the mapping as gone because of the deletion (its
// memory no longer holds the region's data), not because dsmd went away.
// A client that does not know this message sees only the end of stream.
//
// A client whose Map carried a FaultTimeout also gets, for a page whose
// fault waited longer than that for a page the cluster cannot serve (its
// home is down or unreachable), and in this order:
//
//	client                                   dsmd
//	                                 <-      Unavailable{Page, Text}
//	                                         (UFFDIO_POISON of the page in the client:
//	                                          the waiting thread gets SIGBUS)
//	(records the page and why)
//	                                 <-      Poison{Page}, only if the poison found the
//	                                         page mapped (a write fault on a page the
//	                                         client maps read-only)
//	(MADV_DONTNEED of the page, clears the
//	 write-protect marker that leaves,
//	 UFFDIO_POISON with its own copy of
//	 the userfaultfd)
//	...                                      (the miss is retried in the background)
//	                                 <-      Available{Page}
//	(madvise MADV_DONTNEED of the page: the poison marker goes,
//	 the next access faults as usual)
//
// # A control session
//
// A client that does not speak gRPC (the C library, docs/clients.md)
// creates, looks up and deletes regions, syncs them and asks about
// sessions on the same socket. A connection whose first message is a
// control request (Create, Lookup, Delete, Sync, SessionsAlive: types 32
// and up, type Ctl) is a control session, and carries no descriptors:
//
//	client                                   dsmd
//	Create{Name, Size, PageSize, Durability} ->
//	                                 <-      Region{Region, Size, PageSize, Durability, Existed}
//	Lookup{Name}                     ->
//	                                 <-      Region{...}  or  Error{CodeUnknownRegion, ...}
//	Sync{Name, Offset, Len}          ->
//	                                 <-      Done{Count}
//	SessionsAlive{Tokens}            ->
//	                                 <-      States{States}
//	Delete{Name, Force}              ->
//	                                 <-      Done{Count}  or  Error{CodeBusy, ...}
//	close the socket                 ->
//
// Each request gets exactly one answer, in order; an Error answers the
// request and the session goes on. A malformed message, a mapping message
// or a descriptor ends the session after an Error{CodeBadRequest}. dsmd
// applies to each request the checks of the gRPC call it stands for (the
// socket's admission by SO_PEERCRED, the region's access list). A dsmd
// that predates control sessions answers the first request with
// Error{CodeBadRequest} ("unknown type") and closes the connection.
//
// # Compatibility
//
// FaultTimeout is an optional trailing field of Map (milliseconds; absent
// means wait forever, and an explicit 0 is refused so the encoding stays
// canonical). A dsmd of this version accepts the Map of an older client and
// never sends it Unavailable or Available (that client set no FaultTimeout);
// an older dsmd refuses a Map that carries one (CodeBadRequest: trailing
// bytes), so a client that sets FaultTimeout needs a dsmd of this version.
// Version stays 1: the old form is still valid, and a new version byte
// would have cut old clients off too.
//
// Features follow FaultTimeout in Map, optional in the same way (a Map
// with features always carries the FaultTimeout field, 0 meaning none;
// features 0 are refused). FeatureSession asks for the session's token,
// an optional trailing field of Registered that dsmd sends only to a
// client that asked: an older client never sees it, and an older dsmd
// refuses the Map that asks.
//
// FeatureLeasePage asks for dsmd's lease page (lease.go; docs/failover.md
// §9): Mapped then carries two descriptors, the region's memfd and the
// lease page's, a memfd sealed against writes through any new mapping
// (F_SEAL_FUTURE_WRITE), which the client maps read-only and watches. A
// dsmd with no lease page (a page cache that no lease guards) sends the
// region's memfd alone. An older dsmd refuses the Map that asks
// (CodeBadRequest: unknown features); mapclient then maps again without
// it, and that mapping has no watchdog. Version stays 1 here too.
//
// # Encoding
//
// Each message is one seqpacket datagram: a version byte (Version), a type
// byte, then the fields of the type in order, little endian; a string is a
// uint16 length and that many bytes. Trailing bytes are an error. Decode
// trusts nothing: every malformed message is an error wrapping ErrMalformed,
// never a panic (FuzzDecode). The lease page is not a message: its record
// is six 64-bit words (lease.go), read under a sequence counter, and
// DecodeLease trusts it no more (FuzzDecodeLease).
package mapproto
