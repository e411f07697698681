package node

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/rdma"
)

// The node layer's own messages travel on the verbs transport beside the
// engines' protocol messages (regions.go: a region id, then a coherence
// message). Region id 0 names no region (the directory never gives it
// out), so a message whose first four bytes are zero is the node layer's:
// then a kind byte, then the kind's body, little endian:
//
//	persist      id u64, region u32, count u32, count x (page u64, version u16)
//	persist-copy id u64, region u32, page size u32, count u32,
//	             count x (page u64, version u16, seq u64, data [page size])
//	copy-part    id u64, region u32, page size u32, page u64, version u16,
//	             seq u64, offset u32, data [to the end]
//	answer       id u64, code u8, length u16, message [length]
//
// A copy-part carries a piece of one page that does not fit in a
// persist-copy (pages of 64 KiB and more); it is answered with a
// copy-answer like a persist-copy. An answer (persistAnswer, copyAnswer)
// answers the request of the same id from its receiver. Every length is checked against the bytes present;
// decodeNodeMsg never panics on any input (FuzzDecodeNodeMsg).

// nodeMsgKind is the kind of a node-layer message.
type nodeMsgKind uint8

const (
	msgPersist nodeMsgKind = 1 + iota
	msgPersistAnswer
	msgPersistCopy
	msgCopyAnswer
	msgCopyPart
)

func (k nodeMsgKind) String() string {
	switch k {
	case msgPersist:
		return "persist"
	case msgPersistAnswer:
		return "persist-answer"
	case msgPersistCopy:
		return "persist-copy"
	case msgCopyAnswer:
		return "copy-answer"
	case msgCopyPart:
		return "copy-part"
	}
	return fmt.Sprintf("nodeMsgKind(%d)", uint8(k))
}

// answerCode says how a request ended.
type answerCode uint8

const (
	// answerOK: done.
	answerOK answerCode = 1 + iota
	// answerFailed: failed at the answering node or at one it asked (a
	// disk fault); the message says where and why.
	answerFailed
	// answerRetry: the receiver is not (or not yet) the home of a page
	// asked for, or does not serve the region yet: ask the home of a later
	// view.
	answerRetry
	// answerLost: the home holds an older version of some page than the
	// one the requester released: that release was lost with the nodes
	// that held it (the page's home and backups departed before a Sync
	// persisted it). The other pages asked for are persisted; the message
	// names the lost ones.
	answerLost
)

const (
	nodeMsgHeader = msgHeader + 1 + 8 // zero region, kind, id
	persistEntry  = 8 + 2
	copyEntry     = persistEntry + 8 // and the data
	partHeader    = 4 + 4 + 8 + 2 + 8 + 4
	// partBytes is the most data one copy-part carries: a multiple of 8
	// that fits in a message.
	partBytes      = (rdma.MaxMessage - nodeMsgHeader - partHeader) &^ 7
	maxAnswerBytes = 1024
)

// errBadNodeMsg refuses a node-layer message that does not decode.
var errBadNodeMsg = errors.New("node: bad node message")

// persistPage is a page and the version of a tenure.
type persistPage struct {
	No      ids.PageNo
	Version uint16
	// Seq (persist-copy) is the copy's place in the order of the stable
	// copies the home took (persister.writeOrdered).
	Seq  uint64
	Data []byte // persist-copy only
}

// nodeMsg is one decoded node-layer message.
type nodeMsg struct {
	Kind     nodeMsgKind
	ID       uint64
	Region   ids.RegionID  // persist, persist-copy
	PageSize int           // persist-copy, copy-part
	Offset   int           // copy-part: where Pages[0].Data goes in the page
	Pages    []persistPage // persist, persist-copy
	Code     answerCode    // answers
	Msg      string        // answers
}

// maxPersistPages is how many pages one persist message names.
const maxPersistPages = (rdma.MaxMessage - nodeMsgHeader - 8) / persistEntry

// copyPagesPerMsg is how many pages of pageSize bytes one persist-copy
// carries (0: a page does not fit in a message).
func copyPagesPerMsg(pageSize int) int {
	return (rdma.MaxMessage - nodeMsgHeader - 12) / (copyEntry + pageSize)
}

func appendNodeHeader(b []byte, k nodeMsgKind, id uint64) []byte {
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = append(b, byte(k))
	return binary.LittleEndian.AppendUint64(b, id)
}

func encodePersist(id uint64, r ids.RegionID, pages []persistPage) []byte {
	b := make([]byte, 0, nodeMsgHeader+8+len(pages)*persistEntry)
	b = appendNodeHeader(b, msgPersist, id)
	b = binary.LittleEndian.AppendUint32(b, uint32(r))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(pages)))
	for _, p := range pages {
		b = binary.LittleEndian.AppendUint64(b, uint64(p.No))
		b = binary.LittleEndian.AppendUint16(b, p.Version)
	}
	return b
}

// encodeCopy encodes a persist-copy; every page's Data is pageSize bytes.
func encodeCopy(id uint64, r ids.RegionID, pageSize int, pages []persistPage) []byte {
	b := make([]byte, 0, nodeMsgHeader+12+len(pages)*(copyEntry+pageSize))
	b = appendNodeHeader(b, msgPersistCopy, id)
	b = binary.LittleEndian.AppendUint32(b, uint32(r))
	b = binary.LittleEndian.AppendUint32(b, uint32(pageSize))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(pages)))
	for _, p := range pages {
		b = binary.LittleEndian.AppendUint64(b, uint64(p.No))
		b = binary.LittleEndian.AppendUint16(b, p.Version)
		b = binary.LittleEndian.AppendUint64(b, p.Seq)
		b = append(b, p.Data...)
	}
	return b
}

// encodeCopyPart encodes the piece of page p's data at off.
func encodeCopyPart(id uint64, r ids.RegionID, pageSize int, p persistPage, off int, data []byte) []byte {
	b := make([]byte, 0, nodeMsgHeader+partHeader+len(data))
	b = appendNodeHeader(b, msgCopyPart, id)
	b = binary.LittleEndian.AppendUint32(b, uint32(r))
	b = binary.LittleEndian.AppendUint32(b, uint32(pageSize))
	b = binary.LittleEndian.AppendUint64(b, uint64(p.No))
	b = binary.LittleEndian.AppendUint16(b, p.Version)
	b = binary.LittleEndian.AppendUint64(b, p.Seq)
	b = binary.LittleEndian.AppendUint32(b, uint32(off))
	return append(b, data...)
}

func encodeAnswer(k nodeMsgKind, id uint64, code answerCode, msg string) []byte {
	if len(msg) > maxAnswerBytes {
		msg = msg[:maxAnswerBytes]
	}
	b := make([]byte, 0, nodeMsgHeader+3+len(msg))
	b = appendNodeHeader(b, k, id)
	b = append(b, byte(code))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(msg)))
	return append(b, msg...)
}

// isNodeMsg reports whether a message on the verbs transport is the node
// layer's (its region id is 0).
func isNodeMsg(b []byte) bool {
	return len(b) >= msgHeader && binary.LittleEndian.Uint32(b) == 0
}

// decodeNodeMsg decodes a node-layer message, checking every field. The
// pages' Data alias b.
func decodeNodeMsg(b []byte) (nodeMsg, error) {
	var m nodeMsg
	if len(b) < nodeMsgHeader || !isNodeMsg(b) {
		return m, fmt.Errorf("%w: %d-byte header", errBadNodeMsg, len(b))
	}
	m.Kind = nodeMsgKind(b[msgHeader])
	m.ID = binary.LittleEndian.Uint64(b[msgHeader+1:])
	b = b[nodeMsgHeader:]
	switch m.Kind {
	case msgPersist, msgPersistCopy:
		hl := 8
		if m.Kind == msgPersistCopy {
			hl = 12
		}
		if len(b) < hl {
			return m, fmt.Errorf("%w: %v: %d-byte body", errBadNodeMsg, m.Kind, len(b))
		}
		m.Region = ids.RegionID(binary.LittleEndian.Uint32(b))
		if m.Region == 0 {
			return m, fmt.Errorf("%w: %v of region 0", errBadNodeMsg, m.Kind)
		}
		entry := persistEntry
		if m.Kind == msgPersistCopy {
			ps := binary.LittleEndian.Uint32(b[4:])
			if ps == 0 || ps%8 != 0 || ps > rdma.MaxMessage {
				return m, fmt.Errorf("%w: %v: page size %d", errBadNodeMsg, m.Kind, ps)
			}
			m.PageSize = int(ps)
			entry = copyEntry + int(ps)
		}
		count := uint64(binary.LittleEndian.Uint32(b[hl-4:]))
		b = b[hl:]
		if count == 0 || count*uint64(entry) != uint64(len(b)) {
			return m, fmt.Errorf("%w: %v: %d pages in %d bytes", errBadNodeMsg, m.Kind, count, len(b))
		}
		m.Pages = make([]persistPage, count)
		for i := range m.Pages {
			p := &m.Pages[i]
			p.No = ids.PageNo(binary.LittleEndian.Uint64(b))
			p.Version = binary.LittleEndian.Uint16(b[8:])
			if m.Kind == msgPersistCopy {
				p.Seq = binary.LittleEndian.Uint64(b[persistEntry:])
				p.Data = b[copyEntry:entry:entry]
			}
			b = b[entry:]
		}
	case msgCopyPart:
		if len(b) < partHeader {
			return m, fmt.Errorf("%w: %v: %d-byte body", errBadNodeMsg, m.Kind, len(b))
		}
		m.Region = ids.RegionID(binary.LittleEndian.Uint32(b))
		ps := binary.LittleEndian.Uint32(b[4:])
		off := binary.LittleEndian.Uint32(b[26:])
		data := b[partHeader:]
		switch {
		case m.Region == 0:
			return m, fmt.Errorf("%w: %v of region 0", errBadNodeMsg, m.Kind)
		case ps == 0 || ps%8 != 0 || ps > 1<<30:
			return m, fmt.Errorf("%w: %v: page size %d", errBadNodeMsg, m.Kind, ps)
		case len(data) == 0 || off%8 != 0 || uint64(off)+uint64(len(data)) > uint64(ps):
			return m, fmt.Errorf("%w: %v: %d bytes at %d of a %d-byte page", errBadNodeMsg, m.Kind, len(data), off, ps)
		}
		m.PageSize, m.Offset = int(ps), int(off)
		m.Pages = []persistPage{{No: ids.PageNo(binary.LittleEndian.Uint64(b[8:])), Version: binary.LittleEndian.Uint16(b[16:]),
			Seq: binary.LittleEndian.Uint64(b[18:]), Data: data}}
	case msgPersistAnswer, msgCopyAnswer:
		if len(b) < 3 {
			return m, fmt.Errorf("%w: %v: %d-byte body", errBadNodeMsg, m.Kind, len(b))
		}
		m.Code = answerCode(b[0])
		if m.Code < answerOK || m.Code > answerLost {
			return m, fmt.Errorf("%w: %v: code %d", errBadNodeMsg, m.Kind, m.Code)
		}
		n := int(binary.LittleEndian.Uint16(b[1:]))
		if n > maxAnswerBytes || len(b) != 3+n {
			return m, fmt.Errorf("%w: %v: a %d-byte message in %d bytes", errBadNodeMsg, m.Kind, n, len(b)-3)
		}
		m.Msg = string(b[3:])
	default:
		return m, fmt.Errorf("%w: kind %d", errBadNodeMsg, uint8(m.Kind))
	}
	return m, nil
}
