package coherence

import (
	"encoding/binary"
	"fmt"

	"github.com/dsmkit/dsm/internal/ids"
)

// MsgType is the type of a protocol message. The zero value is invalid.
type MsgType uint8

const (
	// MsgInvalidate asks a sharer to drop its copy of Page: the sender
	// acquired tenure Version of the page.
	MsgInvalidate MsgType = 1 + iota
	// MsgInvAck acknowledges an invalidation of tenure Version. A node
	// that no longer holds the page acknowledges too.
	MsgInvAck
	// MsgRecall asks the exclusive holder of tenure Version to write the
	// page back and release it: to S when Write is false, to I when true.
	MsgRecall
	// MsgEnqueue asks the home of Page to queue the sender for the
	// page's reservation: it has been blocked StarveAttempts times.
	MsgEnqueue
	// MsgGrant tells the node that the home reserved Page for it.
	MsgGrant
	// MsgQuery asks a node to send its move reports again (MsgReport of
	// every page it froze that moved to the sender, then MsgMoveReport):
	// the sender, a new home, holds fewer of its reports than its count
	// says. Page is zero.
	MsgQuery
	// MsgReport tells a page's new home the sender's state of Page
	// (State) and the tenure of its copy (Version), after the page moved.
	MsgReport
	// MsgRebuilt tells a node that the new home rebuilt the word of Page
	// at version Version: the node's copy, if any, is recorded in it.
	MsgRebuilt
	// MsgEpoch asks a node whether it has installed the sender's epoch
	// (a home asks before it repairs its words after a departure).
	MsgEpoch
	// MsgEpochAck answers MsgEpoch: the sender is in Epoch and has
	// dropped what the departure made untrustworthy.
	MsgEpochAck
	// MsgStamp asks the home of Page to repair its word: the sender found
	// it naming a holder or a reserver that is not a member. The home
	// repairs it once every member is in the epoch (repeated by the sender
	// on every blocked attempt; the home ignores duplicates).
	MsgStamp
	// MsgMoveReport tells a node that the sender has sent it, in this
	// epoch, MsgReport of Page distinct pages (a count, not a page):
	// every page the sender froze whose new home is the receiver. Sent
	// by every member to every member after an epoch that moved pages,
	// and repeated until the receiver answers with MsgMoveDone.
	MsgMoveReport
	// MsgMoveDone tells a node that every page that moved to the sender
	// is rebuilt: the receiver unfreezes those it did not report (those
	// it reported are unfrozen by their MsgRebuilt).
	MsgMoveDone
)

func (t MsgType) String() string {
	switch t {
	case MsgInvalidate:
		return "inv"
	case MsgInvAck:
		return "ack"
	case MsgRecall:
		return "recall"
	case MsgEnqueue:
		return "enqueue"
	case MsgGrant:
		return "grant"
	case MsgQuery:
		return "query"
	case MsgReport:
		return "report"
	case MsgRebuilt:
		return "rebuilt"
	case MsgEpoch:
		return "epoch"
	case MsgEpochAck:
		return "epoch-ack"
	case MsgStamp:
		return "stamp"
	case MsgMoveReport:
		return "move-report"
	case MsgMoveDone:
		return "move-done"
	}
	return fmt.Sprintf("MsgType(%d)", uint8(t))
}

// Message is a protocol message between two nodes. Every message carries
// the sender's epoch; a receiver in another epoch refuses it and the
// sender retransmits in the new epoch.
type Message struct {
	Type    MsgType
	From    ids.NodeID
	To      ids.NodeID
	Epoch   ids.Epoch
	Page    ids.PageNo
	Version uint16
	Write   bool  // MsgRecall: the requester wants to write
	State   State // MsgReport: the sender's state; MsgRebuilt: Shared if the receiver's unit is counted, Modified if it is the holder
	// Ended (MsgReport of an Invalid page only): Version is the newest
	// tenure the sender knows to have ended (from a copy it held, a
	// tenure it took, a word it read). The new home judges the claim of
	// an interrupted release by it: another node that knows the claimed
	// tenure ended proves that the release had taken effect.
	Ended bool
	// Clearing (MsgEpochAck only): the sender has backup slots entered
	// anew that are not cleared yet (Reconfigure.ClearPending); a home
	// fills it only after an acknowledgement without.
	Clearing bool
}

func (m Message) String() string {
	switch m.Type {
	case MsgEpochAck:
		if m.Clearing {
			return fmt.Sprintf("%v %v->%v %v clearing", m.Type, m.From, m.To, m.Epoch)
		}
		return fmt.Sprintf("%v %v->%v %v", m.Type, m.From, m.To, m.Epoch)
	case MsgEpoch, MsgMoveDone, MsgQuery:
		return fmt.Sprintf("%v %v->%v %v", m.Type, m.From, m.To, m.Epoch)
	case MsgMoveReport:
		return fmt.Sprintf("%v %v->%v %v count=%d", m.Type, m.From, m.To, m.Epoch, m.Page)
	}
	s := fmt.Sprintf("%v %v->%v %v %v v=%d", m.Type, m.From, m.To, m.Epoch, m.Page, m.Version)
	if m.Type == MsgRecall {
		if m.Write {
			s += " write"
		} else {
			s += " read"
		}
	}
	if m.Type == MsgReport {
		s += " " + m.State.String()
		if m.Ended {
			s += " ended"
		}
	}
	return s
}

// Wire format, little-endian, fixed size:
//
//	0  format (1)      1  type        2  flags                  3  zero
//	flags: bit 0 write (recall), bit 1 shared, bit 2 modified (report, rebuilt),
//	       bit 3 ended (report), bit 4 clearing (epoch-ack)
//	4  from (u32)      8  to (u32)    12 epoch (u64)            20 page (u64; MsgMoveReport: the count)
//	28 version (u16)
const (
	msgFormat    = 1
	msgLen       = 30
	flagWrite    = 1
	flagShared   = 2
	flagModified = 4
	flagEnded    = 8 // MsgReport with no state flag: Version is the newest tenure known ended
	flagClearing = 16
	knownFlags   = flagWrite | flagShared | flagModified | flagEnded | flagClearing
	maxMsgType_  = MsgMoveDone
)

// Marshal encodes m.
func (m Message) Marshal() []byte {
	b := make([]byte, msgLen)
	b[0] = msgFormat
	b[1] = byte(m.Type)
	if m.Write {
		b[2] |= flagWrite
	}
	switch m.State {
	case Shared:
		b[2] |= flagShared
	case Modified:
		b[2] |= flagModified
	}
	if m.Ended {
		b[2] |= flagEnded
	}
	if m.Clearing {
		b[2] |= flagClearing
	}
	binary.LittleEndian.PutUint32(b[4:], uint32(m.From))
	binary.LittleEndian.PutUint32(b[8:], uint32(m.To))
	binary.LittleEndian.PutUint64(b[12:], uint64(m.Epoch))
	binary.LittleEndian.PutUint64(b[20:], uint64(m.Page))
	binary.LittleEndian.PutUint16(b[28:], m.Version)
	return b
}

// Unmarshal decodes and validates a message. It never panics; every
// failure wraps ErrBadMessage.
func Unmarshal(b []byte) (Message, error) {
	var m Message
	if len(b) != msgLen {
		return m, fmt.Errorf("%w: %d bytes, want %d", ErrBadMessage, len(b), msgLen)
	}
	if b[0] != msgFormat {
		return m, fmt.Errorf("%w: format %d", ErrBadMessage, b[0])
	}
	m.Type = MsgType(b[1])
	if m.Type < MsgInvalidate || m.Type > maxMsgType_ {
		return m, fmt.Errorf("%w: type %d", ErrBadMessage, b[1])
	}
	if b[2]&^knownFlags != 0 || b[3] != 0 {
		return m, fmt.Errorf("%w: flags %#x %#x", ErrBadMessage, b[2], b[3])
	}
	if b[2]&flagWrite != 0 && m.Type != MsgRecall {
		return m, fmt.Errorf("%w: write flag on %v", ErrBadMessage, m.Type)
	}
	m.Write = b[2]&flagWrite != 0
	switch st := b[2] & (flagShared | flagModified); {
	case st != 0 && m.Type != MsgReport && m.Type != MsgRebuilt:
		return m, fmt.Errorf("%w: state flags on %v", ErrBadMessage, m.Type)
	case st == flagShared:
		m.State = Shared
	case st == flagModified:
		m.State = Modified
	case st != 0:
		return m, fmt.Errorf("%w: both state flags", ErrBadMessage)
	}
	if b[2]&flagEnded != 0 && (m.Type != MsgReport || m.State != Invalid) {
		return m, fmt.Errorf("%w: ended flag on %v %v", ErrBadMessage, m.Type, m.State)
	}
	m.Ended = b[2]&flagEnded != 0
	if b[2]&flagClearing != 0 && m.Type != MsgEpochAck {
		return m, fmt.Errorf("%w: clearing flag on %v", ErrBadMessage, m.Type)
	}
	m.Clearing = b[2]&flagClearing != 0
	from := binary.LittleEndian.Uint32(b[4:])
	to := binary.LittleEndian.Uint32(b[8:])
	if from == 0 || from > MaxNodeID || to == 0 || to > MaxNodeID || from == to {
		return m, fmt.Errorf("%w: from %d to %d", ErrBadMessage, from, to)
	}
	m.From, m.To = ids.NodeID(from), ids.NodeID(to)
	m.Epoch = ids.Epoch(binary.LittleEndian.Uint64(b[12:]))
	if m.Epoch == 0 {
		return m, fmt.Errorf("%w: epoch 0", ErrBadMessage)
	}
	m.Page = ids.PageNo(binary.LittleEndian.Uint64(b[20:]))
	m.Version = binary.LittleEndian.Uint16(b[28:])
	return m, nil
}
