package directory

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestParseGossipKey(t *testing.T) {
	for _, n := range []int{16, 24, 32} {
		k := bytes.Repeat([]byte{7}, n)
		got, err := ParseGossipKey(EncodeGossipKey(k))
		if err != nil || !bytes.Equal(got, k) {
			t.Errorf("%d bytes: %x, %v", n, got, err)
		}
	}
	for _, bad := range []string{"", "!!", EncodeGossipKey(make([]byte, 15)), EncodeGossipKey(make([]byte, 33))} {
		if _, err := ParseGossipKey(bad); !errors.Is(err, ErrGossipKey) {
			t.Errorf("ParseGossipKey(%q) = %v", bad, err)
		}
	}
	if k := NewGossipKey(); len(k) != 32 {
		t.Errorf("NewGossipKey: %d bytes", len(k))
	}
}

func TestKeyringFile(t *testing.T) {
	k1, k2 := bytes.Repeat([]byte{1}, 16), bytes.Repeat([]byte{2}, 32)
	keys, err := ParseKeyringFile(encodeKeyringFile(k2, [][]byte{k1, k2}))
	if err != nil || !reflect.DeepEqual(keys, [][]byte{k2, k1}) {
		t.Fatalf("round trip: %x, %v", keys, err)
	}
	for _, bad := range []string{"", "[]", `["x"]`, `{"a":1}`} {
		if _, err := ParseKeyringFile([]byte(bad)); !errors.Is(err, ErrGossipKey) {
			t.Errorf("ParseKeyringFile(%q) = %v", bad, err)
		}
	}
	// openKeyring: the given keys the first time, written down; the file
	// after, whatever is given.
	dir := t.TempDir()
	kr, kept, err := openKeyring(dir, [][]byte{k1})
	if err != nil || kept || !bytes.Equal(kr.GetPrimaryKey(), k1) {
		t.Fatalf("first open: %v %v", kept, err)
	}
	fi, err := os.Stat(filepath.Join(dir, KeyringFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("keyring file: %v %v", fi, err)
	}
	k := &keyrings{kr: kr, dir: dir}
	for _, step := range []struct {
		op  KeyringOp
		key []byte
		err error
	}{
		{KeyringInstall, k2, nil},
		{KeyringRemove, k1, ErrPrimaryKey},
		{KeyringUse, bytes.Repeat([]byte{3}, 16), ErrKeyNotInstalled},
		{KeyringUse, k2, nil},
		{KeyringRemove, k1, nil},
	} {
		if err := k.apply(step.op, step.key); !errors.Is(err, step.err) && (err != nil || step.err != nil) {
			t.Fatalf("%v %x: %v, want %v", step.op, step.key[:1], err, step.err)
		}
	}
	kr, kept, err = openKeyring(dir, [][]byte{k1})
	if err != nil || !kept || !reflect.DeepEqual(kr.GetKeys(), [][]byte{k2}) {
		t.Fatalf("reopen: %x %v %v", kr.GetKeys(), kept, err)
	}
	if _, _, err := openKeyring(t.TempDir(), nil); err != nil {
		t.Fatalf("no keys: %v", err)
	}
	if err := (&keyrings{}).apply(KeyringList, nil); !errors.Is(err, ErrNoEncryption) {
		t.Fatalf("apply without a keyring: %v", err)
	}
}

func FuzzDecodeKeyringMsg(f *testing.F) {
	f.Add(encodeKeyringMsg(keyringRequestTag, keyringRequest{ID: 1, Op: KeyringInstall, Key: make([]byte, 16), ReplyTo: "127.0.0.1:7946", From: "1"}))
	f.Add(encodeKeyringMsg(keyringRequestTag, keyringRequest{ID: 2, Op: KeyringList, ReplyTo: "[::1]:1", From: "2"}))
	f.Add(encodeKeyringMsg(keyringResponseTag, keyringResponse{ID: 1, Node: 2, Keys: [][]byte{make([]byte, 32)}, Primary: make([]byte, 32)}))
	f.Add([]byte("K{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		req, resp, err := decodeKeyringMsg(b)
		if err != nil {
			if req != nil || resp != nil {
				t.Fatal("error with a message")
			}
			return
		}
		if (req == nil) == (resp == nil) {
			t.Fatal("want exactly one of request and response")
		}
		if req != nil {
			again, _, err := decodeKeyringMsg(encodeKeyringMsg(keyringRequestTag, *req))
			if err != nil || !reflect.DeepEqual(again, req) {
				t.Fatalf("request does not round-trip: %+v %+v %v", req, again, err)
			}
		}
	})
}
