package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/dsmkit/dsm/dsm"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// Config is what one invocation of the harness runs.
type Config struct {
	Seeds     int           // how many schedules
	FirstSeed uint64        // the seed of the first; the others follow
	Duration  time.Duration // the workload of each schedule, faults included
	Nodes     int           // base nodes (a joining node comes on top)
	Faults    []string      // the kinds the nemesis draws from
	Span      Span          // how long each fault lasts
	Mode      string        // auto, netns or loopback
	Out       string        // where run directories go
	// Settle is how long the workload goes on after the last fault healed,
	// before the final check.
	Settle time.Duration
	// OpDeadline is the longest an operation may take before it counts as
	// unavailable; operations that take a context get it as theirs.
	OpDeadline time.Duration
	Rate       float64  // scale of the clients' operation rates
	Durable    bool     // create the region durable
	Race       bool     // build dsmd with the race detector
	DiskSize   int64    // bytes of each node's tmpfs, with the disk fault
	PortBase   int      // first port in loopback mode
	KeepData   bool     // keep the nodes' data directories
	DsmdArgs   []string // more flags for every dsmd
	// OFIProvider, when set, runs every dsmd on --transport ofi with this
	// libfabric provider (a dsmd built with the ofi tag). Partitions and
	// losses act on the network: on shm, whose verbs go through shared
	// memory, they cut the directory's traffic and not the verbs.
	OFIProvider string `json:",omitempty"`
}

// transport names the verbs transport of cfg's dsmds, for people.
func (cfg Config) transport() string {
	if cfg.OFIProvider == "" {
		return "tcp"
	}
	return "ofi (" + cfg.OFIProvider + ")"
}

// harness runs one schedule.
type harness struct {
	cfg       Config
	seed      uint64
	dir       string
	net       network
	pids      *pidFile
	dsmdBin   string
	clientBin string
	cpu       *cpuLimiter
	cpuErr    error
	schedule  []Fault

	mu    sync.Mutex
	nodes map[int]*nodeState
	// killed names the client processes the nemesis killed (n1g2, ...).
	killed map[string]bool
	events []event
	evf    *os.File
	t0     time.Time // the workload started
	tEnd   time.Time // the final check ended
}

type nodeState struct {
	id                 int
	dir, data, socket  string
	dsmd, client       *proc
	dsmdGen, clientGen int
	// up and clientUp say whether the nemesis wants the dsmd and the client
	// running now.
	up, clientUp bool
	// stopBursts ends the SIGSTOP/SIGCONT bursts of a slow node without a
	// cgroup.
	stopBursts chan struct{}
}

// event is one line of events.jsonl: what the harness did or saw.
type event struct {
	T      int64  `json:"t"`
	What   string `json:"what"`
	Node   int    `json:"node,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// Event kinds that the checkers read.
const (
	evCrash     = "crash"      // a dsmd exited without the nemesis asking
	evLoss      = "loss"       // a dsmd died without writing anything back (kill -9, crash)
	evClientEnd = "client-end" // a client did not exit after SIGTERM and was killed
	// evUnrecovered: after the last fault healed, the running nodes did
	// not agree, within recoverWithin, that they are all alive under one
	// leader.
	evUnrecovered = "unrecovered"
	evRecovered   = "recovered"
)

// recoverWithin bounds how long the cluster may take, once every fault
// has healed, to have a directory leader and every running node alive in
// every running node's view.
const recoverWithin = 45 * time.Second

func (h *harness) event(what string, node int, detail string) {
	e := event{T: time.Now().UnixNano(), What: what, Node: node, Detail: detail}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, e)
	if h.evf != nil {
		b, _ := json.Marshal(e)
		_, _ = h.evf.Write(append(b, '\n'))
	}
}

func (h *harness) node(i int) *nodeState {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.nodes[i]
}

// joinAddrs is every base node's gossip address.
func (h *harness) joinAddrs() string {
	s := ""
	for i := 1; i <= h.cfg.Nodes; i++ {
		if i > 1 {
			s += ","
		}
		s += h.net.Join(i)
	}
	return s
}

// startDsmd starts node i's dsmd (again, after a kill or a leave: same id,
// data directory and addresses).
func (h *harness) startDsmd(i int) error {
	n := h.node(i)
	expect := strconv.Itoa(min(h.cfg.Nodes, 3))
	if i > h.cfg.Nodes {
		expect = "0"
	}
	args := append([]string{"--id", strconv.Itoa(i), "--data-dir", n.data, "--log-level", "info",
		"--bootstrap-expect", expect, "--join", h.joinAddrs()}, h.net.DsmdArgs(i)...)
	if h.cfg.OFIProvider != "" {
		args = append(args, "--transport", "ofi", "--ofi-provider", h.cfg.OFIProvider)
	}
	args = append(args, h.cfg.DsmdArgs...)
	cmd := h.net.Command(i, h.dsmdBin, args...)
	if _, ok := h.net.(*loopbackNet); ok {
		uid := uint32(loopbackUID + i)
		if err := chownTree(n.data, int(uid)); err != nil {
			return err
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	}
	n.dsmdGen++
	p, err := h.startProc(fmt.Sprintf("n%d dsmd (life %d)", i, n.dsmdGen), cmd, filepath.Join(n.dir, "dsmd.log"))
	if err != nil {
		return err
	}
	h.mu.Lock()
	n.dsmd = p
	h.mu.Unlock()
	h.event("dsmd-start", i, fmt.Sprintf("life %d, pid %d", n.dsmdGen, p.cmd.Process.Pid))
	go func() {
		<-p.done
		if p.expect.Load() {
			h.event("dsmd-exit", i, exitString(p.exit))
			return
		}
		h.event(evCrash, i, exitString(p.exit))
		h.event(evLoss, i, "exited on its own")
	}()
	return nil
}

func chownTree(dir string, uid int) error {
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
}

// startClient starts a workload client on node i (final: the final check).
func (h *harness) startClient(i int, final bool) (*proc, error) {
	n := h.node(i)
	name := fmt.Sprintf("n%dg%d", i, n.clientGen+1)
	if final {
		name = fmt.Sprintf("n%dfinal", i)
	} else {
		n.clientGen++
	}
	maxNode := h.cfg.Nodes
	if containsKind(h.cfg.Faults, faultJoin) {
		maxNode++
	}
	args := []string{"client", "-socket", n.socket, "-node", strconv.Itoa(i), "-gen", strconv.Itoa(n.clientGen),
		"-out", filepath.Join(h.dir, "clients", name+".jsonl"), "-nodes", strconv.Itoa(maxNode),
		"-seed", strconv.FormatUint(h.seed, 10), "-rate", strconv.FormatFloat(h.cfg.Rate, 'g', -1, 64),
		"-op-deadline", h.cfg.OpDeadline.String()}
	if final {
		args = append(args, "-final")
	}
	cmd := h.net.Command(i, h.clientBin, args...)
	p, err := h.startProc(name+" client", cmd, filepath.Join(h.dir, "clients", name+".log"))
	if err != nil {
		return nil, err
	}
	h.event("client-start", i, name)
	if !final {
		h.mu.Lock()
		n.client = p
		h.mu.Unlock()
	}
	return p, nil
}

// adminConn dials node i's dsmd gRPC socket.
func adminConn(socket string) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}))
}

// waitFormed waits until node 1 sees a leader and every base node alive.
func (h *harness) waitFormed(ctx context.Context) error {
	conn, err := adminConn(h.node(1).socket)
	if err != nil {
		return err
	}
	defer conn.Close()
	var last error
	for {
		if err := h.deadNode(); err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := dsmpb.NewAdminClient(conn).Status(cctx, &dsmpb.StatusRequest{})
		cancel()
		if err == nil {
			alive := 0
			for _, m := range st.GetNodes() {
				if m.GetState() == dsmpb.MemberState_MEMBER_STATE_ALIVE {
					alive++
				}
			}
			if st.GetLeaderId() != 0 && alive == h.cfg.Nodes {
				return nil
			}
			err = fmt.Errorf("leader n%d, %d of %d nodes alive", st.GetLeaderId(), alive, h.cfg.Nodes)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("the cluster did not form: %v", last)
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// waitRecovered waits until every running dsmd reports a leader and every
// running dsmd alive, and records how long that took (evRecovered) or
// what was still wrong after recoverWithin (evUnrecovered).
func (h *harness) waitRecovered(ctx context.Context) {
	start := time.Now()
	deadline := start.Add(recoverWithin)
	var last string
	for {
		last = h.recoveryGap(ctx)
		if last == "" {
			h.event(evRecovered, 0, fmt.Sprintf("%.1fs after the last heal", time.Since(start).Seconds()))
			return
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			h.event(evUnrecovered, 0, fmt.Sprintf("%s after the last heal: %s", recoverWithin, last))
			return
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// recoveryGap asks every running dsmd for its status and says what keeps
// the cluster from being whole ("" when nothing does).
func (h *harness) recoveryGap(ctx context.Context) string {
	h.mu.Lock()
	var running []*nodeState
	for _, n := range h.nodes {
		if n.up && n.dsmd != nil && n.dsmd.running() {
			running = append(running, n)
		}
	}
	h.mu.Unlock()
	var gaps []string
	for _, n := range running {
		conn, err := adminConn(n.socket)
		if err != nil {
			gaps = append(gaps, fmt.Sprintf("n%d: %v", n.id, err))
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		st, err := dsmpb.NewAdminClient(conn).Status(cctx, &dsmpb.StatusRequest{})
		cancel()
		conn.Close()
		if err != nil {
			gaps = append(gaps, fmt.Sprintf("n%d: status: %v", n.id, err))
			continue
		}
		alive := map[uint32]bool{}
		for _, m := range st.GetNodes() {
			if m.GetState() == dsmpb.MemberState_MEMBER_STATE_ALIVE {
				alive[m.GetNodeId()] = true
			}
		}
		var missing []string
		for _, o := range running {
			if !alive[uint32(o.id)] {
				missing = append(missing, fmt.Sprintf("n%d", o.id))
			}
		}
		switch {
		case st.GetLeaderId() == 0:
			gaps = append(gaps, fmt.Sprintf("n%d sees no leader", n.id))
		case len(missing) > 0:
			gaps = append(gaps, fmt.Sprintf("n%d does not see %s alive", n.id, strings.Join(missing, ", ")))
		}
	}
	return strings.Join(gaps, "; ")
}

// deadNode reports a base dsmd that exited.
func (h *harness) deadNode() error {
	for i := 1; i <= h.cfg.Nodes; i++ {
		if p := h.node(i).dsmd; p != nil && !p.running() {
			return fmt.Errorf("n%d's dsmd exited: %v (see %s)", i, exitString(p.exit), filepath.Join(h.node(i).dir, "dsmd.log"))
		}
	}
	return nil
}

// createRegion creates the region through node 1 and waits until every base
// node maps it.
func (h *harness) createRegion(ctx context.Context) error {
	opts := []dsm.RegionOption{dsm.WithDurability(dsm.Memory)}
	if h.cfg.Durable {
		opts = []dsm.RegionOption{dsm.WithDurability(dsm.Durable)}
	}
	retry := func(what string, f func(context.Context) error) error {
		var last error
		for {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := f(cctx)
			cancel()
			if err == nil {
				return nil
			}
			last = err
			if err := h.deadNode(); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s: %v", what, last)
			case <-time.After(300 * time.Millisecond):
			}
		}
	}
	if err := retry("creating the region", func(ctx context.Context) error {
		c, err := dsm.Dial(ctx, h.node(1).socket)
		if err != nil {
			return err
		}
		defer c.Close()
		return c.CreateRegion(ctx, regionName, regionSize, opts...)
	}); err != nil {
		return err
	}
	for i := 1; i <= h.cfg.Nodes; i++ {
		if err := retry(fmt.Sprintf("mapping the region on n%d", i), func(ctx context.Context) error {
			c, err := dsm.Dial(ctx, h.node(i).socket)
			if err != nil {
				return err
			}
			defer c.Close()
			r, err := c.Map(ctx, regionName)
			if err != nil {
				return err
			}
			return r.Close()
		}); err != nil {
			return err
		}
	}
	return nil
}

// setup makes the run directory, the network and the nodes' directories.
func (h *harness) setup() error {
	for _, d := range []string{"nodes", "clients"} {
		if err := os.MkdirAll(filepath.Join(h.dir, d), 0o755); err != nil {
			return err
		}
	}
	var err error
	if h.evf, err = os.Create(filepath.Join(h.dir, "events.jsonl")); err != nil {
		return err
	}
	total := h.cfg.Nodes
	if containsKind(h.cfg.Faults, faultJoin) {
		total++
	}
	if err := h.net.Setup(total); err != nil {
		return fmt.Errorf("network (%s): %w", h.net.Mode(), err)
	}
	h.nodes = map[int]*nodeState{}
	for i := 1; i <= total; i++ {
		dir := filepath.Join(h.dir, "nodes", fmt.Sprintf("n%d", i))
		n := &nodeState{id: i, dir: dir, data: filepath.Join(dir, "data")}
		n.socket = filepath.Join(n.data, "dsmd.sock")
		if containsKind(h.cfg.Faults, faultDisk) {
			if err := mountDisk(n.data, h.cfg.DiskSize); err != nil {
				return fmt.Errorf("tmpfs for n%d: %w", i, err)
			}
		} else if err := os.MkdirAll(n.data, 0o755); err != nil {
			return err
		}
		h.nodes[i] = n
	}
	if containsKind(h.cfg.Faults, faultSlow) {
		h.cpu, h.cpuErr = newCPULimiter()
	}
	return nil
}

// teardown stops every process and removes what setup made (the run
// directory stays, without the data directories unless KeepData).
func (h *harness) teardown() {
	h.mu.Lock()
	var all []*proc
	for _, n := range h.nodes {
		if n.stopBursts != nil {
			close(n.stopBursts)
			n.stopBursts = nil
		}
		for _, p := range []*proc{n.client, n.dsmd} {
			if p != nil {
				all = append(all, p)
			}
		}
	}
	h.mu.Unlock()
	for _, p := range all {
		p.kill()
	}
	h.net.Teardown()
	cleanMounts()
	cleanCgroups()
	if !h.cfg.KeepData {
		for _, n := range h.nodes {
			_ = os.RemoveAll(n.data)
		}
	}
	if h.evf != nil {
		h.evf.Close()
	}
}

// leaveWait is how long a dsmd may take to leave after SIGTERM before it
// is killed: its --leave-timeout (20 s by default) and a margin.
const leaveWait = 30 * time.Second

// stopAll ends the cluster at the end of a run: SIGTERM to every dsmd,
// SIGKILL to those still there leaveWait later.
func (h *harness) stopAll() {
	var ps []*proc
	for _, n := range h.nodes {
		if n.dsmd != nil && n.dsmd.running() {
			n.dsmd.expect.Store(true)
			_ = n.dsmd.signal(syscall.SIGCONT)
			_ = n.dsmd.signal(syscall.SIGTERM)
			ps = append(ps, n.dsmd)
		}
	}
	for _, p := range ps {
		if !p.wait(leaveWait) {
			h.event("dsmd-stuck", 0, fmt.Sprintf("%s did not exit %v after SIGTERM at the end; killed", p.name, leaveWait))
			p.kill()
		}
	}
}

// ensureUp restarts every dsmd and client that should run and does not
// (after a heal, and after a crash).
func (h *harness) ensureUp() {
	for i := 1; i <= len(h.nodes); i++ {
		n := h.node(i)
		if n.up && (n.dsmd == nil || !n.dsmd.running()) {
			if err := h.startDsmd(i); err != nil {
				h.event("error", i, "restarting dsmd: "+err.Error())
			}
		}
		if n.clientUp && (n.client == nil || !n.client.running()) {
			if _, err := h.startClient(i, false); err != nil {
				h.event("error", i, "starting the client: "+err.Error())
			}
		}
	}
}

// sleepCtx sleeps until t or ctx ends; it says whether t was reached.
func sleepCtx(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// nemesis executes the schedule; it heals the fault in progress when ctx
// ends early.
func (h *harness) nemesis(ctx context.Context) {
	for i := range h.schedule {
		f := &h.schedule[i]
		if !sleepCtx(ctx, h.t0.Add(f.At)) {
			return
		}
		f.Start = time.Now().UnixNano()
		if err := h.apply(f); err != nil {
			f.Err = err.Error()
		}
		h.event("fault", 0, f.String())
		sleepCtx(ctx, h.t0.Add(f.At+f.For))
		if err := h.heal(f); err != nil {
			f.Err = errors.Join(errorsOf(f.Err), err).Error()
		}
		f.End = time.Now().UnixNano()
		h.event("heal", 0, f.String())
		h.ensureUp()
	}
}

func errorsOf(s string) error {
	if s == "" {
		return nil
	}
	return errors.New(s)
}

// apply starts fault f.
func (h *harness) apply(f *Fault) error {
	n := h.node(f.Nodes[0])
	switch f.Kind {
	case faultKill:
		n.up = false
		if n.dsmd == nil || !n.dsmd.running() {
			return errors.New("not running")
		}
		n.dsmd.expect.Store(true)
		if err := n.dsmd.signal(syscall.SIGKILL); err != nil {
			return err
		}
		n.dsmd.wait(5 * time.Second)
		h.event(evLoss, n.id, "kill -9")
	case faultPause:
		if n.dsmd == nil {
			return errors.New("not running")
		}
		return n.dsmd.signal(syscall.SIGSTOP)
	case faultPartition, faultHalves, faultBridge:
		for _, a := range f.Sides[0] {
			for _, b := range f.Sides[1] {
				if err := errors.Join(h.net.Drop(a, b), h.net.Drop(b, a)); err != nil {
					return err
				}
			}
		}
	case faultOneWay:
		return h.net.Drop(f.Nodes[0], f.Nodes[1])
	case faultLoss:
		return h.net.Loss(n.id, f.Pct)
	case faultSlow:
		if n.dsmd == nil || !n.dsmd.running() {
			return errors.New("not running")
		}
		if h.cpu != nil {
			f.Note = "cgroup cpu limit 5%"
			return h.cpu.limit(n.dsmd.cmd.Process.Pid, 5)
		}
		f.Note = fmt.Sprintf("SIGSTOP 90 ms of every 100 ms (no cgroup: %v)", h.cpuErr)
		stop := make(chan struct{})
		n.stopBursts = stop
		go bursts(n.dsmd, stop)
	case faultDisk:
		b, err := fillDisk(n.data)
		f.Note = fmt.Sprintf("filled with %d MiB", b>>20)
		return err
	case faultLeave:
		n.up = false
		if n.dsmd == nil || !n.dsmd.running() {
			return errors.New("not running")
		}
		n.dsmd.expect.Store(true)
		return n.dsmd.signal(syscall.SIGTERM)
	case faultJoin:
		n.up, n.clientUp = true, true
		if err := h.startDsmd(n.id); err != nil {
			return err
		}
		_, err := h.startClient(n.id, false)
		return err
	case faultClientKill:
		n.clientUp = false
		if n.client == nil || !n.client.running() {
			return errors.New("no client running")
		}
		h.markKilled(n)
		n.client.kill()
	}
	return nil
}

// markKilled records that the nemesis kills node n's current client.
func (h *harness) markKilled(n *nodeState) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.killed == nil {
		h.killed = map[string]bool{}
	}
	h.killed[fmt.Sprintf("n%dg%d", n.id, n.clientGen)] = true
}

// bursts stops p for 90 ms of every 100 ms until stop closes.
func bursts(p *proc, stop chan struct{}) {
	for {
		_ = p.signal(syscall.SIGSTOP)
		select {
		case <-stop:
			_ = p.signal(syscall.SIGCONT)
			return
		case <-time.After(90 * time.Millisecond):
		}
		_ = p.signal(syscall.SIGCONT)
		select {
		case <-stop:
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// heal ends fault f.
func (h *harness) heal(f *Fault) error {
	n := h.node(f.Nodes[0])
	switch f.Kind {
	case faultKill:
		n.up = true
		return h.startDsmd(n.id)
	case faultPause:
		if n.dsmd == nil {
			return nil
		}
		return n.dsmd.signal(syscall.SIGCONT)
	case faultPartition, faultHalves, faultBridge, faultOneWay, faultLoss:
		return h.net.Heal()
	case faultSlow:
		if h.cpu != nil {
			return h.cpu.unlimit()
		}
		if n.stopBursts != nil {
			close(n.stopBursts)
			n.stopBursts = nil
		}
	case faultDisk:
		return os.Remove(filepath.Join(n.data, fillerName))
	case faultLeave:
		var err error
		if n.dsmd != nil && !n.dsmd.wait(leaveWait) {
			err = fmt.Errorf("did not exit %v after SIGTERM; killed", leaveWait)
			n.dsmd.kill()
		}
		if n.dsmd != nil {
			f.Note = "left: " + exitString(n.dsmd.exit)
		}
		n.up = true
		return errors.Join(err, h.startDsmd(n.id))
	case faultJoin:
		n.up, n.clientUp = false, false
		var err error
		if n.dsmd != nil && n.dsmd.running() {
			n.dsmd.expect.Store(true)
			_ = n.dsmd.signal(syscall.SIGTERM)
			if !n.dsmd.wait(leaveWait) {
				err = fmt.Errorf("the joined node did not leave %v after SIGTERM; killed", leaveWait)
				n.dsmd.kill()
			}
		}
		if n.client != nil {
			h.markKilled(n)
			n.client.kill()
		}
		return err
	case faultClientKill:
		n.clientUp = true
		_, err := h.startClient(n.id, false)
		return err
	}
	return nil
}

// stopClients ends the workload: SIGTERM to every client, SIGKILL to those
// still there after an operation's deadline (their blocked operations stay
// without a return in the history).
func (h *harness) stopClients() {
	var ps []*nodeState
	for i := 1; i <= len(h.nodes); i++ {
		n := h.node(i)
		n.clientUp = false
		if n.client != nil && n.client.running() {
			n.client.expect.Store(true)
			_ = n.client.signal(syscall.SIGTERM)
			ps = append(ps, n)
		}
	}
	deadline := time.Now().Add(h.cfg.OpDeadline + 3*time.Second)
	for _, n := range ps {
		if !n.client.wait(time.Until(deadline)) {
			h.event(evClientEnd, n.id, n.client.name+" did not exit after SIGTERM (an operation blocked); killed")
			n.client.kill()
		}
	}
}

// finalReads runs the final check on every base node, in parallel.
func (h *harness) finalReads() {
	var wg sync.WaitGroup
	for i := 1; i <= h.cfg.Nodes; i++ {
		p, err := h.startClient(i, true)
		if err != nil {
			h.event("error", i, "final check: "+err.Error())
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !p.wait(h.cfg.OpDeadline + 10*time.Second) {
				h.event(evClientEnd, i, "the final check blocked; killed")
				p.kill()
			}
		}()
	}
	wg.Wait()
}

func containsKind(kinds []string, k string) bool {
	for _, x := range kinds {
		if x == k {
			return true
		}
	}
	return false
}

// buildDsmd builds cmd/dsmd of the module at root into dir.
func buildDsmd(root, dir string, race, ofi bool) (string, error) {
	bin := filepath.Join(dir, "dsmd")
	args := []string{"build", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	if ofi {
		args = append(args, "-tags", "ofi")
	}
	cmd := exec.Command("go", append(args, "./cmd/dsmd")...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/dsmd: %v\n%s", err, out)
	}
	return bin, nil
}
