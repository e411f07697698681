package coherence

import (
	"bytes"
	"errors"
	"testing"
)

func TestMessageRoundTrip(t *testing.T) {
	for _, m := range []Message{
		{Type: MsgInvalidate, From: 1, To: 2, Epoch: 7, Page: 123456789, Version: 65535},
		{Type: MsgInvAck, From: MaxNodeID, To: 1, Epoch: 1, Page: 0, Version: 0},
		{Type: MsgRecall, From: 3, To: 64, Epoch: 1 << 40, Page: 9, Version: 17, Write: true},
		{Type: MsgRecall, From: 3, To: 64, Epoch: 2, Page: 9, Version: 17},
		{Type: MsgEnqueue, From: 3, To: 1, Epoch: 2, Page: 9},
		{Type: MsgGrant, From: 1, To: 3, Epoch: 2, Page: 9},
		{Type: MsgQuery, From: 1, To: 3, Epoch: 2},
		{Type: MsgMoveReport, From: 3, To: 1, Epoch: 2, Page: 17},
		{Type: MsgMoveDone, From: 1, To: 3, Epoch: 2},
		{Type: MsgReport, From: 3, To: 1, Epoch: 2, Page: 9, Version: 4, State: Modified},
		{Type: MsgReport, From: 3, To: 1, Epoch: 2, Page: 9, Version: 4, State: Shared},
		{Type: MsgReport, From: 3, To: 1, Epoch: 2, Page: 9},
		{Type: MsgReport, From: 3, To: 1, Epoch: 2, Page: 9, Version: 65534, Ended: true},
		{Type: MsgRebuilt, From: 1, To: 3, Epoch: 2, Page: 9, Version: 4, State: Shared},
		{Type: MsgRebuilt, From: 1, To: 3, Epoch: 2, Page: 9, Version: 4},
		{Type: MsgRebuilt, From: 1, To: 3, Epoch: 2, Page: 9, Version: 4, State: Modified},
		{Type: MsgEpoch, From: 1, To: 3, Epoch: 2},
		{Type: MsgEpochAck, From: 3, To: 1, Epoch: 2},
		{Type: MsgEpochAck, From: 3, To: 1, Epoch: 2, Clearing: true},
		{Type: MsgStamp, From: 3, To: 1, Epoch: 17, Page: 1 << 33},
	} {
		b := m.Marshal()
		got, err := Unmarshal(b)
		if err != nil {
			t.Fatalf("%v: %v", m, err)
		}
		if got != m {
			t.Fatalf("round trip of %v gave %v", m, got)
		}
	}
}

func TestUnmarshalRefuses(t *testing.T) {
	good := Message{Type: MsgRecall, From: 1, To: 2, Epoch: 3, Page: 4, Version: 5, Write: true}.Marshal()
	mut := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	cases := map[string][]byte{
		"empty":              nil,
		"short":              good[:msgLen-1],
		"long":               append(bytes.Clone(good), 0),
		"format":             mut(func(b []byte) []byte { b[0] = 2; return b }),
		"type zero":          mut(func(b []byte) []byte { b[1] = 0; return b }),
		"type unknown":       mut(func(b []byte) []byte { b[1] = byte(maxMsgType_) + 1; return b }),
		"flags":              mut(func(b []byte) []byte { b[2] = 2; return b }),
		"reserved":           mut(func(b []byte) []byte { b[3] = 1; return b }),
		"write on inv":       mut(func(b []byte) []byte { b[1] = byte(MsgInvalidate); return b }),
		"state on inv":       mut(func(b []byte) []byte { b[1] = byte(MsgInvalidate); b[2] = flagShared; return b }),
		"both states":        mut(func(b []byte) []byte { b[1] = byte(MsgReport); b[2] = flagShared | flagModified; return b }),
		"S on grant":         mut(func(b []byte) []byte { b[1] = byte(MsgGrant); b[2] = flagShared; return b }),
		"write on stamp":     mut(func(b []byte) []byte { b[1] = byte(MsgStamp); return b }),
		"M on stamp":         mut(func(b []byte) []byte { b[1] = byte(MsgStamp); b[2] = flagModified; return b }),
		"ended on recall":    mut(func(b []byte) []byte { b[2] = flagWrite | flagEnded; return b }),
		"ended with S":       mut(func(b []byte) []byte { b[1] = byte(MsgReport); b[2] = flagShared | flagEnded; return b }),
		"ended on rebuilt":   mut(func(b []byte) []byte { b[1] = byte(MsgRebuilt); b[2] = flagEnded; return b }),
		"clearing on epoch":  mut(func(b []byte) []byte { b[1] = byte(MsgEpoch); b[2] = flagClearing; return b }),
		"clearing on recall": mut(func(b []byte) []byte { b[2] = flagWrite | flagClearing; return b }),
		"from zero":          mut(func(b []byte) []byte { b[4] = 0; return b }),
		"to too big":         mut(func(b []byte) []byte { b[9] = 0xff; return b }),
		"to self":            mut(func(b []byte) []byte { b[8] = 1; return b }),
		"epoch zero":         mut(func(b []byte) []byte { clear(b[12:20]); return b }),
	}
	for name, b := range cases {
		if _, err := Unmarshal(b); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: got %v, want ErrBadMessage", name, err)
		}
	}
}

func FuzzUnmarshal(f *testing.F) {
	f.Add(Message{Type: MsgInvalidate, From: 1, To: 2, Epoch: 1, Page: 1, Version: 1}.Marshal())
	f.Add(Message{Type: MsgRecall, From: 5, To: 2, Epoch: 9, Page: 3, Version: 2, Write: true}.Marshal())
	f.Add([]byte{})
	f.Add(bytes.Repeat([]byte{0xff}, msgLen))
	f.Add(Message{Type: MsgReport, From: 3, To: 1, Epoch: 2, Page: 9, Version: 4, State: Modified}.Marshal())
	f.Add(Message{Type: MsgMoveReport, From: 3, To: 1, Epoch: 2, Page: 17}.Marshal())
	f.Add(Message{Type: MsgMoveDone, From: 1, To: 3, Epoch: 2}.Marshal())
	f.Add(Message{Type: MsgStamp, From: 3, To: 1, Epoch: 17, Page: 9}.Marshal())
	f.Add(Message{Type: MsgReport, From: 3, To: 1, Epoch: 2, Page: 9, Version: 65534, Ended: true}.Marshal())
	f.Add(Message{Type: MsgEpochAck, From: 3, To: 1, Epoch: 2, Clearing: true}.Marshal())
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Unmarshal(b)
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("error %v does not wrap ErrBadMessage", err)
			}
			return
		}
		if !bytes.Equal(m.Marshal(), b) {
			t.Fatalf("%v re-encodes differently", m)
		}
	})
}
