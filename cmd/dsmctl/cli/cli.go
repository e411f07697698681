package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
	"github.com/dsmkit/dsm/internal/sockaddr"
)

// DefaultAddr is the socket dsmctl talks to when neither --addr nor
// $DSM_ADDR says otherwise: the local dsmd's Unix socket, where the systemd
// unit and `dsmd` without flags put it.
const DefaultAddr = "/run/dsm/dsmd.sock"

// AddrEnv is the environment variable that overrides DefaultAddr.
const AddrEnv = "DSM_ADDR"

// Exit codes of Run. Scripts and probes rely on them.
const (
	ExitOK        = 0 // the command did what it was asked
	ExitError     = 1 // it failed: the message says why
	ExitUsage     = 2 // the command line is wrong: dsmctl saw it, or dsmd answered INVALID_ARGUMENT
	ExitDegraded  = 3 // status: serving, with less margin (a member down, a backup missing)
	ExitUnhealthy = 4 // status: some requests cannot be served, or health unknown
)

// Env is the world a command runs in. The zero value is not usable; take
// OSEnv, or fill every field in tests.
type Env struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// Getenv reads the environment ($DSM_ADDR, $NO_COLOR, $TERM).
	Getenv func(string) string
	// StdoutTTY and StderrTTY say whether those are terminals: colors and
	// screen refreshes go to a terminal only, the bench progress bar to a
	// terminal on stderr only.
	StdoutTTY, StderrTTY bool
	// Now is the wall clock, used only to show ages ("3s ago").
	Now func() time.Time
}

// OSEnv is the process's own environment.
func OSEnv() Env {
	return Env{
		Stdin:     os.Stdin,
		Stdout:    os.Stdout,
		Stderr:    os.Stderr,
		Getenv:    os.Getenv,
		StdoutTTY: isTerminal(os.Stdout),
		StderrTTY: isTerminal(os.Stderr),
		Now:       time.Now,
	}
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// app is one invocation of dsmctl: its flags, its connection, its exit code.
type app struct {
	env     Env
	addr    string
	json    bool
	timeout time.Duration
	tls     tlsFlags

	exit int // set by commands whose result is an exit code (status)

	mu      sync.Mutex
	conn    *grpc.ClientConn
	dialErr error // the last error of the dialer, to explain UNAVAILABLE
}

// Run runs dsmctl with args (without the program name) and returns the
// process exit code. Errors are printed to env.Stderr as one line.
func Run(ctx context.Context, args []string, env Env) int {
	if env.Now == nil {
		env.Now = time.Now
	}
	if env.Getenv == nil {
		env.Getenv = func(string) string { return "" }
	}
	a := &app{env: env}
	defer a.close()
	root := a.rootCmd()
	root.SetArgs(args)
	root.SetIn(env.Stdin)
	root.SetOut(env.Stdout)
	root.SetErr(env.Stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return a.exit
	}
	var u usageError
	switch {
	case errors.As(err, &u) && u.helped:
		fmt.Fprintf(env.Stderr, "dsmctl: %s\n", oneLine(err.Error()))
		return ExitUsage
	case errors.As(err, &u) || strings.HasPrefix(err.Error(), "unknown command"):
		fmt.Fprintf(env.Stderr, "dsmctl: %s — see `dsmctl %s--help`\n", oneLine(err.Error()), helpPath(root, args))
		return ExitUsage
	}
	fmt.Fprintf(env.Stderr, "dsmctl: %s\n", a.describe(err))
	if status.Code(err) == codes.InvalidArgument {
		// dsmd found the request itself wrong: the command line was.
		return ExitUsage
	}
	return ExitError
}

// helpPath is the command path of args that names real commands, for the
// hint of a usage error ("region create ").
func helpPath(root *cobra.Command, args []string) string {
	c, _, err := root.Find(args)
	if err != nil || c == root {
		return ""
	}
	return strings.TrimPrefix(c.CommandPath(), root.Name()+" ") + " "
}

// usageError is a wrong command line: exit code ExitUsage. helped says
// that the command's help was printed already, so the line needs no hint.
type usageError struct {
	err    error
	helped bool
}

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

// hintError is an error with what to try next, said after the error's own
// line ("... — add --force to delete it anyway").
type hintError struct {
	err  error
	hint string
}

func (h hintError) Error() string { return h.err.Error() + " — " + h.hint }
func (h hintError) Unwrap() error { return h.err }

func usagef(format string, args ...any) error {
	return usageError{err: fmt.Errorf(format, args...)}
}

// args checks the number of positional arguments; names is what the help
// calls them.
func args(min, max int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if len(a) < min || len(a) > max {
			path := strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ")
			return usagef("%s takes %s, got %d argument%s", path, names, len(a), plural(len(a)))
		}
		return nil
	}
}

// needSubcommand is the RunE of a command that only groups others: it
// prints the command's help to stderr and fails as a usage error.
func needSubcommand(cmd *cobra.Command, _ []string) error {
	cmd.SetOut(cmd.ErrOrStderr())
	if err := cmd.Help(); err != nil {
		return err
	}
	var names []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() {
			names = append(names, c.Name())
		}
	}
	if !cmd.HasParent() {
		return usageError{fmt.Errorf("no command given; the commands are %s", strings.Join(names, ", ")), true}
	}
	path := strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ")
	return usageError{fmt.Errorf("%s needs a subcommand: %s", path, strings.Join(names, ", ")), true}
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "dsmctl",
		Short: "Operate a DSM cluster: status, regions, pages, statistics, memory",
		Long: `dsmctl is the operator's window into a DSM cluster. It talks to one dsmd
over its admin API (gRPC) and, through it, shows the whole cluster: members,
Raft, regions and their placement, the MSI state of pages as a picture,
live statistics; it can create and delete regions and read and write region
memory through the coherence protocol.

The daemon is found at --addr, else $DSM_ADDR, else ` + DefaultAddr + `.
An address is a Unix socket path (/run/dsm/dsmd.sock, unix:///path) or a
TCP host:port (127.0.0.1:7400).

Exit codes: 0 success, 1 error, 2 bad command line (found by dsmctl, or
refused by dsmd as an invalid request), 3 status degraded, 4 status
unhealthy.`,
		Example: `  dsmctl status
  dsmctl --addr 127.0.0.1:7400 region ls
  DSM_ADDR=/tmp/n2.sock dsmctl pages feat --range 0:4096`,
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE:          needSubcommand,
	}
	def := a.env.Getenv(AddrEnv)
	if def == "" {
		def = DefaultAddr
	}
	pf := root.PersistentFlags()
	pf.StringVar(&a.addr, "addr", def, "dsmd admin address: a Unix socket path or host:port ($"+AddrEnv+")")
	pf.BoolVar(&a.json, "json", false, "print stable JSON instead of tables")
	pf.DurationVar(&a.timeout, "timeout", 10*time.Second, "deadline of each request to dsmd")
	a.tls.bind(root)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err: err} })
	// A command that groups others (dsmctl, region) runs only to say that a
	// subcommand is missing: its usage shows "region [command]", not the
	// "region [flags]" of a runnable command.
	root.SetUsageTemplate(strings.Replace(root.UsageTemplate(),
		"{{if .Runnable}}", "{{if and .Runnable (not .HasAvailableSubCommands)}}", 1))
	root.AddCommand(
		a.statusCmd(), a.membersCmd(), a.raftCmd(), a.regionCmd(), a.pagesCmd(),
		a.topCmd(), a.getCmd(), a.putCmd(), a.benchCmd(), a.tlsCmd(), a.keyringCmd(), a.keygenCmd(),
	)
	return root
}

// admin connects to dsmd on first use. grpc.NewClient does not dial: the
// first RPC does, and a failure surfaces as UNAVAILABLE, explained by the
// dialer's recorded error (describe).
func (a *app) admin() (dsmpb.AdminClient, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn == nil {
		network, address := sockaddr.Split(a.addr)
		if address == "" {
			return nil, usagef("--addr is empty")
		}
		dial := func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, network, address)
			a.mu.Lock()
			a.dialErr = err // nil once connected: later UNAVAILABLEs come from dsmd
			a.mu.Unlock()
			return c, err
		}
		creds, err := a.transportCreds(network)
		if err != nil {
			return nil, err
		}
		conn, err := grpc.NewClient("passthrough:///"+address,
			grpc.WithTransportCredentials(creds),
			grpc.WithContextDialer(dial),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)),
		)
		if err != nil {
			return nil, fmt.Errorf("dsmd at %s: %w", a.addr, err)
		}
		a.conn = conn
	}
	return dsmpb.NewAdminClient(a.conn), nil
}

// transportCreds are the credentials of a connection to dsmd over network:
// none on a Unix socket, mutual TLS over TCP when a certificate flag is
// set.
func (a *app) transportCreds(network string) (credentials.TransportCredentials, error) {
	if network == "unix" {
		return insecure.NewCredentials(), nil
	}
	c, err := a.tls.creds(a.env.Getenv)
	if err != nil || c != nil {
		return c, err
	}
	return insecure.NewCredentials(), nil
}

func (a *app) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn != nil {
		a.conn.Close()
		a.conn = nil
	}
}

// completeRegion completes the first argument of a command that takes a
// region name, from the regions dsmd lists; on any error it offers nothing
// and says nothing (a shell completion must not print errors), within a
// short deadline.
func (a *app) completeRegion(cmd *cobra.Command, argv []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	none := cobra.ShellCompDirectiveNoFileComp
	if len(argv) > 0 {
		return nil, none
	}
	cl, err := a.admin()
	if err != nil {
		return nil, none
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), min(a.timeout, 2*time.Second))
	defer cancel()
	rs, err := cl.Regions(ctx, &dsmpb.RegionsRequest{})
	if err != nil {
		return nil, none
	}
	var names []string
	for _, r := range rs.Regions {
		if strings.HasPrefix(r.GetName(), toComplete) {
			names = append(names, r.GetName())
		}
	}
	sort.Strings(names)
	return names, none
}

// call is the context of one request: the command's, bounded by --timeout.
func (a *app) call(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	return context.WithTimeout(cmd.Context(), a.timeout)
}

// describe turns an error into the one line dsmctl prints: what failed,
// where, and what to try.
func (a *app) describe(err error) string {
	where := "dsmd at " + a.addr
	var h hintError
	if errors.As(err, &h) {
		return a.describe(h.err) + " — " + h.hint
	}
	var se interface {
		error
		GRPCStatus() *status.Status
	}
	if !errors.As(err, &se) {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Sprintf("%s did not answer within %v — is it overloaded? raise --timeout", where, a.timeout)
		}
		return oneLine(err.Error())
	}
	st := se.GRPCStatus()
	// Keep what the command added around the gRPC error ("after 1048576 of
	// 2097152 bytes: ").
	if prefix := oneLine(strings.TrimSuffix(err.Error(), se.Error())); prefix != "" && prefix != oneLine(err.Error()) {
		return prefix + " " + a.describeStatus(st, where)
	}
	return a.describeStatus(st, where)
}

func (a *app) describeStatus(st *status.Status, where string) string {
	msg := userMessage(st.Message())
	switch st.Code() {
	case codes.Unavailable:
		if pageUnavailable(st) {
			return msg + " — see `dsmctl members`"
		}
		a.mu.Lock()
		derr := a.dialErr
		a.mu.Unlock()
		if derr != nil {
			return fmt.Sprintf("%s: %s — is dsmd running? try `dsmctl status --addr ADDR` or set $%s", where, sockaddr.DialReason(derr), AddrEnv)
		}
		if network, _ := sockaddr.Split(a.addr); network == "tcp" && !a.tls.given(a.env.Getenv) && strings.Contains(msg, "server preface") {
			return fmt.Sprintf("%s closed the connection: %s — if it runs with TLS, give --tls-dir with a client certificate (`dsmctl tls cert create --client`)", where, msg)
		}
		return fmt.Sprintf("%s: unavailable: %s — retry, or look at `dsmctl status`", where, msg)
	case codes.DeadlineExceeded:
		return fmt.Sprintf("%s did not answer within %v — raise --timeout, or look at `dsmctl status`", where, a.timeout)
	case codes.NotFound:
		if strings.Contains(msg, "region") {
			return msg + " — list regions with `dsmctl region ls`"
		}
		return msg
	case codes.InvalidArgument, codes.AlreadyExists, codes.FailedPrecondition:
		return msg
	case codes.Unimplemented:
		return fmt.Sprintf("%s does not offer this: %s — are dsmctl and dsmd the same version?", where, msg)
	case codes.PermissionDenied:
		return fmt.Sprintf("%s refused: %s", where, msg)
	case codes.Canceled:
		return "interrupted"
	}
	return fmt.Sprintf("%s: %s: %s", where, strings.ToLower(st.Code().String()), msg)
}

// pageUnavailable reports whether an UNAVAILABLE status is about a page
// that waits for a node that is down, not about dsmd itself.
func pageUnavailable(st *status.Status) bool {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == "PAGE_UNAVAILABLE" { // types.proto
			return true
		}
	}
	return false
}

// internalPrefix matches the prefix of an error of one of dsmd's internal
// packages ("directory: ", "localcache: "), at the start of a message or of
// one of its wrapped parts (after ": ").
var internalPrefix = regexp.MustCompile(`(^|: )(?:directory|localcache|engine|node|coherence|placement|mapclient|` +
	`uffd|memfd|fdpass|rdma|tcp|ofi|raft|memberlist|pebble): `)

// specFields names the fields of a region spec that dsmd reports as
// "invalid region spec: FIELD: why" in the words of dsmctl's arguments.
var specFields = map[string]string{
	"Name": "region name", "Size": "region size", "PageSize": "page size",
	"ShardSize": "shard size", "Backups": "backup count", "Durability": "durability",
}

// userMessage is a message of dsmd in the user's terms: on one line, without
// the names of dsmd's internal packages, and a bad region spec named by
// what the user gave ("invalid region spec: Size: zero" becomes "bad region
// size: zero"). A message it does not recognise passes unchanged.
func userMessage(msg string) string {
	msg = oneLine(msg)
	for { // "node: directory: x" takes two rounds: matches do not overlap
		m := internalPrefix.ReplaceAllString(msg, "$1")
		if m == msg {
			break
		}
		msg = m
	}
	const spec = "invalid region spec: "
	if i := strings.Index(msg, spec); i >= 0 {
		field, why, ok := strings.Cut(msg[i+len(spec):], ": ")
		name, known := specFields[field]
		if !known {
			name = "region " + strings.ToLower(field)
		}
		if ok && field != "" && !strings.Contains(field, " ") {
			msg = msg[:i] + "bad " + name + ": " + why
		}
	}
	return msg
}

// printJSON writes v as indented JSON: field order is that of the structs,
// map keys are sorted, so the output is stable.
func (a *app) printJSON(v any) error { return a.printJSONTo(a.env.Stdout, v) }

// printJSONTo is printJSON to w.
func (a *app) printJSONTo(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	_, err = w.Write(b)
	return err
}

// color says whether stdout gets ANSI colors: a terminal, $NO_COLOR unset,
// $TERM not dumb, and not --json.
func (a *app) color() bool {
	return a.env.StdoutTTY && !a.json && a.env.Getenv("NO_COLOR") == "" && a.env.Getenv("TERM") != "dumb"
}
