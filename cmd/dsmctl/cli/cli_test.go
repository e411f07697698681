package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/goleak"

	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// result is what one dsmctl run left behind.
type result struct {
	stdout, stderr string
	code           int
}

type runOpts struct {
	stdin string
	tty   bool
	env   map[string]string
}

// run runs dsmctl in-process with args against the socket sock.
func run(t *testing.T, sock string, o runOpts, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	env := Env{
		Stdin:     strings.NewReader(o.stdin),
		Stdout:    &out,
		Stderr:    &errb,
		Getenv:    func(k string) string { return o.env[k] },
		StdoutTTY: o.tty,
		Now:       func() time.Time { return time.Unix(0, fakeNow) },
	}
	if sock != "" {
		args = append([]string{"--addr", sock}, args...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code := Run(ctx, args, env)
	return result{out.String(), errb.String(), code}
}

func (r result) ok(t *testing.T) result {
	t.Helper()
	if r.code != ExitOK {
		t.Fatalf("exit code %d, want 0; stderr: %s", r.code, r.stderr)
	}
	return r
}

// golden compares got with testdata/name.golden, or rewrites it under
// -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s (run with -update if the change is intended)\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

func decode(t *testing.T, s string, v any) {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(s))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		t.Fatalf("not the documented JSON: %v\n%s", err, s)
	}
}

func TestGolden(t *testing.T) {
	f, sock := serveFake(t)
	_ = f
	for _, c := range []struct {
		name string
		args []string
	}{
		{"status", []string{"status"}},
		{"members", []string{"members"}},
		{"raft", []string{"raft"}},
		{"region-ls", []string{"region", "ls"}},
		{"region-info", []string{"region", "info", "feat"}},
		{"pages-small", []string{"pages", "small"}},
		{"pages-small-local", []string{"pages", "small", "--local", "--width", "32"}},
		{"pages-big", []string{"pages", "feat"}},
		{"pages-big-range", []string{"pages", "feat", "--range", "15000:19000", "--max-cells", "256", "--width", "32"}},
		{"top", []string{"top", "--count", "2", "--interval", "1ms"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := run(t, sock, runOpts{}, c.args...).ok(t)
			if strings.Contains(r.stdout, "\x1b[") {
				t.Errorf("colors written to a non-terminal:\n%q", r.stdout)
			}
			golden(t, c.name, r.stdout)
		})
	}
}

func TestMembersRemove(t *testing.T) {
	_, sock := serveFake(t)
	if r := run(t, sock, runOpts{}, "members", "remove", "n3").ok(t); r.stdout != "n3 removed in epoch 13: the shards it was home of move to their backups\n" {
		t.Errorf("members remove n3: %q", r.stdout)
	}
	var v struct {
		Node  uint32 `json:"node_id"`
		Epoch uint64 `json:"epoch"`
	}
	decode(t, run(t, sock, runOpts{}, "members", "remove", "3", "--json").ok(t).stdout, &v)
	if v.Node != 3 || v.Epoch != 13 {
		t.Errorf("members remove 3 --json: %+v", v)
	}
}

func TestStatusExitCodes(t *testing.T) {
	f, sock := serveFake(t)
	for _, c := range []struct {
		verdict dsmpb.Health_Verdict
		code    int
		word    string
	}{
		{dsmpb.Health_VERDICT_HEALTHY, ExitOK, "healthy"},
		{dsmpb.Health_VERDICT_DEGRADED, ExitDegraded, "degraded"},
		{dsmpb.Health_VERDICT_UNHEALTHY, ExitUnhealthy, "unhealthy"},
		{dsmpb.Health_VERDICT_UNSPECIFIED, ExitUnhealthy, "unknown"},
	} {
		f.mu.Lock()
		f.verdict = c.verdict
		f.reasons = nil
		if c.verdict != dsmpb.Health_VERDICT_HEALTHY {
			f.reasons = []string{"n3 is dead: its 2 shards failed over", "shard 2 of feat has no backup"}
		}
		f.mu.Unlock()
		for _, asJSON := range []bool{false, true} {
			args := []string{"status"}
			if asJSON {
				args = append(args, "--json")
			}
			r := run(t, sock, runOpts{}, args...)
			if r.code != c.code {
				t.Errorf("%v json=%v: exit code %d, want %d", c.verdict, asJSON, r.code, c.code)
			}
			if !asJSON {
				if !strings.Contains(r.stdout, "health: "+c.word+"\n") {
					t.Errorf("%v: no verdict line in\n%s", c.verdict, r.stdout)
				}
				continue
			}
			var v statusJSON
			decode(t, r.stdout, &v)
			if v.Health != c.word || len(v.Nodes) != 3 || v.Leader != 1 || v.Term != 7 || v.Epoch != 12 {
				t.Errorf("%v: status JSON %+v", c.verdict, v)
			}
			if c.verdict != dsmpb.Health_VERDICT_HEALTHY && (len(v.Reasons) != 2 || v.Nodes[2].Error == "") {
				t.Errorf("%v: reasons %q, n3 error %q", c.verdict, v.Reasons, v.Nodes[2].Error)
			}
		}
	}
	f.mu.Lock()
	f.verdict = dsmpb.Health_VERDICT_DEGRADED
	f.reasons = []string{"n3 is dead: its 2 shards failed over"}
	f.mu.Unlock()
	golden(t, "status-degraded", run(t, sock, runOpts{}, "status").stdout)
}

func TestJSON(t *testing.T) {
	_, sock := serveFake(t)

	var regions struct {
		Epoch   uint64       `json:"epoch"`
		Regions []regionJSON `json:"regions"`
	}
	decode(t, run(t, sock, runOpts{}, "region", "ls", "--json").ok(t).stdout, &regions)
	if len(regions.Regions) != 2 || regions.Regions[0].Name != "feat" || regions.Regions[0].Size != 1<<30 ||
		regions.Regions[0].Pages != 1<<18 || regions.Regions[0].Durability != "durable" || regions.Regions[1].Durability != "memory" {
		t.Errorf("region ls --json: %+v", regions)
	}

	var raft raftJSON
	decode(t, run(t, sock, runOpts{}, "raft", "--json").ok(t).stdout, &raft)
	if raft.Leader != 1 || len(raft.Voters) != 3 || len(raft.NonVoters) != 1 || raft.NonVoters[0] != 4 {
		t.Errorf("raft --json: %+v", raft)
	}

	var members struct {
		Epoch        uint64       `json:"epoch"`
		Members      []memberJSON `json:"members"`
		ProtoIDsLeft uint32       `json:"proto_ids_left"`
	}
	decode(t, run(t, sock, runOpts{}, "members", "--json").ok(t).stdout, &members)
	if len(members.Members) != 3 || members.Members[1].State != "alive" || members.Members[1].RaftAddr != "127.0.0.1:7502" ||
		members.Members[1].Incarnation != 2 || members.Members[1].ProtoID != 4 || members.ProtoIDsLeft != 1018 {
		t.Errorf("members --json: %+v", members)
	}

	var info regionInfoJSON
	decode(t, run(t, sock, runOpts{}, "region", "info", "feat", "--json").ok(t).stdout, &info)
	var pages uint64
	for _, s := range info.Shards {
		pages += s.PageCount
	}
	if len(info.Shards) != 4 || pages != 1<<18 || len(info.Homes) != 3 || info.Homes[0].Shards != 2 ||
		info.ShardCount != 4 || info.NextShard != 4 || !info.HomesComplete || len(info.Mappings) != 3 {
		t.Errorf("region info --json: %+v", info)
	}
}

// pagesJSON is the documented shape of `pages --json`.
type pagesJSON struct {
	Region    regionJSON        `json:"region"`
	Node      uint32            `json:"node_id"`
	FirstPage uint64            `json:"first_page"`
	PageCount uint64            `json:"page_count"`
	Group     uint64            `json:"group"`
	Cluster   bool              `json:"cluster"`
	Legend    map[string]string `json:"legend"`
	Cells     []pageCellJSON    `json:"cells"`
}

func TestPagesJSON(t *testing.T) {
	_, sock := serveFake(t)
	var v pagesJSON
	decode(t, run(t, sock, runOpts{}, "pages", "small", "--range", "10:40", "--json").ok(t).stdout, &v)
	if v.FirstPage != 10 || v.PageCount != 30 || v.Group != 1 || len(v.Cells) != 30 || !v.Cluster {
		t.Fatalf("pages --json header: %+v", v)
	}
	for _, c := range v.Cells {
		owner, sharers := pageState(c.FirstPage, 100)
		var want string
		switch {
		case owner != 0:
			want = v.Legend[c.Symbol]
			if want != "M at "+node(owner) || len(c.Owners) != 1 || c.Owners[0] != owner {
				t.Errorf("page %d: symbol %q (%q), owners %v; want M at n%d", c.FirstPage, c.Symbol, want, c.Owners, owner)
			}
		case sharers > 0:
			if c.Symbol != string(rune('0'+sharers)) || len(c.Sharers) != sharers {
				t.Errorf("page %d: symbol %q sharers %v; want S at %d", c.FirstPage, c.Symbol, c.Sharers, sharers)
			}
		default:
			if c.Symbol != "." || c.Invalid != 1 {
				t.Errorf("page %d: symbol %q invalid %d; want I", c.FirstPage, c.Symbol, c.Invalid)
			}
		}
	}

	// A big range is grouped so that at most --max-cells cells come back.
	decode(t, run(t, sock, runOpts{}, "pages", "feat", "--max-cells", "1000", "--json").ok(t).stdout, &v)
	if v.PageCount != 1<<18 || v.Group != 263 || len(v.Cells) != 997 {
		t.Fatalf("pages big: count %d group %d cells %d; want 262144, 263, 997", v.PageCount, v.Group, len(v.Cells))
	}
	var total uint64
	for _, c := range v.Cells {
		total += c.Pages
		if c.Modified > 0 && len(c.Owners) > 1 && c.Symbol != "*" {
			t.Errorf("cell at %d: M at %v drawn as %q, want *", c.FirstPage, c.Owners, c.Symbol)
		}
	}
	if total != 1<<18 {
		t.Errorf("cells cover %d pages, want %d", total, 1<<18)
	}
}

func TestPutGet(t *testing.T) {
	f, sock := serveFake(t)
	run(t, sock, runOpts{}, "put", "small", "4KiB", "hello, coherent world").ok(t)
	r := run(t, sock, runOpts{}, "get", "small", "0x1000", "21", "--raw").ok(t)
	if r.stdout != "hello, coherent world" {
		t.Errorf("get --raw = %q", r.stdout)
	}
	run(t, sock, runOpts{}, "put", "small", "8200", "deadbeef", "--hex").ok(t)
	run(t, sock, runOpts{stdin: "from stdin"}, "put", "small", "8300", "-").ok(t)
	var g struct {
		Region string `json:"region"`
		Offset uint64 `json:"offset"`
		Length uint64 `json:"length"`
		Data   []byte `json:"data"`
	}
	decode(t, run(t, sock, runOpts{}, "get", "small", "8200", "4", "--json").ok(t).stdout, &g)
	if !bytes.Equal(g.Data, []byte{0xde, 0xad, 0xbe, 0xef}) || g.Offset != 8200 {
		t.Errorf("get --json = %+v", g)
	}
	// A read across a chunk boundary takes several requests and keeps the order.
	big := strings.Repeat("0123456789abcdef", 1<<16+3) // 1 MiB + 48 bytes
	before := f.writes
	run(t, sock, runOpts{stdin: big}, "put", "feat", "100", "-").ok(t)
	if f.writes-before != 2 {
		t.Errorf("a put of 1 MiB + 48 bytes took %d requests, want 2", f.writes-before)
	}
	if r := run(t, sock, runOpts{}, "get", "feat", "100", "1048624", "--raw").ok(t); r.stdout != big {
		t.Errorf("get of %d bytes differs from what put wrote", len(big))
	}
	// A failure after the first chunk says how far the write got.
	r = run(t, sock, runOpts{stdin: big}, "put", "feat", fmt.Sprint(1<<30-(1<<20)-10), "-")
	if r.code != ExitUsage || !strings.HasPrefix(r.stderr, "dsmctl: after 1048576 of 1048624 bytes: bytes ") ||
		!strings.Contains(r.stderr, `outside region "feat"`) {
		t.Errorf("put past the end: exit %d, %q", r.code, r.stderr)
	}
	golden(t, "get", run(t, sock, runOpts{}, "get", "small", "0xff0", "0x220").ok(t).stdout)
}

func TestErrors(t *testing.T) {
	_, sock := serveFake(t)
	for _, c := range []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"region", "info", "nope"}, ExitError, []string{`region "nope" not found`, "dsmctl region ls"}},
		{[]string{"pages", "nope"}, ExitError, []string{`region "nope" not found`}},
		{[]string{"get", "small", "409590", "100"}, ExitUsage, []string{"outside region", "small"}},
		{[]string{"region", "create", "feat", "1GiB"}, ExitError, []string{"region exists with a different spec"}},
		{[]string{"region", "rm", "nope"}, ExitError, []string{`region "nope" not found`}},
		{[]string{"region", "create", "x", "12XB"}, ExitUsage, []string{"unknown unit", "dsmctl region create --help"}},
		{[]string{"region", "create", "x"}, ExitUsage, []string{"takes NAME and SIZE, got 1 argument"}},
		{[]string{"pages", "small", "--range", "50:200"}, ExitUsage, []string{"has 100 pages"}},
		{[]string{"pages", "small", "--range", "7"}, ExitUsage, []string{"FIRST:END"}},
		{[]string{"status", "--bogus"}, ExitUsage, []string{"unknown flag: --bogus"}},
		{[]string{"frobnicate"}, ExitUsage, []string{`unknown command "frobnicate"`}},
		{[]string{"put", "small", "0", "zz", "--hex"}, ExitUsage, []string{"not hex"}},
		{[]string{"get", "small", "0", "0"}, ExitUsage, []string{"LEN is zero"}},
		{[]string{"members", "remove", "n2"}, ExitError, []string{"n2 is alive", "only a failed member can be removed"}},
		{[]string{"members", "remove", "9"}, ExitError, []string{"no such member: n9"}},
		{[]string{"members", "remove", "x3"}, ExitUsage, []string{`"x3" is not a node id`}},
		{[]string{"get", "lost", "4096", "8"}, ExitError, []string{"page p1 of region lost (r9) unavailable: its home n3 failed in epoch 7 — see `dsmctl members`"}},
		{[]string{"region", "info", "leaderless"}, ExitError, []string{"dsmd at " + sock + ": unavailable: no Raft leader", "retry"}},
		{[]string{"region", "info", "slow", "--timeout", "50ms"}, ExitError, []string{"dsmd at " + sock + " did not answer within 50ms", "raise --timeout"}},
	} {
		r := run(t, sock, runOpts{}, c.args...)
		if r.code != c.code {
			t.Errorf("%v: exit code %d, want %d (stderr %q)", c.args, r.code, c.code, r.stderr)
		}
		if !strings.HasPrefix(r.stderr, "dsmctl: ") || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("%v: stderr is not one dsmctl line: %q", c.args, r.stderr)
		}
		for _, w := range c.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("%v: stderr %q lacks %q", c.args, r.stderr, w)
			}
		}
	}
}

// TestUsageErrors checks the one rule of arguments: whatever finds them
// wrong, dsmctl or dsmd, the exit code is ExitUsage and stderr ends in one
// line that starts "dsmctl: " once.
func TestUsageErrors(t *testing.T) {
	_, sock := serveFake(t)
	for _, c := range []struct {
		args []string
		want string // the last line of stderr, from its start
	}{
		{[]string{"region", "create", "x", "abc"}, `dsmctl: bad size "abc": want a number and an optional unit`},
		{[]string{"region", "create", "x", "0"}, "dsmctl: SIZE is zero"},
		{[]string{"region", "create", "x", "6KiB"}, "dsmctl: SIZE 6KiB is not a whole number of 4 KiB pages"},
		{[]string{"region", "create", "x", "1GiB", "--page-size", "3KiB"}, "dsmctl: --page-size 3KiB is not a power of two"},
		{[]string{"region", "create", "x", "4GiB", "--page-size", "4MiB"}, "dsmctl: bad page size: 4194304 is not a power of two in [4096, 2097152]\n"},
		{[]string{"region", "create", "x", "32TiB"}, "dsmctl: bad region size: 32 TiB is larger than the largest region, 16 TiB\n"},
		{[]string{"get", "small", "0", "zz"}, `dsmctl: LEN: bad size "zz"`},
		{[]string{"get", "small", "409590", "100"}, "dsmctl: bytes 409590+100 are outside region"},
		{[]string{"region"}, "dsmctl: region needs a subcommand: access, create, export, import, info, ls, rm\n"},
		{[]string{}, "dsmctl: no command given; the commands are "},
	} {
		r := run(t, sock, runOpts{}, c.args...)
		if r.code != ExitUsage {
			t.Errorf("%v: exit code %d, want %d (stderr %q)", c.args, r.code, ExitUsage, r.stderr)
		}
		lines := strings.SplitAfter(strings.TrimSuffix(r.stderr, "\n"), "\n")
		last := lines[len(lines)-1] + "\n"
		if !strings.HasPrefix(last, c.want) || strings.Contains(last, "dsmctl: dsmctl:") {
			t.Errorf("%v: stderr ends in %q, want it to start %q", c.args, last, c.want)
		}
		if len(c.args) < 2 { // a command that groups others: its help, then the line
			if !strings.Contains(r.stderr, "Available Commands:") || strings.Contains(r.stderr, "[flags]\n") || r.stdout != "" {
				t.Errorf("%v: no help on stderr (or output on stdout):\n%s", c.args, r.stderr)
			}
		} else if len(lines) != 1 {
			t.Errorf("%v: stderr is not one line: %q", c.args, r.stderr)
		}
	}
}

// TestUserMessage checks that messages of dsmd reach the user without the
// names of its internal packages.
func TestUserMessage(t *testing.T) {
	for in, want := range map[string]string{
		"directory: invalid region spec: Size: zero":                   "bad region size: zero",
		"directory: invalid region spec: PageSize: 3 is not":           "bad page size: 3 is not",
		"directory: invalid region spec: Name: starts with '.' or '-'": "bad region name: starts with '.' or '-'",
		"invalid region spec: Weird: no":                               "bad region weird: no",
		`region "x": directory: invalid region spec: Size: 5 exceeds`:  `region "x": bad region size: 5 exceeds`,
		"node: directory: region exists with a different spec":         "region exists with a different spec",
		"localcache: unknown region: r7 (the region is not set up)":    "unknown region: r7 (the region is not set up)",
		"n3 did not answer: engine: closed":                            "n3 did not answer: closed",
		"unknown node: 5":                                              "unknown node: 5",
		"node n3 (127.0.0.1:7403): connection\nrefused":                "node n3 (127.0.0.1:7403): connection refused",
		`region "feat" not found`:                                      `region "feat" not found`,
		"invalid region spec: two words: x":                            "invalid region spec: two words: x",
	} {
		if got := userMessage(in); got != want {
			t.Errorf("userMessage(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestNoDaemon(t *testing.T) {
	dir, err := os.MkdirTemp("", "dsmctl")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	missing := filepath.Join(dir, "none.sock")
	r := run(t, missing, runOpts{}, "status")
	if r.code != ExitError {
		t.Errorf("status without dsmd: exit code %d, want %d", r.code, ExitError)
	}
	for _, w := range []string{"dsmctl: dsmd at " + missing, "no socket there", "is dsmd running?"} {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("stderr %q lacks %q", r.stderr, w)
		}
	}
	if strings.Count(r.stderr, "\n") != 1 || strings.Contains(r.stderr, "goroutine") {
		t.Errorf("not one line: %q", r.stderr)
	}
	// A socket file with nobody listening: connection refused.
	refused := filepath.Join(dir, "refused.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: refused, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	r = run(t, refused, runOpts{}, "raft")
	if r.code != ExitError || !strings.Contains(r.stderr, "dsmd at "+refused+": connection refused — is dsmd running?") {
		t.Errorf("refused: exit %d, %q", r.code, r.stderr)
	}
	// $DSM_ADDR is the default of --addr.
	_, sock := serveFake(t)
	r = run(t, "", runOpts{env: map[string]string{AddrEnv: sock}}, "region", "ls")
	if r.code != ExitOK {
		t.Errorf("$%s not used: %q", AddrEnv, r.stderr)
	}
}

func TestColor(t *testing.T) {
	_, sock := serveFake(t)
	r := run(t, sock, runOpts{tty: true}, "pages", "small").ok(t)
	if !strings.Contains(r.stdout, "\x1b[") {
		t.Errorf("no colors on a terminal")
	}
	plain := run(t, sock, runOpts{}, "pages", "small").ok(t).stdout
	if stripANSI(r.stdout) != plain {
		t.Errorf("the colored grid is not the plain grid plus colors:\n%s\n%s", stripANSI(r.stdout), plain)
	}
	for _, env := range []map[string]string{{"NO_COLOR": "1"}, {"TERM": "dumb"}} {
		if r := run(t, sock, runOpts{tty: true, env: env}, "status").ok(t); strings.Contains(r.stdout, "\x1b[") {
			t.Errorf("colors despite %v", env)
		}
	}
	if r := run(t, sock, runOpts{tty: true}, "status", "--json").ok(t); strings.Contains(r.stdout, "\x1b[") {
		t.Errorf("colors in JSON")
	}
	// On a terminal top redraws the screen; elsewhere frames follow each other.
	if r := run(t, sock, runOpts{tty: true}, "top", "--once", "--interval", "1ms").ok(t); !strings.HasPrefix(r.stdout, "\x1b[H\x1b[2J") {
		t.Errorf("top on a terminal does not clear the screen: %q", r.stdout[:min(20, len(r.stdout))])
	}
}

func stripANSI(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == 0x1b {
			i += strings.IndexByte(s[i:], 'm')
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func TestTopJSON(t *testing.T) {
	f, sock := serveFake(t)
	r := run(t, sock, runOpts{}, "top", "--count", "3", "--interval", "1ms", "--json").ok(t)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d frames, want 3:\n%s", len(lines), r.stdout)
	}
	for _, l := range lines {
		var fr topFrameJSON
		decode(t, l, &fr)
		if len(fr.Nodes) != 3 {
			t.Fatalf("frame has %d nodes", len(fr.Nodes))
		}
		// The fake advances node i's misses by 50*i and its clock by 1 s per snapshot.
		for i, n := range fr.Nodes {
			if want := float64(50 * (i + 1)); n.MissesPerS != want {
				t.Errorf("n%d misses/s = %v, want %v", i+1, n.MissesPerS, want)
			}
			if want := float64(111 * (i + 1)); n.FaultsPerS != want {
				t.Errorf("n%d faults/s = %v, want %v", i+1, n.FaultsPerS, want)
			}
		}
	}
	if f.statsN != 4 {
		t.Errorf("%d snapshots for 3 frames, want 4", f.statsN)
	}
	f.mu.Lock()
	f.verdict = dsmpb.Health_VERDICT_DEGRADED
	f.mu.Unlock()
	r = run(t, sock, runOpts{}, "top", "--once").ok(t)
	if !strings.Contains(r.stdout, "? node n3 (127.0.0.1:7403): connection refused") {
		t.Errorf("a node in error is not shown:\n%s", r.stdout)
	}
}

func TestCompletion(t *testing.T) {
	for _, sh := range []string{"bash", "zsh", "fish"} {
		r := run(t, "", runOpts{}, "completion", sh).ok(t)
		if !strings.Contains(r.stdout, "dsmctl") || len(r.stdout) < 500 {
			t.Errorf("completion %s: %d bytes", sh, len(r.stdout))
		}
	}
}

// TestHelp checks that every command explains itself with an example.
func TestHelp(t *testing.T) {
	a := &app{env: Env{Getenv: func(string) string { return "" }}}
	root := a.rootCmd()
	var walk func(*cobra.Command)
	n := 0
	walk = func(c *cobra.Command) {
		if c.Name() != "help" && c.Name() != "completion" && c.Parent() != nil && c.Parent().Name() != "completion" {
			n++
			if c.Example == "" {
				t.Errorf("%s has no example", c.CommandPath())
			}
			if c.Short == "" {
				t.Errorf("%s has no short help", c.CommandPath())
			}
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	if n < 13 {
		t.Errorf("walked %d commands, want at least 13", n)
	}
	r := run(t, "", runOpts{}, "pages", "--help").ok(t)
	for _, w := range []string{"Examples:", "--range", "Modified (M) at one node", "--addr"} {
		if !strings.Contains(r.stdout, w) {
			t.Errorf("pages --help lacks %q", w)
		}
	}
}

func TestRegionCreateRm(t *testing.T) {
	f, sock := serveFake(t)
	r := run(t, sock, runOpts{}, "region", "create", "graph", "1TiB", "--page-size", "64KiB", "--durable").ok(t)
	if r.stdout != "created region graph (r3): 1 TiB in 64 KiB pages, durable, 4 shards\n" {
		t.Errorf("create said %q", r.stdout)
	}
	f.mu.Lock()
	g := f.regions["graph"]
	f.mu.Unlock()
	if g == nil || g.Size != 1<<40 || g.PageSize != 64<<10 || g.Durability != dsmpb.Durability_DURABILITY_DURABLE {
		t.Fatalf("region as created: %v", g)
	}
	var v struct {
		regionJSON
		Existed bool `json:"existed"`
	}
	decode(t, run(t, sock, runOpts{}, "region", "create", "kv", "64GiB", "--json").ok(t).stdout, &v)
	if v.Size != 64<<30 || v.PageSize != 4096 || v.Durability != "memory" || v.Existed {
		t.Errorf("create --json: %+v", v)
	}
	run(t, sock, runOpts{}, "region", "rm", "graph").ok(t)
	if r := run(t, sock, runOpts{}, "region", "info", "graph"); r.code != ExitError {
		t.Errorf("info after rm: exit %d", r.code)
	}
}

func TestRegionCreateExists(t *testing.T) {
	f, sock := serveFake(t)
	run(t, sock, runOpts{}, "region", "create", "demo", "64MiB").ok(t)
	r := run(t, sock, runOpts{}, "region", "create", "demo", "64MiB").ok(t)
	if r.stdout != "region demo exists (r3), same spec\n" {
		t.Errorf("create of an existing region said %q", r.stdout)
	}
	var v struct {
		regionJSON
		Existed bool `json:"existed"`
	}
	decode(t, run(t, sock, runOpts{}, "region", "create", "demo", "64MiB", "--json").ok(t).stdout, &v)
	if !v.Existed || v.ID != 3 || v.Size != 64<<20 {
		t.Errorf("create --json of an existing region: %+v", v)
	}
	decode(t, run(t, sock, runOpts{}, "region", "create", "fresh", "64MiB", "--json").ok(t).stdout, &v)
	if v.Existed || v.ID != 4 {
		t.Errorf("create --json of a new region: %+v", v)
	}
	// Another spec under the name is an error, with where to see the spec.
	r = run(t, sock, runOpts{}, "region", "create", "demo", "128MiB")
	if r.code != ExitError || r.stderr != "dsmctl: region exists with a different spec — `dsmctl region info demo` shows its spec\n" {
		t.Errorf("create with another spec: exit %d, %q", r.code, r.stderr)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := len(f.regions); n != 4 {
		t.Errorf("%d regions, want 4", n)
	}
}

func TestRegionRmForce(t *testing.T) {
	f, sock := serveFake(t)
	f.mu.Lock()
	f.maps["small"] = map[uint32][]int32{1: {4242}, 2: {77}}
	f.mu.Unlock()
	r := run(t, sock, runOpts{}, "region", "rm", "small")
	want := `dsmctl: region "small" is mapped by 2 process(es) (pid 4242 on n1, pid 77 on n2); stop them, or delete with force — ` +
		"`dsmctl region rm small --force` deletes it anyway and cuts the mappings off\n"
	if r.code != ExitError || r.stderr != want || r.stdout != "" {
		t.Errorf("rm of a mapped region: exit %d, stderr %q, want %q", r.code, r.stderr, want)
	}
	r = run(t, sock, runOpts{}, "region", "rm", "small", "--force").ok(t)
	if r.stdout != "deleted region small (r2); 2 mappings were cut off\n" {
		t.Errorf("rm --force said %q", r.stdout)
	}
	r = run(t, sock, runOpts{}, "region", "rm", "feat").ok(t)
	if r.stdout != "deleted region feat (r1)\n" {
		t.Errorf("rm said %q", r.stdout)
	}
	f.mu.Lock()
	forced, left := f.forced, len(f.regions)
	f.mu.Unlock()
	if len(forced) != 1 || forced[0] != "small" || left != 0 {
		t.Errorf("forced deletes %v, %d regions left", forced, left)
	}
	r = run(t, sock, runOpts{}, "region", "rm", "--help").ok(t)
	if !strings.Contains(r.stdout, "--force") || !strings.Contains(r.stdout, "mappings are cut off") {
		t.Errorf("rm --help does not say what --force does:\n%s", r.stdout)
	}
	run(t, sock, runOpts{}, "region", "create", "demo", "64MiB").ok(t)
	var v struct {
		Deleted  string `json:"deleted"`
		ID       uint32 `json:"id"`
		Mappings uint64 `json:"mappings_cut_off"`
	}
	decode(t, run(t, sock, runOpts{}, "region", "rm", "demo", "--json").ok(t).stdout, &v)
	if v.Deleted != "demo" || v.ID != 3 || v.Mappings != 0 {
		t.Errorf("rm --json: %+v", v)
	}
}

func TestDurableHelp(t *testing.T) {
	r := run(t, "", runOpts{}, "region", "create", "--help").ok(t)
	// It says what a durable Sync does now (on disk at the homes and
	// backups) and what it does not (reload after a restart).
	for _, w := range []string{"waits until they are on disk there", "This build does not load them again",
		"a restart of the whole cluster loses the region's pages"} {
		if !strings.Contains(oneLine(r.stdout), w) {
			t.Errorf("region create --help lacks %q:\n%s", w, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "survives a restart") || strings.Contains(r.stdout, "survives the crash") {
		t.Errorf("region create --help promises survival of a restart:\n%s", r.stdout)
	}
}

// TestRaftLeaderOnce checks that raft names the leader once, whether the
// answering node is the leader or a follower.
func TestRaftLeaderOnce(t *testing.T) {
	f, sock := serveFake(t)
	first := func() string {
		out := run(t, sock, runOpts{}, "raft").ok(t).stdout
		return out[:strings.IndexByte(out, '\n')]
	}
	if got := first(); got != "n1 is the leader (127.0.0.1:7501) · term 7" {
		t.Errorf("raft from the leader: %q", got)
	}
	f.mu.Lock()
	f.raftFollower = true
	f.mu.Unlock()
	if got := first(); got != "n2 is follower · leader n1 (127.0.0.1:7501) · term 7" {
		t.Errorf("raft from a follower: %q", got)
	}
}

// TestCompleteRegions checks that the shell completion of a command taking
// a region offers the regions dsmd lists, and nothing when dsmd is away.
func TestCompleteRegions(t *testing.T) {
	_, sock := serveFake(t)
	env := runOpts{env: map[string]string{AddrEnv: sock}}
	for _, c := range [][]string{
		{"__complete", "region", "info", ""},
		{"__complete", "region", "rm", ""},
		{"__complete", "pages", ""},
		{"__complete", "get", ""},
		{"__complete", "put", ""},
		{"__complete", "bench", "--region", ""},
		{"__complete", "--addr", sock, "pages", ""},
	} {
		r := run(t, "", env, c...).ok(t)
		if r.stdout != "feat\nsmall\n:4\n" {
			t.Errorf("%v: completions %q", c, r.stdout)
		}
	}
	if r := run(t, "", env, "__complete", "pages", "sm").ok(t); r.stdout != "small\n:4\n" {
		t.Errorf("pages sm: completions %q", r.stdout)
	}
	if r := run(t, "", env, "__complete", "get", "small", "").ok(t); r.stdout != ":4\n" {
		t.Errorf("get small: completions %q, want none", r.stdout)
	}
	gone := runOpts{env: map[string]string{AddrEnv: sock + ".gone"}}
	if r := run(t, "", gone, "__complete", "pages", "").ok(t); r.stdout != ":4\n" {
		t.Errorf("completion without dsmd: %q", r.stdout)
	}
}

// TestStateOf: an alive member that is leaving shows as draining; every
// other state shows as itself.
func TestStateOf(t *testing.T) {
	for _, c := range []struct {
		s        dsmpb.MemberState
		draining bool
		want     string
	}{
		{dsmpb.MemberState_MEMBER_STATE_ALIVE, false, "alive"},
		{dsmpb.MemberState_MEMBER_STATE_ALIVE, true, "draining"},
		{dsmpb.MemberState_MEMBER_STATE_LEFT, true, "left"},
		{dsmpb.MemberState_MEMBER_STATE_DEAD, false, "dead"},
	} {
		if got := stateOf(c.s, c.draining); got != c.want {
			t.Errorf("stateOf(%v, %v) = %q, want %q", c.s, c.draining, got, c.want)
		}
	}
}
