package node

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/dsmkit/dsm/rdma"
)

func TestNodeMsgRoundTrip(t *testing.T) {
	data := bytes.Repeat([]byte{7}, 4096)
	cases := []struct {
		b    []byte
		want nodeMsg
	}{
		{encodePersist(9, 3, []persistPage{{No: 1, Version: 2}, {No: 1 << 40, Version: 65535}}),
			nodeMsg{Kind: msgPersist, ID: 9, Region: 3, Pages: []persistPage{{No: 1, Version: 2}, {No: 1 << 40, Version: 65535}}}},
		{encodeCopy(10, 4, 4096, []persistPage{{No: 5, Version: 6, Seq: 77, Data: data}}),
			nodeMsg{Kind: msgPersistCopy, ID: 10, Region: 4, PageSize: 4096, Pages: []persistPage{{No: 5, Version: 6, Seq: 77, Data: data}}}},
		{encodeCopyPart(13, 4, 1<<17, persistPage{No: 5, Version: 6, Seq: 77}, 65488, data),
			nodeMsg{Kind: msgCopyPart, ID: 13, Region: 4, PageSize: 1 << 17, Offset: 65488, Pages: []persistPage{{No: 5, Version: 6, Seq: 77, Data: data}}}},
		{encodeAnswer(msgPersistAnswer, 11, answerOK, ""), nodeMsg{Kind: msgPersistAnswer, ID: 11, Code: answerOK}},
		{encodeAnswer(msgCopyAnswer, 12, answerFailed, "n2: page store: disk full"),
			nodeMsg{Kind: msgCopyAnswer, ID: 12, Code: answerFailed, Msg: "n2: page store: disk full"}},
	}
	for _, c := range cases {
		if !isNodeMsg(c.b) {
			t.Fatalf("%v: not a node message", c.want.Kind)
		}
		got, err := decodeNodeMsg(c.b)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Fatalf("decode(%v) = %+v, %v; want %+v", c.want.Kind, got, err, c.want)
		}
	}
	// Sizes: a full persist and a full persist-copy fit in one message.
	full := make([]persistPage, maxPersistPages)
	if n := len(encodePersist(1, 1, full)); n > rdma.MaxMessage {
		t.Fatalf("a persist of %d pages is %d bytes, more than %d", maxPersistPages, n, rdma.MaxMessage)
	}
	for _, ps := range []int{4096, 8192, 32768} {
		k := copyPagesPerMsg(ps)
		pages := make([]persistPage, k)
		for i := range pages {
			pages[i].Data = make([]byte, ps)
		}
		if k == 0 || len(encodeCopy(1, 1, ps, pages)) > rdma.MaxMessage {
			t.Fatalf("page size %d: %d pages a persist-copy do not fit", ps, k)
		}
	}
	if copyPagesPerMsg(64<<10) != 0 {
		t.Fatal("a 64 KiB page fits in a persist-copy")
	}
	if n := len(encodeCopyPart(1, 1, 2<<20, persistPage{}, 0, make([]byte, partBytes))); n > rdma.MaxMessage || partBytes%8 != 0 {
		t.Fatalf("a copy-part of %d bytes is %d bytes, more than %d", partBytes, n, rdma.MaxMessage)
	}
	// A long answer is cut, not refused.
	long := string(bytes.Repeat([]byte{'x'}, 2*maxAnswerBytes))
	if m, err := decodeNodeMsg(encodeAnswer(msgPersistAnswer, 1, answerFailed, long)); err != nil || len(m.Msg) != maxAnswerBytes {
		t.Fatalf("long answer: %d bytes, %v", len(m.Msg), err)
	}
}

func TestNodeMsgRefused(t *testing.T) {
	good := encodePersist(1, 2, []persistPage{{No: 3, Version: 4}})
	bad := map[string][]byte{
		"empty":           nil,
		"region header":   {1, 0, 0, 0, byte(msgPersist), 0, 0, 0, 0, 0, 0, 0, 0},
		"short":           good[:nodeMsgHeader+3],
		"truncated page":  good[:len(good)-1],
		"trailing byte":   append(bytes.Clone(good), 0),
		"region 0":        encodePersist(1, 0, []persistPage{{No: 3}}),
		"no pages":        encodePersist(1, 2, nil),
		"kind 0":          append(appendNodeHeader(nil, 0, 1), 0),
		"kind 99":         append(appendNodeHeader(nil, 99, 1), 0),
		"answer code 0":   encodeAnswer(msgPersistAnswer, 1, 0, ""),
		"answer too long": append(encodeAnswer(msgPersistAnswer, 1, answerOK, "ab"), 'c'),
		"copy page 0":     encodeCopy(1, 2, 0, []persistPage{{No: 1}}),
		"copy page odd":   encodeCopy(1, 2, 7, []persistPage{{No: 1, Data: make([]byte, 7)}}),
		"copy short data": encodeCopy(1, 2, 4096, []persistPage{{No: 1, Data: make([]byte, 4095)}}),
		"part region 0":   encodeCopyPart(1, 0, 1<<17, persistPage{}, 0, make([]byte, 8)),
		"part no data":    encodeCopyPart(1, 2, 1<<17, persistPage{}, 0, nil),
		"part past end":   encodeCopyPart(1, 2, 1<<17, persistPage{}, 1<<17-8, make([]byte, 16)),
		"part odd offset": encodeCopyPart(1, 2, 1<<17, persistPage{}, 4, make([]byte, 8)),
		"part page 0":     encodeCopyPart(1, 2, 0, persistPage{}, 0, make([]byte, 8)),
		"part short":      encodeCopyPart(1, 2, 1<<17, persistPage{}, 0, make([]byte, 8))[:nodeMsgHeader+partHeader-1],
	}
	for name, b := range bad {
		if m, err := decodeNodeMsg(b); !errors.Is(err, errBadNodeMsg) {
			t.Errorf("%s: decode = %+v, %v; want errBadNodeMsg", name, m, err)
		}
	}
}

// FuzzDecodeNodeMsg: no input makes the decoder panic, and what decodes
// encodes back to the same bytes.
func FuzzDecodeNodeMsg(f *testing.F) {
	f.Add(encodePersist(1, 2, []persistPage{{No: 3, Version: 4}}))
	f.Add(encodeCopy(5, 6, 8, []persistPage{{No: 7, Version: 8, Seq: 9, Data: make([]byte, 8)}}))
	f.Add(encodeAnswer(msgCopyAnswer, 10, answerRetry, "n3: not home"))
	f.Add(encodeCopyPart(11, 12, 1<<17, persistPage{No: 13, Version: 14, Seq: 15}, 64, make([]byte, 24)))
	f.Add([]byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeNodeMsg(b)
		if err != nil {
			return
		}
		var again []byte
		switch m.Kind {
		case msgPersist:
			again = encodePersist(m.ID, m.Region, m.Pages)
		case msgPersistCopy:
			again = encodeCopy(m.ID, m.Region, m.PageSize, m.Pages)
		case msgCopyPart:
			again = encodeCopyPart(m.ID, m.Region, m.PageSize, m.Pages[0], m.Offset, m.Pages[0].Data)
		default:
			again = encodeAnswer(m.Kind, m.ID, m.Code, m.Msg)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("%+v decoded from %x encodes to %x", m, b, again)
		}
		for _, p := range m.Pages {
			if m.Kind == msgPersistCopy && len(p.Data) != m.PageSize {
				t.Fatalf("page %d of %d bytes in a message of %d-byte pages", p.No, len(p.Data), m.PageSize)
			}
		}
	})
}
