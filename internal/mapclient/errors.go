package mapclient

import (
	"errors"
	"fmt"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/mapproto"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrDaemonGone: the session with dsmd ended (dsmd died, or dropped this
	// mapping). The mapping's contents can no longer be trusted: ReadAt and
	// WriteAt fail with it, and a ReadAt that was waiting for a fault when
	// it happened fails too, rather than return a page of zeros.
	ErrDaemonGone = errors.New("mapclient: connection to dsmd lost; the mapping is dead")
	// ErrRegionDeleted: dsmd ended the session because the region was
	// deleted. The mapping is dead as with ErrDaemonGone; a new Map of the
	// name fails with ErrUnknownRegion, or maps another region created
	// since under the same name.
	ErrRegionDeleted = errors.New("mapclient: region deleted")
	// ErrClosed: the Mapping or Client was closed.
	ErrClosed = errors.New("mapclient: closed")
	// ErrUnavailable: dsmd cannot be reached at the socket path.
	ErrUnavailable = errors.New("mapclient: dsmd unavailable")
	// ErrUnknownRegion: dsmd has no region of that name.
	ErrUnknownRegion = errors.New("mapclient: unknown region")
	// ErrOutOfRange: an offset outside the region.
	ErrOutOfRange = errors.New("mapclient: offset out of range")
	// ErrProtocol: dsmd answered something this library does not expect.
	ErrProtocol = errors.New("mapclient: protocol error")
	// ErrPageUnavailable: an access hit a page that dsmd poisoned in this
	// mapping because a fault on it waited longer than
	// Options.FaultTimeout for a page the cluster cannot serve now. The
	// mapping stays alive; the page works again once dsmd serves it. The
	// error is a *PageError when dsmd said which page and why.
	ErrPageUnavailable = errors.New("mapclient: page unavailable")
	// ErrPermissionDenied: dsmd refused this process the socket, or the
	// region (its access list does not let this user map it).
	ErrPermissionDenied = errors.New("mapclient: permission denied")
)

// PageError is an access to a page that dsmd poisoned. It matches
// ErrPageUnavailable.
type PageError struct {
	Page   ids.PageNo
	Offset int64  // of the page's first byte
	Why    string // dsmd's reason (the engine's error)
}

func (e *PageError) Error() string {
	return fmt.Sprintf("%v: %s at offset %#x: %s", ErrPageUnavailable, e.Page, e.Offset, e.Why)
}

// Unwrap makes the error match ErrPageUnavailable.
func (e *PageError) Unwrap() error { return ErrPageUnavailable }

// ServerError is a refusal from dsmd. It matches ErrUnknownRegion or
// ErrUnavailable with errors.Is where its code says so.
type ServerError struct {
	Code mapproto.Code
	Text string
}

func (e *ServerError) Error() string {
	return fmt.Sprintf("mapclient: dsmd refused: %s: %s", e.Code, e.Text)
}

// Is maps the server's codes onto this package's sentinels.
func (e *ServerError) Is(target error) bool {
	switch e.Code {
	case mapproto.CodeUnknownRegion:
		return target == ErrUnknownRegion
	case mapproto.CodeUnavailable:
		return target == ErrUnavailable
	case mapproto.CodePermissionDenied:
		return target == ErrPermissionDenied
	}
	return false
}
