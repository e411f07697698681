package cli

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/credentials"

	"github.com/dsmkit/dsm/internal/ids"
	"github.com/dsmkit/dsm/internal/tlsconf"
)

// tlsCmd groups the certificate tools: a cluster CA, node certificates and
// client certificates, as files in one directory.
func (a *app) tlsCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "tls",
		Short: "Make the cluster CA and the certificates of nodes and clients",
		Long: `Every TCP listener of dsmd speaks mutual TLS 1.3 with one cluster CA.
A node's certificate names its node id (URI dsm://node/N); a client's
(dsmctl over TCP) names dsm://client. The files go into one directory:

  ca.pem, ca-key.pem            the CA (keep ca-key.pem off the nodes)
  node-N.pem, node-N-key.pem    node N: dsmd --tls-dir DIR --id N
  client.pem, client-key.pem    dsmctl --tls-dir DIR --addr HOST:PORT

Existing files are never overwritten. See docs/security.md.`,
		Example: `  dsmctl tls ca create --dir /etc/dsm/tls
  dsmctl tls cert create --node 1 --dir /etc/dsm/tls --addr 10.0.0.1,n1.example
  dsmctl tls cert create --client --dir /etc/dsm/tls`,
		RunE: needSubcommand,
	}
	ca := &cobra.Command{Use: "ca", Short: "The cluster CA", RunE: needSubcommand,
		Example: "  dsmctl tls ca create --dir /etc/dsm/tls"}
	var caDir string
	caCreate := &cobra.Command{
		Use:     "create",
		Short:   "Make a new cluster CA (ECDSA P-256): ca.pem and ca-key.pem",
		Example: "  dsmctl tls ca create --dir /etc/dsm/tls",
		Args:    args(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ca, err := tlsconf.CreateCA(caDir)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.env.Stdout, "CA %q written to %s/%s (key: %s, keep it secret), valid until %s\n",
				ca.Cert.Subject.CommonName, caDir, tlsconf.CAFile, tlsconf.CAKeyFile, ca.Cert.NotAfter.UTC().Format("2006-01-02"))
			return nil
		},
	}
	caCreate.Flags().StringVar(&caDir, "dir", ".", "directory to write the CA into")
	ca.AddCommand(caCreate)

	certExample := `  dsmctl tls cert create --node 1 --dir /etc/dsm/tls --addr 10.0.0.1
  dsmctl tls cert create --client --dir /etc/dsm/tls
  dsmctl tls cert create --node 1 --dir /etc/dsm/tls --replace   # rotation; then SIGHUP dsmd`
	cert := &cobra.Command{Use: "cert", Short: "Node and client certificates", RunE: needSubcommand, Example: certExample}
	var (
		certDir string
		node    string
		client  bool
		addrs   []string
		replace bool
	)
	certCreate := &cobra.Command{
		Use:     "create (--node N | --client)",
		Short:   "Sign a node's or a client's certificate with the CA in --dir",
		Example: certExample,
		Args:    args(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var r tlsconf.Request
			switch {
			case node != "" && client:
				return usagef("--node and --client exclude each other")
			case node != "":
				n, err := strconv.ParseUint(node, 10, 32)
				if err != nil || n == 0 {
					return usagef("--node %q is not a node id (a number from 1)", node)
				}
				r.Node = ids.NodeID(n)
			case client:
				r.Client = true
				if len(addrs) > 0 {
					return usagef("--addr is for node certificates")
				}
			default:
				return usagef("say whose certificate: --node N or --client")
			}
			for _, s := range addrs {
				for _, p := range strings.Split(s, ",") {
					if p = strings.TrimSpace(p); p != "" {
						r.Addrs = append(r.Addrs, p)
					}
				}
			}
			ca, err := tlsconf.LoadCA(certDir)
			if err != nil {
				return err
			}
			is, err := ca.Issue(r)
			if err != nil {
				return err
			}
			f, err := tlsconf.WriteIssued(certDir, r, is, replace)
			if err != nil {
				return err
			}
			who := "client"
			if !r.Client {
				who = fmt.Sprintf("node %d", r.Node)
			}
			fmt.Fprintf(a.env.Stdout, "certificate of %s (%s) written to %s (key: %s), valid until %s\n",
				who, is.Cert.URIs[0], f.Cert, f.Key, is.Cert.NotAfter.UTC().Format("2006-01-02"))
			return nil
		},
	}
	fl := certCreate.Flags()
	fl.StringVar(&certDir, "dir", ".", "directory of the CA (ca.pem, ca-key.pem); the certificate is written there")
	fl.StringVar(&node, "node", "", "node id `N` the certificate names")
	fl.BoolVar(&client, "client", false, "a client certificate for dsmctl over TCP")
	fl.StringSliceVar(&addrs, "addr", nil, "more IP addresses or DNS names of the node (127.0.0.1 and localhost are always in)")
	fl.BoolVar(&replace, "replace", false, "replace an existing certificate and key (rotation: then send dsmd SIGHUP)")
	cert.AddCommand(certCreate)
	c.AddCommand(ca, cert)
	return c
}

// tlsFlags are dsmctl's certificate flags for a TCP --addr.
type tlsFlags struct {
	dir, ca, cert, key string
}

func (f *tlsFlags) bind(cmd *cobra.Command) {
	pf := cmd.PersistentFlags()
	pf.StringVar(&f.dir, "tls-dir", "", "directory with ca.pem, client.pem and client-key.pem for a TCP --addr ($DSM_TLS_DIR)")
	pf.StringVar(&f.ca, "tls-ca", "", "cluster CA certificate for a TCP --addr (overrides --tls-dir)")
	pf.StringVar(&f.cert, "tls-cert", "", "client certificate for a TCP --addr (overrides --tls-dir)")
	pf.StringVar(&f.key, "tls-key", "", "client key for a TCP --addr (overrides --tls-dir)")
}

// TLSDirEnv names the default of --tls-dir.
const TLSDirEnv = "DSM_TLS_DIR"

// given reports whether a certificate flag (or $DSM_TLS_DIR) is set.
func (f *tlsFlags) given(getenv func(string) string) bool {
	return f.dir != "" || f.ca != "" || f.cert != "" || f.key != "" || getenv(TLSDirEnv) != ""
}

// creds returns the TLS credentials for a TCP connection to dsmd, or nil
// when no certificate flag is set.
func (f *tlsFlags) creds(getenv func(string) string) (credentials.TransportCredentials, error) {
	dir := f.dir
	if dir == "" {
		dir = getenv(TLSDirEnv)
	}
	if dir == "" && f.ca == "" && f.cert == "" && f.key == "" {
		return nil, nil
	}
	files := tlsconf.Files{CA: f.ca, Cert: f.cert, Key: f.key}
	if dir != "" {
		d := tlsconf.FilesIn(dir, ids.None)
		if files.CA == "" {
			files.CA = d.CA
		}
		if files.Cert == "" {
			files.Cert = d.Cert
		}
		if files.Key == "" {
			files.Key = d.Key
		}
	}
	if files.CA == "" || files.Cert == "" || files.Key == "" {
		return nil, usagef("TLS needs a CA, a certificate and a key: give --tls-dir, or all of --tls-ca, --tls-cert and --tls-key")
	}
	m, err := tlsconf.Load(files)
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(m.ClientConfig(tlsconf.AnyNode)), nil
}
