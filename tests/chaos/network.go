package chaos

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// A network places each node at an address and cuts or degrades the
// traffic between nodes. Two implementations: netns (every dsmd in a
// network namespace of its own, on a bridge in the harness's namespace) and
// loopback (every dsmd on 127.0.0.1 with ports of its own, faults by
// nftables rules on those ports and the node's uid).
type network interface {
	// Mode names the implementation ("netns" or "loopback").
	Mode() string
	// Setup prepares nodes 1..n; Teardown removes everything Setup made.
	Setup(n int) error
	Teardown()
	// Command runs name with args on node i (inside its namespace).
	Command(i int, name string, args ...string) *exec.Cmd
	// DsmdArgs are node i's address flags of dsmd, and Join the gossip
	// address of node i for --join.
	DsmdArgs(i int) []string
	Join(i int) string
	// Drop drops every packet that node from sends to node to (one way).
	Drop(from, to int) error
	// Loss drops pct percent of node i's packets to and from the others.
	Loss(i, pct int) error
	// Heal removes every rule Drop and Loss added.
	Heal() error
	// Firewall says whether Drop, Loss and Heal work.
	Firewall() error
}

// Names of everything the harness creates, so that a later run can find
// and remove what a killed run left behind.
const (
	nsPrefix  = "dsmchaos-"
	nsHarness = nsPrefix + "h"
	bridge    = "dsmchaos0"
	nftTable  = "dsmchaos"
	// subnet is private and lives only on the harness's own bridge, in a
	// namespace with no other interface: nothing is routed anywhere else.
	subnet = "10.77.0"
	// dsmdPort is the port base of dsmd in a namespace (gossip, Raft +1,
	// RPC +2, verbs +3).
	dsmdPort = 7946
)

func nodeNS(i int) string { return fmt.Sprintf("%sn%d", nsPrefix, i) }

// sh runs a command and returns its error with its output.
func sh(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// nftIn runs nft with script on its standard input, in namespace ns ("" for
// the harness's own).
func nftIn(ns, script string) error {
	var cmd *exec.Cmd
	if ns == "" {
		cmd = exec.Command("nft", "-f", "-")
	} else {
		cmd = exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	}
	cmd.Stdin = strings.NewReader(script)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("nft in %q: %v: %s\n%s", ns, err, strings.TrimSpace(string(out)), script)
	}
	return nil
}

func haveNft() error {
	if _, err := exec.LookPath("nft"); err != nil {
		return errors.New("nft is not installed (apt-get install -y nftables)")
	}
	return nil
}

// netnsNet is the namespace network: node i is 10.77.0.i on eth0 in
// namespace dsmchaos-ni; the other end of its veth is on bridge dsmchaos0 in
// namespace dsmchaos-h.
type netnsNet struct {
	n   int
	nft error // why the firewall does not work, or nil
}

func (*netnsNet) Mode() string { return "netns" }

func (n *netnsNet) Setup(count int) error {
	n.n = count
	if err := sh("ip", "netns", "add", nsHarness); err != nil {
		return err
	}
	steps := [][]string{
		{"ip", "-n", nsHarness, "link", "add", bridge, "type", "bridge"},
		{"ip", "-n", nsHarness, "link", "set", bridge, "up"},
	}
	for i := 1; i <= count; i++ {
		ns, veth := nodeNS(i), fmt.Sprintf("dsmchaos-v%d", i)
		steps = append(steps,
			[]string{"ip", "netns", "add", ns},
			[]string{"ip", "link", "add", veth, "netns", nsHarness, "type", "veth", "peer", "name", "eth0", "netns", ns},
			[]string{"ip", "-n", nsHarness, "link", "set", veth, "master", bridge, "up"},
			[]string{"ip", "-n", ns, "addr", "add", fmt.Sprintf("%s.%d/24", subnet, i), "dev", "eth0"},
			[]string{"ip", "-n", ns, "link", "set", "eth0", "up"},
			[]string{"ip", "-n", ns, "link", "set", "lo", "up"})
	}
	for _, s := range steps {
		if err := sh(s[0], s[1:]...); err != nil {
			return err
		}
	}
	n.nft = haveNft()
	if n.nft == nil {
		for i := 1; i <= count; i++ {
			if err := nftIn(nodeNS(i), nftChains); err != nil {
				n.nft = err
				break
			}
		}
	}
	return nil
}

// nftChains is the table every fault rule goes into.
const nftChains = `table inet ` + nftTable + ` {
	chain in { type filter hook input priority 0; policy accept; }
	chain out { type filter hook output priority 0; policy accept; }
}
`

func (n *netnsNet) Teardown() { cleanNetns() }

// cleanNetns removes the namespaces of this or an earlier run (the veths and
// the bridge go with them).
func cleanNetns() {
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && strings.HasPrefix(f[0], nsPrefix) {
			_ = sh("ip", "netns", "del", f[0])
		}
	}
}

func (n *netnsNet) Command(i int, name string, args ...string) *exec.Cmd {
	// ip netns exec enters the namespace and execs name: the process keeps
	// the pid, so signals reach it directly.
	return exec.Command("ip", append([]string{"netns", "exec", nodeNS(i), name}, args...)...)
}

func (n *netnsNet) DsmdArgs(i int) []string {
	// The namespaces' private subnet is not loopback: dsmd refuses it
	// without TLS unless told --insecure.
	return []string{"--bind", fmt.Sprintf("%s.%d", subnet, i), "--port-base", strconv.Itoa(dsmdPort), "--insecure"}
}

func (n *netnsNet) Join(i int) string { return fmt.Sprintf("%s.%d:%d", subnet, i, dsmdPort) }

func (n *netnsNet) Firewall() error { return n.nft }

func (n *netnsNet) Drop(from, to int) error {
	return nftIn(nodeNS(from), fmt.Sprintf("add rule inet %s out ip daddr %s.%d drop\n", nftTable, subnet, to))
}

func (n *netnsNet) Loss(i, pct int) error {
	return nftIn(nodeNS(i), fmt.Sprintf(`add rule inet %[1]s out ip daddr %[2]s.0/24 numgen random mod 100 < %[3]d drop
add rule inet %[1]s in ip saddr %[2]s.0/24 numgen random mod 100 < %[3]d drop
`, nftTable, subnet, pct))
}

func (n *netnsNet) Heal() error {
	var errs []error
	for i := 1; i <= n.n; i++ {
		errs = append(errs, nftIn(nodeNS(i), fmt.Sprintf("flush chain inet %[1]s in\nflush chain inet %[1]s out\n", nftTable)))
	}
	return errors.Join(errs...)
}

// netnsWorks says whether this machine lets the harness make namespaces,
// veths and bridges, by making and removing one of each.
func netnsWorks() error {
	const probe = nsPrefix + "probe"
	defer func() { _ = sh("ip", "netns", "del", probe) }()
	if err := sh("ip", "netns", "add", probe); err != nil {
		return err
	}
	if err := sh("ip", "-n", probe, "link", "add", "dsmchaos-pb", "type", "bridge"); err != nil {
		return err
	}
	return sh("ip", "-n", probe, "link", "add", "dsmchaos-pa", "type", "veth", "peer", "name", "dsmchaos-pc")
}

// loopbackNet is the fallback: node i listens on 127.0.0.1 from port
// base+10*i and runs as uid loopbackUID+i, so that an nftables rule in the
// output hook can tell its packets (meta skuid) from the others'. A packet
// is dropped by the uid of its sender and the destination port, which cuts
// connections whichever side opened them; what it cannot see is the
// destination of a reply to an ephemeral port, so a one-way cut also
// stops the replies that the cut node sends on connections the other side
// opened.
type loopbackNet struct {
	n    int
	base int
	nft  error
}

// loopbackUID is the uid base of dsmd processes in loopback mode.
const loopbackUID = 47700

func (*loopbackNet) Mode() string { return "loopback" }

func (l *loopbackNet) Setup(count int) error {
	l.n = count
	l.nft = haveNft()
	if l.nft == nil {
		l.nft = nftIn("", nftChains)
	}
	return nil
}

func (l *loopbackNet) Teardown() { cleanLoopback() }

func cleanLoopback() {
	if haveNft() == nil {
		_ = sh("nft", "delete", "table", "inet", nftTable)
	}
}

func (l *loopbackNet) Command(i int, name string, args ...string) *exec.Cmd {
	return exec.Command(name, args...)
}

func (l *loopbackNet) port(i int) int { return l.base + 10*i }

func (l *loopbackNet) DsmdArgs(i int) []string {
	return []string{"--bind", "127.0.0.1", "--port-base", strconv.Itoa(l.port(i))}
}

func (l *loopbackNet) Join(i int) string { return fmt.Sprintf("127.0.0.1:%d", l.port(i)) }

func (l *loopbackNet) Firewall() error { return l.nft }

func (l *loopbackNet) ports(i int) string {
	return fmt.Sprintf("%d-%d", l.port(i), l.port(i)+3)
}

func (l *loopbackNet) Drop(from, to int) error {
	return nftIn("", fmt.Sprintf("add rule inet %s out meta skuid %d meta l4proto { tcp, udp } th dport %s drop\n",
		nftTable, loopbackUID+from, l.ports(to)))
}

func (l *loopbackNet) Loss(i, pct int) error {
	var b bytes.Buffer
	for j := 1; j <= l.n; j++ {
		if j == i {
			continue
		}
		fmt.Fprintf(&b, "add rule inet %s out meta skuid %d meta l4proto { tcp, udp } th dport %s numgen random mod 100 < %d drop\n",
			nftTable, loopbackUID+i, l.ports(j), pct)
		fmt.Fprintf(&b, "add rule inet %s out meta skuid %d meta l4proto { tcp, udp } th dport %s numgen random mod 100 < %d drop\n",
			nftTable, loopbackUID+j, l.ports(i), pct)
	}
	return nftIn("", b.String())
}

func (l *loopbackNet) Heal() error {
	return nftIn("", fmt.Sprintf("flush chain inet %[1]s in\nflush chain inet %[1]s out\n", nftTable))
}

// isRoot says whether the harness may make namespaces, mounts and rules.
func isRoot() bool { return os.Geteuid() == 0 }
