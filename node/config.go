package node

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/localsock"
	"github.com/dsmkit/dsm/internal/tlsconf"
)

// Default ports: with --bind HOST and no per-address flag, a node listens on
// HOST:PortBase (gossip), +1 (Raft), +2 (directory RPC) and +3 (verbs).
const (
	DefaultPortBase = 7946
	// DefaultSocket is where local clients find dsmd when neither --socket
	// nor --data-dir says otherwise. dsmctl and the dsm library use the same
	// path when $DSM_ADDR is unset.
	DefaultSocket = "/run/dsm/dsmd.sock"
	// DefaultCacheSize bounds the page cache.
	DefaultCacheSize = Size(1 << 30)
	// DefaultDiskReserve is the disk reserve kept beside the Raft log.
	DefaultDiskReserve = Size(64 << 20)
	// DefaultCheckpointAfter is Config.CheckpointAfter's default.
	DefaultCheckpointAfter = 64
	// DefaultLeaveTimeout is Config.LeaveTimeout's default.
	DefaultLeaveTimeout = Duration(20 * time.Second)
)

// Sentinel errors of the configuration.
var (
	ErrConfig = errors.New("node: invalid config")
)

// ConfigError says which setting is wrong and why; it matches ErrConfig.
type ConfigError struct {
	Setting string
	Reason  string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("node: invalid config: --%s: %s", e.Setting, e.Reason)
}

// Unwrap makes errors.Is(err, ErrConfig) hold.
func (e *ConfigError) Unwrap() error { return ErrConfig }

// Config is everything dsmd is started with. Flags (ParseFlags) and an
// optional JSON file with the same keys fill it; the flags win.
type Config struct {
	// ID is this node's id: required, stable across restarts, unique.
	ID uint32 `json:"id"`
	// DataDir holds the directory's Raft state. Required.
	DataDir string `json:"data_dir"`

	// Bind is the host every derived address uses (a concrete interface:
	// it is also what peers are told). PortBase is the first of the four
	// derived ports.
	Bind     string `json:"bind"`
	PortBase int    `json:"port_base"`
	// Explicit addresses (host:port) override the derived ones.
	GossipAddr string `json:"gossip_addr"`
	RaftAddr   string `json:"raft_addr"`
	RPCAddr    string `json:"rpc_addr"`
	VerbsAddr  string `json:"verbs_addr"`
	// Transport is the verbs transport: "tcp" (the pure-Go backend, the
	// default) or "ofi" (libfabric; dsmd built with the ofi tag). Every
	// member of a cluster runs the same one.
	Transport string `json:"transport"`
	// OFIProvider names the libfabric provider of --transport ofi
	// ("tcp;ofi_rxm", "shm", "verbs;ofi_rxm", "efa", ...). Empty: the one
	// $FI_PROVIDER names, else libfabric's choice.
	OFIProvider string `json:"ofi_provider"`
	// GRPCAddr, when set, serves the Client and Admin services on TCP too
	// (host:port); it is off by default: the Unix socket is the interface.
	GRPCAddr string `json:"grpc_addr"`

	// Join lists gossip addresses of existing members.
	Join []string `json:"join"`
	// BootstrapExpect: the number of servers that bootstrap the cluster
	// together (0: join an existing cluster only).
	BootstrapExpect int `json:"bootstrap_expect"`

	// Socket is the Unix socket of the gRPC services for local clients.
	// Empty: DATA_DIR/dsmd.sock.
	Socket string `json:"socket"`
	// MapSocket is the SOCK_SEQPACKET socket of mapping sessions. Empty:
	// DATA_DIR/map.sock.
	MapSocket string `json:"map_socket"`
	// SocketMode is the permission bits of both sockets, in octal: empty
	// means 0600 (dsmd's user only), or 0660 with a SocketGroup.
	SocketMode string `json:"socket_mode"`
	// SocketGroup, a group name or gid, is given both sockets, and its
	// members may use them (dsmd checks every peer's credentials). Empty:
	// only root and dsmd's user may.
	SocketGroup string `json:"socket_group"`
	// GossipKey (base64 of 16, 24 or 32 bytes) turns on gossip encryption;
	// GossipKeyringFile names a file of keys instead (a JSON array of base64
	// keys, the primary first). Either seeds the keyring kept in the data
	// directory, which takes precedence from then on (it holds the keys
	// installed with dsmctl keyring).
	GossipKey         string `json:"gossip_key"`
	GossipKeyringFile string `json:"gossip_keyring_file"`
	// CacheSize bounds the page cache, in bytes.
	CacheSize Size `json:"cache_size"`
	// DiskReserve is the size of the file kept beside the Raft log
	// (DATA_DIR/directory/raft.reserve) and deleted when the disk is
	// nearly full, so that the directory keeps working; 0 keeps none.
	DiskReserve Size `json:"disk_reserve"`
	// CheckpointAfter is how many records of a region a placement
	// checkpoint must let the directory drop before this node proposes
	// one (docs/failover.md, "Forgetting departed incarnations"); 0 never
	// proposes. Only the member with the lowest protocol id proposes.
	CheckpointAfter int `json:"checkpoint_after"`
	// LeaveTimeout bounds a graceful leave (SIGTERM): the write-back of
	// the pages this node's clients wrote, the hand-over of its shards to
	// other members, and its departure from the directory
	// (docs/failover.md §11). What is not handed over by then moves at the
	// departure, as after a crash; what is not written back is lost.
	LeaveTimeout Duration `json:"leave_timeout"`
	// MetricsAddr serves Prometheus metrics on /metrics; empty: off.
	MetricsAddr string `json:"metrics_addr"`
	// Pprof serves the Go profiler (net/http/pprof) under /debug/pprof/
	// of the metrics address; off by default.
	Pprof bool `json:"pprof"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `json:"log_level"`
	// TLSDir holds the cluster CA and this node's certificate under the
	// names dsmctl tls gives them (ca.pem, node-ID.pem, node-ID-key.pem).
	// TLSCA, TLSCert and TLSKey name the files one by one (they win over
	// TLSDir). With either, every TCP listener (Raft, directory RPC,
	// verbs, gRPC) speaks mutual TLS 1.3 with the cluster CA.
	TLSDir  string `json:"tls_dir"`
	TLSCA   string `json:"tls_ca"`
	TLSCert string `json:"tls_cert"`
	TLSKey  string `json:"tls_key"`
	// VerbsPlaintext authenticates verbs connections with TLS and then
	// sends their frames in plaintext (trusted fabrics only; every node of
	// the cluster must agree).
	VerbsPlaintext bool `json:"verbs_plaintext"`
	// Insecure allows binding addresses other than loopback without TLS
	// (dsmd refuses otherwise, and warns every minute while it runs so).
	Insecure bool `json:"insecure"`
	// ConfigFile is the JSON file read before the flags are applied.
	ConfigFile string `json:"-"`
}

// Default returns the configuration before any flag or file.
func Default() Config {
	return Config{
		Bind:            "127.0.0.1",
		PortBase:        DefaultPortBase,
		Transport:       TransportTCP,
		CacheSize:       DefaultCacheSize,
		DiskReserve:     DefaultDiskReserve,
		CheckpointAfter: DefaultCheckpointAfter,
		LeaveTimeout:    DefaultLeaveTimeout,
		LogLevel:        "info",
	}
}

// Size is a byte count that reads units: 4096, 64MiB, 1GiB, 2G (binary),
// 1GB (decimal). In JSON it is a number or such a string.
type Size uint64

var sizeUnits = []struct {
	suffix string
	mult   uint64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40},
	{"b", 1},
}

// ParseSize reads a size with an optional unit.
func ParseSize(s string) (Size, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := uint64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	if n, err := strconv.ParseUint(t, 10, 64); err == nil {
		if n != 0 && mult > math.MaxUint64/n {
			return 0, fmt.Errorf("node: size %q too large", s)
		}
		return Size(n * mult), nil
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || math.IsNaN(f) || t == "" {
		return 0, fmt.Errorf("node: bad size %q (try 4096, 512MiB, 2GiB)", s)
	}
	v := f * float64(mult)
	if v >= math.MaxUint64 {
		return 0, fmt.Errorf("node: size %q too large", s)
	}
	return Size(v), nil
}

func (s Size) String() string {
	v := uint64(s)
	for _, u := range []struct {
		suffix string
		mult   uint64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if v >= u.mult && v%u.mult == 0 {
			return strconv.FormatUint(v/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatUint(v, 10)
}

// Set implements flag.Value.
func (s *Size) Set(v string) error {
	n, err := ParseSize(v)
	if err != nil {
		return err
	}
	*s = n
	return nil
}

// Duration is a time.Duration that reads Go's duration strings (20s,
// 1m30s); in JSON such a string, or a number of seconds.
type Duration time.Duration

func (d Duration) String() string { return time.Duration(d).String() }

// Set implements flag.Value.
func (d *Duration) Set(v string) error {
	t, err := time.ParseDuration(v)
	if err != nil {
		return fmt.Errorf("node: %q is no duration (write 20s, 1m30s)", v)
	}
	*d = Duration(t)
	return nil
}

// UnmarshalJSON takes a number of seconds or a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var n float64
	if err := json.Unmarshal(b, &n); err == nil {
		*d = Duration(n * float64(time.Second))
		return nil
	}
	var str string
	if err := json.Unmarshal(b, &str); err != nil {
		return fmt.Errorf("node: a duration must be a number of seconds or a string like \"20s\"")
	}
	return d.Set(str)
}

// UnmarshalJSON takes a number or a string with a unit.
func (s *Size) UnmarshalJSON(b []byte) error {
	var n uint64
	if err := json.Unmarshal(b, &n); err == nil {
		*s = Size(n)
		return nil
	}
	var str string
	if err := json.Unmarshal(b, &str); err != nil {
		return fmt.Errorf("node: size must be a number or a string like \"1GiB\"")
	}
	return s.Set(str)
}

type listFlag struct{ l *[]string }

func (f listFlag) String() string {
	if f.l == nil {
		return ""
	}
	return strings.Join(*f.l, ",")
}

func (f listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*f.l = append(*f.l, s)
		}
	}
	return nil
}

// flags binds a flag set to c. Defaults shown are c's current values.
func flags(c *Config, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("dsmd", flag.ContinueOnError)
	fs.SetOutput(out)
	id := &uintFlag{&c.ID}
	fs.Var(id, "id", "this node's id `N`, a number from 1, unique in the cluster and stable across restarts (required)")
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "directory for the Raft log, snapshots and, by default, the sockets (required)")
	fs.StringVar(&c.Bind, "bind", c.Bind, "host (IP) that every derived address binds and advertises")
	fs.IntVar(&c.PortBase, "port-base", c.PortBase, "first derived port: gossip on it, Raft +1, directory RPC +2, verbs +3")
	fs.StringVar(&c.GossipAddr, "gossip-addr", c.GossipAddr, "gossip (memberlist) host:port (default BIND:PORT_BASE)")
	fs.StringVar(&c.RaftAddr, "raft-addr", c.RaftAddr, "Raft transport host:port; keep it across restarts (default BIND:PORT_BASE+1)")
	fs.StringVar(&c.RPCAddr, "rpc-addr", c.RPCAddr, "directory forwarding RPC host:port (default BIND:PORT_BASE+2)")
	fs.StringVar(&c.VerbsAddr, "verbs-addr", c.VerbsAddr, "verbs transport host:port where peers reach this node's memory (default BIND:PORT_BASE+3; the ofi shm provider ignores it)")
	fs.StringVar(&c.Transport, "transport", c.Transport, "verbs `transport`: tcp (pure Go) or ofi (libfabric, in a dsmd built with -tags ofi); every member must run the same")
	fs.StringVar(&c.OFIProvider, "ofi-provider", c.OFIProvider, "libfabric `provider` of --transport ofi: tcp;ofi_rxm, shm, verbs;ofi_rxm, efa, ... (default $FI_PROVIDER, else libfabric's choice)")
	fs.StringVar(&c.GRPCAddr, "grpc-addr", c.GRPCAddr, "also serve the gRPC Client and Admin services on this TCP host:port (default off)")
	fs.Var(listFlag{&c.Join}, "join", "gossip `host:port` of an existing member; repeat or separate with commas")
	fs.IntVar(&c.BootstrapExpect, "bootstrap-expect", c.BootstrapExpect, "bootstrap a new cluster once this many nodes with the same setting see each other (0: only join)")
	fs.StringVar(&c.Socket, "socket", c.Socket, "Unix socket of the gRPC services for local clients and dsmctl (default DATA_DIR/dsmd.sock; "+DefaultSocket+" is what clients try without $DSM_ADDR)")
	fs.StringVar(&c.MapSocket, "map-socket", c.MapSocket, "Unix SOCK_SEQPACKET socket of mapping sessions (default DATA_DIR/map.sock)")
	fs.StringVar(&c.SocketMode, "socket-mode", c.SocketMode, "permission `bits` in octal of both local sockets (default 0600, or 0660 with --socket-group)")
	fs.StringVar(&c.SocketGroup, "socket-group", c.SocketGroup, "`group` (name or gid) given both local sockets; its members may use dsmd (default none: root and dsmd's user only)")
	fs.StringVar(&c.GossipKey, "gossip-key", c.GossipKey, "encrypt gossip with this `key` (base64 of 16, 24 or 32 bytes; dsmctl keygen makes one); every member needs it. Once started, the data directory keeps the keyring and dsmctl keyring changes it")
	fs.StringVar(&c.GossipKeyringFile, "gossip-keyring-file", c.GossipKeyringFile, "encrypt gossip with the keys in this `file` (a JSON array of base64 keys, the primary first), instead of --gossip-key")
	fs.Var(&c.CacheSize, "cache-size", "page cache capacity `SIZE`, e.g. 512MiB, 4GiB")
	fs.Var(&c.DiskReserve, "disk-reserve", "keep a file of this `SIZE` beside the Raft log and delete it when the disk is nearly full, so that the directory keeps working while an operator frees space (0: none)")
	fs.IntVar(&c.CheckpointAfter, "checkpoint-after", c.CheckpointAfter, "propose a region's placement checkpoint once it lets the directory drop this many `records` of departed incarnations and promotions (0: never; the member with the lowest protocol id proposes)")
	fs.Var(&c.LeaveTimeout, "leave-timeout", "at most this `duration` for a graceful leave (SIGTERM): write back what local clients wrote, hand this node's shards to other members, leave; what is not handed over by then moves as after a crash (keep systemd's TimeoutStopSec or Kubernetes' terminationGracePeriodSeconds above it)")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", c.MetricsAddr, "serve Prometheus metrics at http://ADDR/metrics and the web console at http://ADDR/ (plain HTTP, read-only; default off)")
	fs.BoolVar(&c.Pprof, "pprof", c.Pprof, "also serve the Go profiler at http://METRICS_ADDR/debug/pprof/ (needs --metrics-addr)")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	fs.StringVar(&c.TLSDir, "tls-dir", c.TLSDir, "directory with ca.pem, node-ID.pem and node-ID-key.pem (made by dsmctl tls): mutual TLS on every TCP listener")
	fs.StringVar(&c.TLSCA, "tls-ca", c.TLSCA, "cluster CA certificate file (overrides --tls-dir)")
	fs.StringVar(&c.TLSCert, "tls-cert", c.TLSCert, "this node's certificate file, naming its --id (overrides --tls-dir)")
	fs.StringVar(&c.TLSKey, "tls-key", c.TLSKey, "this node's key file (overrides --tls-dir)")
	fs.BoolVar(&c.VerbsPlaintext, "verbs-plaintext", c.VerbsPlaintext, "verbs connections: authenticate with TLS, then send memory in plaintext (trusted fabrics only; all nodes must agree)")
	fs.BoolVar(&c.Insecure, "insecure", c.Insecure, "allow non-loopback addresses without TLS: anyone who reaches them can read and write the cluster's memory")
	fs.StringVar(&c.ConfigFile, "config", c.ConfigFile, "JSON file with the same settings (keys: id, data_dir, bind, port_base, join, ...); flags win")
	fs.Usage = func() {
		fmt.Fprint(out, `dsmd is the daemon of the DSM service on one machine: a member of the
cluster directory (Raft + gossip), the verbs endpoint of its memory, and the
gRPC Client and Admin services that the dsm library and dsmctl use.

Usage: dsmd --id N --data-dir DIR [flags]

Flags:
`)
		fs.PrintDefaults()
		fmt.Fprint(out, `
Example: a three-node cluster on one machine
  dsmd --id 1 --data-dir /var/lib/dsm/1 --port-base 7946 --bootstrap-expect 3
  dsmd --id 2 --data-dir /var/lib/dsm/2 --port-base 7956 --bootstrap-expect 3 --join 127.0.0.1:7946
  dsmd --id 3 --data-dir /var/lib/dsm/3 --port-base 7966 --bootstrap-expect 3 --join 127.0.0.1:7946
  DSM_ADDR=/var/lib/dsm/1/dsmd.sock dsmctl status

SIGTERM or SIGINT leaves the cluster gracefully and exits. SIGHUP reloads the
TLS certificate, key and CA files; new connections use them.

Without TLS, dsmd binds loopback addresses only, unless --insecure.
`)
	}
	return fs
}

type uintFlag struct{ p *uint32 }

func (f *uintFlag) String() string {
	if f.p == nil || *f.p == 0 {
		return ""
	}
	return strconv.FormatUint(uint64(*f.p), 10)
}

func (f *uintFlag) Set(v string) error {
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil {
		return fmt.Errorf("not a node id: %q", v)
	}
	*f.p = uint32(n)
	return nil
}

// ParseFlags reads args (without the program name): the defaults, then the
// --config file if one is named, then the flags given. It returns
// flag.ErrHelp for --help (the usage is written to out).
func ParseFlags(args []string, out io.Writer) (Config, error) {
	cfg := Default()
	fs := flags(&cfg, out)
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, &ConfigError{Setting: "", Reason: fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	if cfg.ConfigFile == "" {
		return cfg, cfg.Validate()
	}
	file := Default()
	b, err := os.ReadFile(cfg.ConfigFile)
	if err != nil {
		return Config{}, &ConfigError{Setting: "config", Reason: err.Error()}
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&file); err != nil {
		return Config{}, &ConfigError{Setting: "config", Reason: fmt.Sprintf("%s: %v", cfg.ConfigFile, err)}
	}
	file.ConfigFile = cfg.ConfigFile
	// Apply the flags given on the command line over the file.
	var joinGiven bool
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "join" {
			joinGiven = true
		}
	})
	if joinGiven {
		file.Join = nil
	}
	over := flags(&file, io.Discard)
	var setErr error
	fs.Visit(func(f *flag.Flag) {
		if setErr == nil && f.Name != "join" {
			setErr = over.Set(f.Name, f.Value.String())
		}
	})
	if joinGiven {
		file.Join = append([]string(nil), cfg.Join...)
	}
	if setErr != nil {
		return Config{}, setErr
	}
	return file, file.Validate()
}

// Usage writes dsmd's help text.
func Usage(out io.Writer) {
	c := Default()
	flags(&c, out).Usage()
}

// Validate checks the settings that do not need the network.
func (c Config) Validate() error {
	if c.ID == 0 {
		return &ConfigError{"id", "required: a node id from 1"}
	}
	if c.CheckpointAfter < 0 {
		return &ConfigError{"checkpoint-after", fmt.Sprintf("%d records: a count from 0 (never)", c.CheckpointAfter)}
	}
	if c.LeaveTimeout < Duration(time.Second) {
		return &ConfigError{"leave-timeout", fmt.Sprintf("%v: at least 1s (the departure itself needs it)", c.LeaveTimeout)}
	}
	if c.DataDir == "" {
		return &ConfigError{"data-dir", "required"}
	}
	if c.PortBase < 0 || c.PortBase+3 > 65535 {
		return &ConfigError{"port-base", fmt.Sprintf("%d leaves no room for four ports", c.PortBase)}
	}
	if c.BootstrapExpect < 0 {
		return &ConfigError{"bootstrap-expect", "must not be negative"}
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		return &ConfigError{"log-level", err.Error()}
	}
	for name, a := range map[string]string{"gossip-addr": c.GossipAddr, "raft-addr": c.RaftAddr,
		"rpc-addr": c.RPCAddr, "verbs-addr": c.VerbsAddr, "grpc-addr": c.GRPCAddr, "metrics-addr": c.MetricsAddr} {
		if a == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			return &ConfigError{name, fmt.Sprintf("%q is not host:port", a)}
		}
	}
	switch c.transport() {
	case TransportTCP:
		if c.OFIProvider != "" {
			return &ConfigError{"ofi-provider", "only with --transport ofi"}
		}
	case TransportOFI:
		if !ofiCompiled {
			return &ConfigError{"transport", errNoOFI.Error()}
		}
		if _, tlsOn := c.TLSFiles(); tlsOn && !c.Insecure {
			return &ConfigError{"transport", "ofi carries memory without TLS (libfabric authenticates nothing): with --tls-dir, give --insecure too, and run it on a fabric you trust entirely"}
		}
		if c.VerbsPlaintext {
			return &ConfigError{"verbs-plaintext", "only with --transport tcp (ofi has no TLS to authenticate with)"}
		}
	default:
		return &ConfigError{"transport", fmt.Sprintf("%q is none of tcp, ofi", c.Transport)}
	}
	if c.Pprof && c.MetricsAddr == "" {
		return &ConfigError{"pprof", "needs --metrics-addr: the profiler is served there"}
	}
	if _, err := c.SocketPerm(); err != nil {
		return err
	}
	if _, err := c.gossipKeys(); err != nil {
		return err
	}
	if c.Bind == "" && (c.GossipAddr == "" || c.RaftAddr == "" || c.RPCAddr == "" || c.VerbsAddr == "") {
		return &ConfigError{"bind", "required unless every address is given"}
	}
	if c.TLSDir == "" {
		for name, f := range map[string]string{"tls-ca": c.TLSCA, "tls-cert": c.TLSCert, "tls-key": c.TLSKey} {
			if f == "" && (c.TLSCA != "" || c.TLSCert != "" || c.TLSKey != "") {
				return &ConfigError{name, "needed with the other --tls-* files (or give --tls-dir)"}
			}
		}
	}
	_, tlsOn := c.TLSFiles()
	if c.VerbsPlaintext && !tlsOn {
		return &ConfigError{"verbs-plaintext", "needs TLS (--tls-dir): it authenticates with certificates"}
	}
	if !tlsOn && !c.Insecure {
		if name, a := c.Resolve().exposed(); name != "" {
			explicit := map[string]string{"gossip-addr": c.GossipAddr, "raft-addr": c.RaftAddr, "rpc-addr": c.RPCAddr, "verbs-addr": c.VerbsAddr, "grpc-addr": c.GRPCAddr}
			if explicit[name] == "" {
				name = "bind"
			}
			return &ConfigError{name, fmt.Sprintf("%s is not a loopback address, and TLS is off: give --tls-dir (see docs/security.md), or --insecure to expose the cluster without authentication", a)}
		}
	}
	return nil
}

// TLSFiles are the CA, certificate and key files of the node's TLS, and
// whether TLS is on.
func (c Config) TLSFiles() (tlsconf.Files, bool) {
	var f tlsconf.Files
	if c.TLSDir != "" {
		f = tlsconf.FilesIn(c.TLSDir, ids.NodeID(c.ID))
	}
	if c.TLSCA != "" {
		f.CA = c.TLSCA
	}
	if c.TLSCert != "" {
		f.Cert = c.TLSCert
	}
	if c.TLSKey != "" {
		f.Key = c.TLSKey
	}
	return f, f.CA != "" && f.Cert != "" && f.Key != ""
}

// exposed returns the first TCP or gossip address that is not loopback,
// by its flag name, or "" when all are loopback.
func (a Addrs) exposed() (name, addr string) {
	for _, x := range []struct{ name, addr string }{
		{"gossip-addr", a.Gossip}, {"raft-addr", a.Raft}, {"rpc-addr", a.RPC},
		{"verbs-addr", a.Verbs}, {"grpc-addr", a.GRPC},
	} {
		if strings.HasPrefix(x.addr, "ofi:") {
			// A started node's libfabric address; the host:port it
			// was opened on passed this check before.
			continue
		}
		if x.addr != "" && !isLoopback(x.addr) {
			return x.name, x.addr
		}
	}
	return "", ""
}

// isLoopback reports whether host:port binds a loopback interface only.
func isLoopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()

}

// SocketPerm is the mode and group of the local sockets, and the group's
// name ("" when it was given as a number or not at all).
func (c Config) SocketPerm() (SocketAccess, error) {
	var a SocketAccess
	a.Perm.Mode = 0o600
	if g := strings.TrimSpace(c.SocketGroup); g != "" {
		a.Perm.HasGroup = true
		if n, err := strconv.ParseUint(g, 10, 32); err == nil {
			a.Perm.Group = uint32(n)
		} else {
			gr, err := user.LookupGroup(g)
			if err != nil {
				return a, &ConfigError{"socket-group", fmt.Sprintf("no group %q on this machine", g)}
			}
			n, err := strconv.ParseUint(gr.Gid, 10, 32)
			if err != nil {
				return a, &ConfigError{"socket-group", fmt.Sprintf("group %q has gid %q, not a number", g, gr.Gid)}
			}
			a.Perm.Group, a.GroupName = uint32(n), g
		}
		a.Perm.Mode = 0o660
	}
	if m := strings.TrimSpace(c.SocketMode); m != "" {
		n, err := strconv.ParseUint(m, 8, 32)
		if err != nil || n > 0o777 {
			return a, &ConfigError{"socket-mode", fmt.Sprintf("%q is not permission bits in octal, from 0 to 0777 (e.g. 0660)", m)}
		}
		if n&0o600 != 0o600 {
			return a, &ConfigError{"socket-mode", fmt.Sprintf("%#o locks dsmd's own user out: it needs 0600", n)}
		}
		if a.Perm.HasGroup && n&0o060 != 0o060 {
			return a, &ConfigError{"socket-mode", fmt.Sprintf("%#o does not let --socket-group %s in: it needs 0060 (e.g. 0660)", n, c.SocketGroup)}
		}
		a.Perm.Mode = fs.FileMode(n)
	}
	return a, nil
}

// SocketAccess is how the local sockets are created and who may use them.
type SocketAccess struct {
	Perm localsock.Perm
	// GroupName names Perm.Group when the group was given by name.
	GroupName string
}

// Addrs are the resolved listen addresses of a Config.
type Addrs struct {
	Gossip, Raft, RPC, Verbs, GRPC string
	Socket, MapSocket              string
}

// Resolve derives every address the node binds from Bind and PortBase,
// keeping explicit ones.
func (c Config) Resolve() Addrs {
	port := func(off int) string { return net.JoinHostPort(c.Bind, strconv.Itoa(c.PortBase+off)) }
	pick := func(explicit string, off int) string {
		if explicit != "" {
			return explicit
		}
		return port(off)
	}
	a := Addrs{
		Gossip: pick(c.GossipAddr, 0), Raft: pick(c.RaftAddr, 1), RPC: pick(c.RPCAddr, 2),
		Verbs: pick(c.VerbsAddr, 3), GRPC: c.GRPCAddr,
		Socket: c.Socket, MapSocket: c.MapSocket,
	}
	if a.Socket == "" {
		a.Socket = filepath.Join(c.DataDir, "dsmd.sock")
	}
	if a.MapSocket == "" {
		a.MapSocket = filepath.Join(c.DataDir, "map.sock")
	}
	return a
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("unknown log level %q (debug, info, warn, error)", s)
	}
	return l, nil
}

// NewLogger returns a text logger to w at the configured level.
func (c Config) NewLogger(w io.Writer) *slog.Logger {
	l, err := parseLevel(c.LogLevel)
	if err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}
