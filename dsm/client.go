package dsm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/dsmkit/dsm/internal/mapclient"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
	"github.com/dsmkit/dsm/internal/sockaddr"
)

// DefaultAddr is where Dial finds dsmd when neither its addr argument nor
// $DSM_ADDR says otherwise: the local dsmd's Unix socket.
const DefaultAddr = "/run/dsm/dsmd.sock"

// AddrEnv is the environment variable that overrides DefaultAddr.
const AddrEnv = "DSM_ADDR"

// Client is a connection to the local dsmd. It is safe for concurrent use.
// Create it with Dial; Close it when done.
type Client struct {
	addr      string // as given, for messages
	conn      *grpc.ClientConn
	rpc       dsmpb.ClientClient
	nodeID    uint32
	version   string
	mapSocket string

	mu      sync.Mutex
	closed  bool
	mc      *mapclient.Client
	regions map[*Region]struct{}
	dialErr error // the dialer's last error, to explain a failed Dial
}

// Dial connects to the dsmd at addr and asks it for its session (node id,
// version, mapping socket). An empty addr means $DSM_ADDR, else
// DefaultAddr. An address is a Unix socket path ("/run/dsm/dsmd.sock",
// "unix:///path", "unix:path") or a TCP "host:port" ("tcp://host:port");
// mapping regions needs the Unix socket of a dsmd on this machine. ctx
// bounds the first exchange; a failure says which address was tried and
// matches ErrDaemonUnavailable.
func Dial(ctx context.Context, addr string) (*Client, error) {
	if addr == "" {
		addr = os.Getenv(AddrEnv)
	}
	if addr == "" {
		addr = DefaultAddr
	}
	network, address := sockaddr.Split(addr)
	if address == "" {
		return nil, newErr("dial", "", noOffset, ErrInvalidArgument, fmt.Errorf("empty address %q", addr))
	}
	c := &Client{addr: addr, regions: make(map[*Region]struct{})}
	dial := func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, network, address)
		c.mu.Lock()
		c.dialErr = err
		c.mu.Unlock()
		return conn, err
	}
	// A local daemon that restarts is back within seconds: reconnect
	// quickly rather than with gRPC's default backoff of up to two minutes.
	bo := backoff.DefaultConfig
	bo.MaxDelay = time.Second
	conn, err := grpc.NewClient("passthrough:///"+address,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dial),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: 5 * time.Second}),
	)
	if err != nil {
		return nil, newErr("dial", "", noOffset, ErrInvalidArgument, fmt.Errorf("dsmd at %s: %w", addr, err))
	}
	c.conn, c.rpc = conn, dsmpb.NewClientClient(conn)
	s, err := c.rpc.Session(ctx, &dsmpb.SessionRequest{})
	if err != nil {
		conn.Close()
		return nil, c.dialError(err)
	}
	c.nodeID, c.version, c.mapSocket = s.GetNodeId(), s.GetVersion(), s.GetMapSocket()
	return c, nil
}

// dialError explains a failed Session call of Dial.
func (c *Client) dialError(err error) error {
	c.mu.Lock()
	derr := c.dialErr
	c.mu.Unlock()
	if derr != nil {
		return newErr("dial", "", noOffset, ErrDaemonUnavailable, fmt.Errorf(
			"dsmd at %s: %s (is dsmd running? pass its socket path to Dial or set $%s; the default is %s): %w",
			c.addr, sockaddr.DialReason(derr), AddrEnv, DefaultAddr, derr))
	}
	e := rpcErr("dial", "", err).(*Error)
	e.Err = fmt.Errorf("dsmd at %s: %w", c.addr, err)
	if e.Kind == ErrPermissionDenied {
		e.Err = &saidError{fmt.Sprintf("dsmd at %s refused: %s", c.addr,
			strings.TrimPrefix(causeText(err), "permission denied: ")), err}
	}
	return e
}

// saidError is err said in other words.
type saidError struct {
	msg string
	err error
}

func (e *saidError) Error() string { return e.msg }
func (e *saidError) Unwrap() error { return e.err }

// NodeID is the id of the dsmd this Client talks to.
func (c *Client) NodeID() uint32 { return c.nodeID }

// Version is the build version of the dsmd this Client talks to.
func (c *Client) Version() string { return c.version }

// Durability says what Sync promises for a region.
type Durability int

// Durabilities. The zero value is not one: WithDurability(0) is refused.
const (
	// Memory: pages live only in memory. Sync writes dirty pages back to
	// their home and to the region's backups (one per page unless the
	// region was created with more), so losing up to that many nodes loses no synced byte; a crash of a
	// page's holder loses its unsynced writes, and a restart of the whole
	// cluster loses every page.
	Memory Durability = 1 + iota
	// Durable asks for pages that also survive a restart of the whole
	// cluster. Sync of a Durable region writes back as for Memory, then
	// persists the pages this machine wrote on disk, at their homes and
	// at each backup, before it returns; a disk fault there fails it
	// (codes.Unavailable, naming the node and the cause). Reloading them
	// is not built yet: a restarted node rejoins empty, and a restart of
	// the whole cluster still loses the region's pages
	// (docs/durability.md).
	Durable
)

// String names the durability ("memory", "durable").
func (d Durability) String() string {
	switch d {
	case Memory:
		return "memory"
	case Durable:
		return "durable"
	}
	return fmt.Sprintf("Durability(%d)", int(d))
}

func (d Durability) pb() dsmpb.Durability {
	switch d {
	case Memory:
		return dsmpb.Durability_DURABILITY_MEMORY
	case Durable:
		return dsmpb.Durability_DURABILITY_DURABLE
	}
	return dsmpb.Durability_DURABILITY_UNSPECIFIED
}

func durabilityOf(d dsmpb.Durability) Durability {
	switch d {
	case dsmpb.Durability_DURABILITY_MEMORY:
		return Memory
	case dsmpb.Durability_DURABILITY_DURABLE:
		return Durable
	}
	return 0
}

// RegionOption is an option of CreateRegion.
type RegionOption func(*regionSpec)

type regionSpec struct {
	pageSize   int
	durability Durability
}

// WithPageSize sets the region's page size, its unit of coherence: a power
// of two from 4096 to 2 MiB (default 4096). The size must be a multiple.
func WithPageSize(n int) RegionOption {
	return func(s *regionSpec) { s.pageSize = n }
}

// WithDurability sets what Sync promises for the region (default Memory).
func WithDurability(d Durability) RegionOption {
	return func(s *regionSpec) { s.durability = d }
}

// RegionInfo describes a region.
type RegionInfo struct {
	Name       string
	ID         uint32
	Size       int64
	PageSize   int
	Durability Durability
	// Shards is the number of shards the pages are split into for
	// placement across the cluster.
	Shards int
	// ContentsLost: the region lost its contents at a restart of the whole
	// cluster (a Memory region, brought back empty: its pages read zeros).
	// A Durable region comes back with its synced pages and never says so.
	ContentsLost bool
}

func regionInfo(r *dsmpb.Region) RegionInfo {
	return RegionInfo{Name: r.GetName(), ID: r.GetId(), Size: int64(r.GetSize()),
		PageSize: int(r.GetPageSize()), Durability: durabilityOf(r.GetDurability()),
		Shards: int(r.GetShards()), ContentsLost: r.GetContentsLost()}
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// CreateRegion creates a region of size bytes in the cluster (a multiple
// of the page size). It is idempotent: creating a region that already
// exists with the same spec succeeds and leaves that region and its data
// as they are (it does not say which happened); with another spec it
// fails with ErrExists. A bad name, size or option is ErrInvalidArgument.
func (c *Client) CreateRegion(ctx context.Context, name string, size int64, opts ...RegionOption) error {
	const op = "create region"
	if c.isClosed() {
		return newErr(op, name, noOffset, ErrClosed, nil)
	}
	spec := regionSpec{durability: Memory}
	for _, o := range opts {
		o(&spec)
	}
	if size <= 0 {
		return newErr(op, name, noOffset, ErrInvalidArgument, fmt.Errorf("size %d is not positive", size))
	}
	if spec.pageSize < 0 || int64(spec.pageSize) > 1<<31 {
		return newErr(op, name, noOffset, ErrInvalidArgument, fmt.Errorf("page size %d", spec.pageSize))
	}
	if spec.durability.pb() == dsmpb.Durability_DURABILITY_UNSPECIFIED {
		return newErr(op, name, noOffset, ErrInvalidArgument, fmt.Errorf("unknown durability %v", spec.durability))
	}
	_, err := c.rpc.CreateRegion(ctx, &dsmpb.CreateRegionRequest{Name: name, Size: uint64(size),
		PageSize: uint32(spec.pageSize), Durability: spec.durability.pb()})
	return rpcErr(op, name, err)
}

// Regions lists the cluster's regions, by name.
func (c *Client) Regions(ctx context.Context) ([]RegionInfo, error) {
	if c.isClosed() {
		return nil, newErr("list regions", "", noOffset, ErrClosed, nil)
	}
	resp, err := c.rpc.ListRegions(ctx, &dsmpb.ListRegionsRequest{})
	if err != nil {
		return nil, rpcErr("list regions", "", err)
	}
	infos := make([]RegionInfo, 0, len(resp.GetRegions()))
	for _, r := range resp.GetRegions() {
		infos = append(infos, regionInfo(r))
	}
	return infos, nil
}

// DeleteOption is an option of DeleteRegion.
type DeleteOption func(*deleteSpec)

type deleteSpec struct {
	force bool
}

// Force makes DeleteRegion delete a region even while processes map it
// (on any node, this one included): their mappings die with
// ErrRegionDeleted, and plain accesses through their Bytes() fault.
func Force() DeleteOption {
	return func(s *deleteSpec) { s.force = true }
}

// DeleteRegion removes a region and frees its pages everywhere. An unknown
// name is ErrUnknownRegion. While processes map the region it fails with
// ErrInUse, unless Force is given. A region created again under the same
// name is a new, empty region with a new id.
func (c *Client) DeleteRegion(ctx context.Context, name string, opts ...DeleteOption) error {
	const op = "delete region"
	if c.isClosed() {
		return newErr(op, name, noOffset, ErrClosed, nil)
	}
	var spec deleteSpec
	for _, o := range opts {
		o(&spec)
	}
	_, err := c.rpc.DeleteRegion(ctx, &dsmpb.DeleteRegionRequest{Name: name, Force: spec.force})
	return rpcErr(op, name, err)
}

// Close closes every Region mapped through this Client (see Region.Close)
// and the connection to dsmd.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	regions := make([]*Region, 0, len(c.regions))
	for r := range c.regions {
		regions = append(regions, r)
	}
	mc := c.mc
	c.mu.Unlock()
	var errs []error
	for _, r := range regions {
		if err := r.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if mc != nil {
		if err := mc.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := c.conn.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
