// Package localsock is who may use dsmd's local Unix sockets: how the
// sockets are created with the mode and group an operator chose, and how a
// connecting process is identified and admitted.
//
// Creation (Listen) binds the socket inside a fresh directory only its
// owner can enter, sets the socket file's mode and group there, and only
// then renames it into place: no process ever sees the path with wider
// permissions than asked for, and the process umask is not touched (it is
// process-wide, and other goroutines create files at the same time).
//
// Identification (PeerCred, Identify) reads the peer's credentials with
// SO_PEERCRED: the pid, uid and gid of the process at the time it
// connected, as the kernel recorded them; the supplementary groups come
// from /proc/PID/status (Groups:), read when the connection is accepted.
//
// Admission (Policy) lets in root, dsmd's own user, and the members of the
// socket group (primary or supplementary); everyone else is refused with a
// RefusedError naming who they are and who is allowed. A listener wrapped
// by Admit stamps each connection's RemoteAddr with an *Addr carrying the
// Identity and the verdict, so that a gRPC handler finds the caller in
// peer.FromContext without a transport credential of its own.
package localsock
