package directory

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/hashicorp/memberlist"
)

// TestDecodeMetaProtoVersion: metadata of another protocol version, and
// that of the releases before the version existed, are refused with
// ErrProtoVersion naming the node and both versions; the refusal is
// logged once per node and version, and the node never enters the queue.
func TestDecodeMetaProtoVersion(t *testing.T) {
	// What a node of the previous release gossips (no "proto").
	old := []byte(`{"id":3,"grpc":"127.0.0.1:7003","verbs":"127.0.0.1:7103","raft":"127.0.0.1:7203","rpc":"127.0.0.1:7303","expect":3,"nonce":4660}`)
	m, err := decodeMeta(old)
	if !errors.Is(err, ErrProtoVersion) || !strings.Contains(err.Error(), "node n3 speaks gossip protocol version 0, this node speaks "+strconv.Itoa(ProtoVersion)) {
		t.Fatalf("previous release's metadata: %+v, %v", m, err)
	}
	next := encodeMeta(nodeMeta{Proto: ProtoVersion + 1, ID: 4, RaftAddr: "127.0.0.1:1", RPCAddr: "127.0.0.1:2", Nonce: 1})
	if _, err := decodeMeta(next); !errors.Is(err, ErrProtoVersion) {
		t.Fatalf("next version's metadata: %v", err)
	}
	cur := nodeMeta{Proto: ProtoVersion, ID: 5, RaftAddr: "127.0.0.1:1", RPCAddr: "127.0.0.1:2", Nonce: 1}
	if got, err := decodeMeta(encodeMeta(cur)); err != nil || got != cur {
		t.Fatalf("current metadata: %+v, %v", got, err)
	}

	var logs bytes.Buffer
	g := newGossip(nodeMeta{ID: 1, RaftAddr: "127.0.0.1:1", RPCAddr: "127.0.0.1:2", Nonce: 1}, slog.New(slog.NewTextHandler(&logs, nil)))
	if !bytes.Contains(g.NodeMeta(memberlist.MetaMaxSize), []byte(fmt.Sprintf(`"proto":%d`, ProtoVersion))) {
		t.Fatalf("own metadata without the version: %s", g.NodeMeta(memberlist.MetaMaxSize))
	}
	n := &memberlist.Node{Name: "3", Addr: net.ParseIP("127.0.0.1"), Port: 7000, Meta: old}
	g.NotifyJoin(n)
	g.NotifyUpdate(n)
	if c := strings.Count(logs.String(), "refusing a node of another release"); c != 1 {
		t.Fatalf("logged %d refusals, want 1:\n%s", c, logs.String())
	}
	if g.drain() || len(g.snapshot()) != 0 || g.dropped.Load() != 2 {
		t.Fatalf("the refused node was queued: %v dropped %d", g.snapshot(), g.dropped.Load())
	}
}
