package directory

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"

	"github.com/hashicorp/memberlist"

	"github.com/dsmkit/dsm/internal/ids"
)

// Gossip encryption. With a keyring, memberlist encrypts every gossip
// packet and stream with the primary key (AES-GCM) and accepts only those
// that one of the installed keys opens (GossipVerifyIncoming and
// GossipVerifyOutgoing): a process without a key cannot join, nor be
// heard. The keyring is kept in DataDir (KeyringFile), so that a restart
// keeps the keys installed at runtime.
//
// Keys are changed on every member at once by a keyring operation
// (Directory.Keyring): the node asked sends the operation to every alive
// gossip member as a memberlist user message, over memberlist's TCP
// stream, encrypted with the current keyring like any gossip (so only a
// key holder can send one), and each member applies it to its own keyring,
// writes its keyring file and answers. Rotation is install NEW, use NEW
// (refused until every member has NEW), remove OLD (refused for a key that
// is any member's primary).

// KeyringFile is the file in DataDir that holds the gossip keys: a JSON
// array of base64 keys, the primary first.
const KeyringFile = "gossip.keyring"

// Sentinel errors of keyring operations.
var (
	ErrGossipKey = errors.New("directory: invalid gossip key")
	// ErrNoEncryption: a keyring operation on a cluster that runs gossip
	// without encryption.
	ErrNoEncryption = errors.New("directory: gossip encryption is off")
	// ErrKeyNotInstalled: use of a key that some member lacks.
	ErrKeyNotInstalled = errors.New("directory: key not installed on every member")
	// ErrPrimaryKey: remove of a key that is some member's primary.
	ErrPrimaryKey = errors.New("directory: key is a primary key")
)

// KeyringOp is a keyring operation.
type KeyringOp uint8

// Keyring operations.
const (
	KeyringList KeyringOp = 1 + iota
	KeyringInstall
	KeyringUse
	KeyringRemove
)

func (o KeyringOp) String() string {
	switch o {
	case KeyringList:
		return "list"
	case KeyringInstall:
		return "install"
	case KeyringUse:
		return "use"
	case KeyringRemove:
		return "remove"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// NewGossipKey draws a new 32-byte key (AES-256).
func NewGossipKey() []byte {
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		panic("directory: no randomness for a gossip key: " + err.Error())
	}
	return k
}

// ParseGossipKey decodes a base64 key of 16, 24 or 32 bytes.
func ParseGossipKey(s string) ([]byte, error) {
	k, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("%w: not base64 (make one with dsmctl keygen)", ErrGossipKey)
	}
	if err := memberlist.ValidateKey(k); err != nil {
		return nil, fmt.Errorf("%w: %d bytes, want 16, 24 or 32 (make one with dsmctl keygen)", ErrGossipKey, len(k))
	}
	return k, nil
}

// EncodeGossipKey is the base64 form of a key.
func EncodeGossipKey(k []byte) string { return base64.StdEncoding.EncodeToString(k) }

// ParseKeyringFile reads the content of a keyring file: a JSON array of
// base64 keys, the primary first.
func ParseKeyringFile(b []byte) ([][]byte, error) {
	var strs []string
	if err := json.Unmarshal(b, &strs); err != nil {
		return nil, fmt.Errorf("%w: keyring file: want a JSON array of base64 keys: %v", ErrGossipKey, err)
	}
	if len(strs) == 0 {
		return nil, fmt.Errorf("%w: keyring file holds no key", ErrGossipKey)
	}
	var keys [][]byte
	for i, s := range strs {
		k, err := ParseGossipKey(s)
		if err != nil {
			return nil, fmt.Errorf("keyring file, key %d: %w", i+1, err)
		}
		if !slices.ContainsFunc(keys, func(x []byte) bool { return bytes.Equal(x, k) }) {
			keys = append(keys, k)
		}
	}
	return keys, nil
}

func encodeKeyringFile(primary []byte, keys [][]byte) []byte {
	strs := []string{EncodeGossipKey(primary)}
	for _, k := range keys {
		if !bytes.Equal(k, primary) {
			strs = append(strs, EncodeGossipKey(k))
		}
	}
	b, _ := json.Marshal(strs)
	return append(b, '\n')
}

// openKeyring returns the keyring gossip starts with: the one kept in
// dir if there is one (it holds what was installed at runtime), else
// keys, written to dir. Nil (and no file) without either: no encryption.
func openKeyring(dir string, keys [][]byte) (*memberlist.Keyring, bool, error) {
	path := filepath.Join(dir, KeyringFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		kept, err := ParseKeyringFile(b)
		if err != nil {
			return nil, false, fmt.Errorf("%s: %w", path, err)
		}
		kr, err := memberlist.NewKeyring(kept, kept[0])
		if err != nil {
			return nil, false, fmt.Errorf("%w: %s: %v", ErrGossipKey, path, err)
		}
		return kr, true, nil
	case !os.IsNotExist(err):
		return nil, false, fmt.Errorf("directory: keyring: %w", err)
	case len(keys) == 0:
		return nil, false, nil
	}
	kr, err := memberlist.NewKeyring(keys, keys[0])
	if err != nil {
		return nil, false, fmt.Errorf("%w: %v", ErrGossipKey, err)
	}
	if err := writeKeyring(dir, kr); err != nil {
		return nil, false, err
	}
	return kr, false, nil
}

// writeKeyring replaces the keyring file atomically (mode 0600).
func writeKeyring(dir string, kr *memberlist.Keyring) error {
	tmp, err := os.CreateTemp(dir, KeyringFile+".tmp*")
	if err != nil {
		return fmt.Errorf("directory: keyring: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(encodeKeyringFile(kr.GetPrimaryKey(), kr.GetKeys())); err != nil {
		tmp.Close()
		return fmt.Errorf("directory: keyring: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("directory: keyring: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("directory: keyring: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, KeyringFile)); err != nil {
		return fmt.Errorf("directory: keyring: %w", err)
	}
	return nil
}

// The keyring messages: a memberlist user message whose first byte says
// which, then JSON.
const (
	keyringRequestTag  = 'K'
	keyringResponseTag = 'k'
	maxKeyringMsg      = 64 << 10
)

type keyringRequest struct {
	ID uint64    `json:"id"`
	Op KeyringOp `json:"op"`
	// Key is the key installed, used or removed (none for list).
	Key []byte `json:"key,omitempty"`
	// ReplyTo is the asking node's gossip address and name.
	ReplyTo string `json:"reply_to"`
	From    string `json:"from"`
}

type keyringResponse struct {
	ID   uint64     `json:"id"`
	Node ids.NodeID `json:"node"`
	// Keys and Primary are the member's keyring after the operation.
	Keys    [][]byte `json:"keys,omitempty"`
	Primary []byte   `json:"primary,omitempty"`
	Err     string   `json:"err,omitempty"`
}

func encodeKeyringMsg(tag byte, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("directory: encode keyring message: " + err.Error())
	}
	return append([]byte{tag}, b...)
}

// decodeKeyringMsg parses a user message from the network: a request or
// a response (the other is nil).
func decodeKeyringMsg(b []byte) (*keyringRequest, *keyringResponse, error) {
	if len(b) < 2 || len(b) > maxKeyringMsg {
		return nil, nil, fmt.Errorf("%w: keyring message of %d bytes", ErrBadFrame, len(b))
	}
	dec := json.NewDecoder(bytes.NewReader(b[1:]))
	dec.DisallowUnknownFields()
	switch b[0] {
	case keyringRequestTag:
		var r keyringRequest
		if err := dec.Decode(&r); err != nil || dec.More() {
			return nil, nil, fmt.Errorf("%w: keyring request: %v", ErrBadFrame, err)
		}
		if r.Op < KeyringList || r.Op > KeyringRemove {
			return nil, nil, fmt.Errorf("%w: keyring op %d", ErrBadFrame, r.Op)
		}
		if r.Op != KeyringList && memberlist.ValidateKey(r.Key) != nil {
			return nil, nil, fmt.Errorf("%w: keyring %v of a key of %d bytes", ErrBadFrame, r.Op, len(r.Key))
		}
		if _, _, err := splitGossipAddr(r.ReplyTo); err != nil || r.From == "" {
			return nil, nil, fmt.Errorf("%w: keyring request from %q at %q", ErrBadFrame, r.From, r.ReplyTo)
		}
		return &r, nil, nil
	case keyringResponseTag:
		var r keyringResponse
		if err := dec.Decode(&r); err != nil || dec.More() {
			return nil, nil, fmt.Errorf("%w: keyring response: %v", ErrBadFrame, err)
		}
		return nil, &r, nil
	}
	return nil, nil, fmt.Errorf("%w: user message tag %#x", ErrBadFrame, b[0])
}

func splitGossipAddr(a string) (string, uint16, error) {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return "", 0, err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || net.ParseIP(host) == nil {
		return "", 0, fmt.Errorf("bad gossip address %q", a)
	}
	return host, uint16(p), nil
}

// keyrings is the directory's side of keyring operations.
type keyrings struct {
	kr  *memberlist.Keyring // nil: no encryption
	dir string

	mu      sync.Mutex // serializes local changes and their file writes
	pending sync.Map   // request id -> chan keyringResponse

	// handlers of requests from other members
	hmu     sync.Mutex
	closing bool
	hwg     sync.WaitGroup
}

// snapshot copies the keys and the primary. (memberlist's GetKeys hands
// out its own slice, which RemoveKey later rewrites in place.)
func (k *keyrings) snapshot() (keys [][]byte, primary []byte) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, key := range k.kr.GetKeys() {
		keys = append(keys, slices.Clone(key))
	}
	return keys, slices.Clone(k.kr.GetPrimaryKey())
}

// start counts a handler in, unless the directory is closing.
func (k *keyrings) start() bool {
	k.hmu.Lock()
	defer k.hmu.Unlock()
	if k.closing {
		return false
	}
	k.hwg.Add(1)
	return true
}

// close waits for the handlers and refuses new ones.
func (k *keyrings) close() {
	k.hmu.Lock()
	k.closing = true
	k.hmu.Unlock()
	k.hwg.Wait()
}

// apply runs op on the local keyring and writes the file.
func (k *keyrings) apply(op KeyringOp, key []byte) error {
	if k.kr == nil {
		return ErrNoEncryption
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	var err error
	switch op {
	case KeyringList:
		return nil
	case KeyringInstall:
		err = k.kr.AddKey(key)
	case KeyringUse:
		if !slices.ContainsFunc(k.kr.GetKeys(), func(x []byte) bool { return bytes.Equal(x, key) }) { // under k.mu: no change meanwhile
			return fmt.Errorf("%w: not installed here", ErrKeyNotInstalled)
		}
		err = k.kr.UseKey(key)
	case KeyringRemove:
		if bytes.Equal(k.kr.GetPrimaryKey(), key) {
			return fmt.Errorf("%w: it is the primary key here", ErrPrimaryKey)
		}
		err = k.kr.RemoveKey(key)
	default:
		return fmt.Errorf("directory: unknown keyring op %d", op)
	}
	if err != nil {
		return fmt.Errorf("directory: keyring %v: %w", op, err)
	}
	return writeKeyring(k.dir, k.kr)
}

// KeyStatus is one key as the members report it.
type KeyStatus struct {
	Key []byte
	// Installed counts the members that hold the key, Primary those that
	// encrypt with it.
	Installed, Primary int
}

// KeyringResult is the outcome of a keyring operation over the members.
type KeyringResult struct {
	// Members is the number of members asked (every alive gossip member,
	// this one included).
	Members int
	// Keys are the keys the members that answered hold.
	Keys []KeyStatus
	// Errors are the members that failed the operation or did not answer,
	// with why.
	Errors map[ids.NodeID]string
}

// Keyring runs a keyring operation on every alive member and reports
// their keyrings after it. A use is refused (ErrKeyNotInstalled) unless
// every member holds the key, a remove (ErrPrimaryKey) while the key is
// any member's primary. Members that fail or do not answer within ctx are
// listed in Errors; the others have applied the operation.
func (d *Directory) Keyring(ctx context.Context, op KeyringOp, key []byte) (KeyringResult, error) {
	if d.keys.kr == nil {
		return KeyringResult{}, fmt.Errorf("%w: start every dsmd with --gossip-key to turn it on", ErrNoEncryption)
	}
	if op != KeyringList {
		if err := memberlist.ValidateKey(key); err != nil {
			return KeyringResult{}, fmt.Errorf("%w: %d bytes, want 16, 24 or 32", ErrGossipKey, len(key))
		}
	}
	if op == KeyringUse || op == KeyringRemove {
		res, err := d.Keyring(ctx, KeyringList, nil)
		if err != nil {
			return res, err
		}
		if len(res.Errors) > 0 {
			return res, fmt.Errorf("directory: keyring %v: not every member answered: %s", op, errorList(res.Errors))
		}
		i := slices.IndexFunc(res.Keys, func(s KeyStatus) bool { return bytes.Equal(s.Key, key) })
		switch {
		case op == KeyringUse && (i < 0 || res.Keys[i].Installed < res.Members):
			have := 0
			if i >= 0 {
				have = res.Keys[i].Installed
			}
			return res, fmt.Errorf("%w: %d of %d members hold it; install it first", ErrKeyNotInstalled, have, res.Members)
		case op == KeyringRemove && i >= 0 && res.Keys[i].Primary > 0:
			return res, fmt.Errorf("%w on %d of %d members; use another key first", ErrPrimaryKey, res.Keys[i].Primary, res.Members)
		}
	}
	return d.keyringFanout(ctx, op, key)
}

func errorList(errs map[ids.NodeID]string) string {
	var s []string
	for _, id := range slices.Sorted(func(yield func(ids.NodeID) bool) {
		for id := range errs {
			if !yield(id) {
				return
			}
		}
	}) {
		s = append(s, fmt.Sprintf("%v: %s", id, errs[id]))
	}
	return fmt.Sprint(s)
}

// nextKeyringID names a request (answers are matched by it).
func nextKeyringID() uint64 { return mrand.Uint64() }

// keyringFanout applies op here and on every other alive gossip member.
func (d *Directory) keyringFanout(ctx context.Context, op KeyringOp, key []byte) (KeyringResult, error) {
	self := d.cfg.NodeID
	var targets []gossipEntry
	for id, e := range d.gossip.snapshot() {
		if id != self && e.state == gossipAlive {
			targets = append(targets, e)
		}
	}
	res := KeyringResult{Members: len(targets) + 1, Errors: map[ids.NodeID]string{}}
	// A member the directory has alive that gossip here does not know yet
	// is not skipped silently: "every member" must mean every member.
	for _, m := range d.View().Members() {
		if m.State == StateAlive && m.ID != self && !slices.ContainsFunc(targets, func(e gossipEntry) bool { return e.meta.ID == m.ID }) {
			res.Members++
			res.Errors[m.ID] = "alive in the directory but not in this node's gossip view: retry"
		}
	}
	var replies []keyringResponse
	add := func(r keyringResponse) {
		if r.Err != "" {
			res.Errors[r.Node] = r.Err
			return
		}
		replies = append(replies, r)
	}
	// Here first: a use or remove that fails here fails before the others
	// change.
	local := keyringResponse{Node: self}
	if err := d.keys.apply(op, key); err != nil {
		local.Err = err.Error()
		if op != KeyringList {
			return res, err
		}
	}
	local.Keys, local.Primary = d.keys.snapshot()
	add(local)

	id := nextKeyringID()
	ch := make(chan keyringResponse, len(targets))
	d.keys.pending.Store(id, ch)
	defer d.keys.pending.Delete(id)
	msg := encodeKeyringMsg(keyringRequestTag, keyringRequest{ID: id, Op: op, Key: key,
		ReplyTo: d.gossipAddr, From: nodeName(self)})
	waiting := map[ids.NodeID]bool{}
	for _, e := range targets {
		host, port, err := splitGossipAddr(e.addr)
		if err != nil {
			res.Errors[e.meta.ID] = err.Error()
			continue
		}
		to := &memberlist.Node{Name: nodeName(e.meta.ID), Addr: net.ParseIP(host), Port: port}
		if err := d.ml.SendReliable(to, msg); err != nil {
			res.Errors[e.meta.ID] = fmt.Sprintf("unreachable: %v", err)
			continue
		}
		waiting[e.meta.ID] = true
	}
	for len(waiting) > 0 {
		select {
		case r := <-ch:
			if waiting[r.Node] {
				delete(waiting, r.Node)
				add(r)
			}
		case <-ctx.Done():
			for id := range waiting {
				res.Errors[id] = "no answer: " + ctx.Err().Error()
			}
			waiting = nil
		case <-d.closeCh:
			return res, ErrClosed
		}
	}
	for _, r := range replies {
		for _, k := range r.Keys {
			i := slices.IndexFunc(res.Keys, func(s KeyStatus) bool { return bytes.Equal(s.Key, k) })
			if i < 0 {
				res.Keys = append(res.Keys, KeyStatus{Key: k})
				i = len(res.Keys) - 1
			}
			res.Keys[i].Installed++
			if bytes.Equal(k, r.Primary) {
				res.Keys[i].Primary++
			}
		}
	}
	slices.SortFunc(res.Keys, func(a, b KeyStatus) int {
		if a.Primary != b.Primary {
			return b.Primary - a.Primary
		}
		return bytes.Compare(a.Key, b.Key)
	})
	if len(res.Errors) == 0 {
		res.Errors = nil
	}
	return res, nil
}

// onUserMsg handles a memberlist user message (NotifyMsg: it must not
// block).
func (d *Directory) onUserMsg(b []byte) {
	req, resp, err := decodeKeyringMsg(b)
	if err != nil {
		d.log.Debug("directory: bad user message", "err", err)
		return
	}
	if resp != nil {
		if ch, ok := d.keys.pending.Load(resp.ID); ok {
			select {
			case ch.(chan keyringResponse) <- *resp:
			default:
			}
		}
		return
	}
	if !d.keys.start() {
		return
	}
	go func() {
		defer d.keys.hwg.Done()
		r := keyringResponse{ID: req.ID, Node: d.cfg.NodeID}
		if err := d.keys.apply(req.Op, req.Key); err != nil {
			r.Err = err.Error()
		} else {
			d.log.Info("directory: gossip keyring changed", "op", req.Op, "by", req.From)
		}
		if d.keys.kr != nil {
			r.Keys, r.Primary = d.keys.snapshot()
		}
		host, port, _ := splitGossipAddr(req.ReplyTo)
		to := &memberlist.Node{Name: req.From, Addr: net.ParseIP(host), Port: port}
		if err := d.ml.SendReliable(to, encodeKeyringMsg(keyringResponseTag, r)); err != nil {
			d.log.Warn("directory: keyring answer not sent", "to", req.From, "err", err)
		}
	}()
}
