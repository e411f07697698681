package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
)

// Sentinel errors.
var (
	// ErrIdentity is a verified certificate whose identity the check
	// refuses: another node than the one expected, a client where a node
	// is required, or no dsm:// identity at all.
	ErrIdentity = errors.New("tlsconf: certificate identity refused")
	// ErrFiles is a CA, certificate or key file that cannot be used.
	ErrFiles = errors.New("tlsconf: bad certificate files")
)

// URI scheme and hosts of the identities.
const (
	scheme     = "dsm"
	nodeHost   = "node"
	clientHost = "client"
)

// Identity is who a certificate names.
type Identity struct {
	// Node is the node id of a node certificate; ids.None for a client.
	Node ids.NodeID
	// Client marks an operator's client certificate (dsmctl).
	Client bool
}

func (id Identity) String() string {
	if id.Client {
		return "client"
	}
	return "node " + strconv.FormatUint(uint64(id.Node), 10)
}

// NodeURI is the URI SAN that names node n.
func NodeURI(n ids.NodeID) *url.URL {
	return &url.URL{Scheme: scheme, Host: nodeHost, Path: "/" + strconv.FormatUint(uint64(n), 10)}
}

// ClientURI is the URI SAN of a client certificate.
func ClientURI() *url.URL { return &url.URL{Scheme: scheme, Host: clientHost} }

// IdentityOf reads the identity a certificate names. It does not verify
// the certificate: callers pass one that chains to the CA.
func IdentityOf(c *x509.Certificate) (Identity, error) {
	var found []Identity
	for _, u := range c.URIs {
		if u.Scheme != scheme {
			continue
		}
		switch u.Host {
		case nodeHost:
			n, err := strconv.ParseUint(trimSlash(u.Path), 10, 32)
			if err != nil || n == 0 {
				return Identity{}, fmt.Errorf("%w: %q is no node id", ErrIdentity, u.String())
			}
			found = append(found, Identity{Node: ids.NodeID(n)})
		case clientHost:
			found = append(found, Identity{Client: true})
		}
	}
	switch len(found) {
	case 0:
		return Identity{}, fmt.Errorf("%w: the certificate of %q names no dsm:// identity", ErrIdentity, c.Subject.CommonName)
	case 1:
		return found[0], nil
	}
	return Identity{}, fmt.Errorf("%w: the certificate of %q names %d identities", ErrIdentity, c.Subject.CommonName, len(found))
}

func trimSlash(s string) string {
	if len(s) > 0 && s[0] == '/' {
		return s[1:]
	}
	return s
}

// Check decides whether a verified peer identity may talk to this
// listener or be the dialed peer.
type Check func(Identity) error

// Node accepts node n only.
func Node(n ids.NodeID) Check {
	return func(id Identity) error {
		if id.Client || id.Node != n {
			return fmt.Errorf("%w: the peer is %v, %v expected", ErrIdentity, id, Identity{Node: n})
		}
		return nil
	}
}

// AnyNode accepts every node of the cluster, and no client.
func AnyNode(id Identity) error {
	if id.Client || id.Node == ids.None {
		return fmt.Errorf("%w: the peer is a client, a node certificate is required", ErrIdentity)
	}
	return nil
}

// NodeOrClient accepts every node and every client certificate.
func NodeOrClient(Identity) error { return nil }

// Files names the PEM files of a Manager.
type Files struct {
	CA   string // the cluster CA certificate(s)
	Cert string // this process's certificate (and intermediates)
	Key  string // its private key
}

// FilesIn returns the names that Issue gives the files of node n in dir,
// or of the client when n is ids.None.
func FilesIn(dir string, n ids.NodeID) Files {
	base := "client"
	if n != ids.None {
		base = "node-" + strconv.FormatUint(uint64(n), 10)
	}
	return Files{
		CA:   filepath.Join(dir, CAFile),
		Cert: filepath.Join(dir, base+".pem"),
		Key:  filepath.Join(dir, base+"-key.pem"),
	}
}

// Names of the CA's files.
const (
	CAFile    = "ca.pem"
	CAKeyFile = "ca-key.pem"
)

// Manager holds the CA pool and the certificate of this process, and
// makes the TLS configs of its listeners and dialers. It is safe for
// concurrent use.
type Manager struct {
	files Files
	now   func() time.Time

	mu   sync.RWMutex
	pool *x509.CertPool
	cert *tls.Certificate
	self Identity
}

// Load reads files and returns a Manager over them. The certificate must
// chain to the CA.
func Load(files Files) (*Manager, error) {
	m := &Manager{files: files, now: time.Now}
	if err := m.Reload(); err != nil {
		return nil, err
	}
	return m, nil
}

// Reload reads the files again. On error the Manager keeps what it had;
// on success every later handshake uses the new CA and certificate.
func (m *Manager) Reload() error {
	pool, cert, self, err := load(m.files)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.pool, m.cert, m.self = pool, cert, self
	m.mu.Unlock()
	return nil
}

// Self is the identity of this process's certificate.
func (m *Manager) Self() Identity {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.self
}

// Leaf is this process's certificate, parsed.
func (m *Manager) Leaf() *x509.Certificate {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.cert.Leaf
}

func load(f Files) (*x509.CertPool, *tls.Certificate, Identity, error) {
	bad := func(format string, args ...any) (*x509.CertPool, *tls.Certificate, Identity, error) {
		return nil, nil, Identity{}, fmt.Errorf("%w: "+format, append([]any{ErrFiles}, args...)...)
	}
	caPEM, err := os.ReadFile(f.CA)
	if err != nil {
		return bad("CA: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return bad("CA: %s holds no PEM certificate", f.CA)
	}
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return bad("certificate %s with key %s: %v", f.Cert, f.Key, err)
	}
	leaf := cert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return bad("certificate %s: %v", f.Cert, err)
		}
		cert.Leaf = leaf
	}
	inter := x509.NewCertPool()
	for _, der := range cert.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return bad("certificate %s is not valid under the CA %s: %v", f.Cert, f.CA, err)
	}
	self, err := IdentityOf(leaf)
	if err != nil {
		return bad("certificate %s: %v", f.Cert, err)
	}
	return pool, &cert, self, nil
}

func (m *Manager) current() (*x509.CertPool, *tls.Certificate) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.pool, m.cert
}

// verify checks the peer's chain against the current CA, for usage, and
// its identity with check; it returns the identity.
func (m *Manager) verify(certs []*x509.Certificate, usage x509.ExtKeyUsage, check Check) (Identity, error) {
	if len(certs) == 0 {
		return Identity{}, fmt.Errorf("%w: the peer sent no certificate", ErrIdentity)
	}
	pool, _ := m.current()
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{
		Roots: pool, Intermediates: inter, CurrentTime: m.now(), KeyUsages: []x509.ExtKeyUsage{usage},
	}); err != nil {
		return Identity{}, fmt.Errorf("tlsconf: the peer's certificate %q is not valid under the cluster CA: %w", certs[0].Subject.CommonName, err)
	}
	id, err := IdentityOf(certs[0])
	if err != nil {
		return Identity{}, err
	}
	if check != nil {
		if err := check(id); err != nil {
			return Identity{}, err
		}
	}
	return id, nil
}

// ServerConfig is the config of a listener: TLS 1.3, a client certificate
// required, valid under the CA, and accepted by check. It reads the CA and
// this process's certificate at each handshake, so Reload applies to the
// next connection.
//
// The caller may set NextProtos (ALPN) on the returned config before its
// first use; every handshake offers them.
func (m *Manager) ServerConfig(check Check) *tls.Config {
	cfg := &tls.Config{MinVersion: tls.VersionTLS13}
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		pool, cert := m.current()
		return &tls.Config{
			NextProtos:   cfg.NextProtos,
			MinVersion:   tls.VersionTLS13,
			Certificates: []tls.Certificate{*cert},
			ClientAuth:   tls.RequireAndVerifyClientCert,
			ClientCAs:    pool,
			// The chain was verified against pool by the handshake;
			// verify again, against the same pool, for the identity.
			VerifyPeerCertificate: func(_ [][]byte, chains [][]*x509.Certificate) error {
				if len(chains) == 0 {
					return fmt.Errorf("%w: no verified chain", ErrIdentity)
				}
				_, err := m.verify(chains[0], x509.ExtKeyUsageClientAuth, check)
				return err
			},
			SessionTicketsDisabled: true,
		}, nil
	}
	return cfg
}

// ClientConfig is the config of a dialer: TLS 1.3, this process's
// certificate presented, and the listener's certificate valid under the
// CA and accepted by check. Addresses are not checked: a peer is who its
// certificate names.
func (m *Manager) ClientConfig(check Check) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			_, cert := m.current()
			return cert, nil
		},
		// The chain is verified by VerifyConnection against the CA of the
		// moment, and the identity instead of a host name.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := m.verify(cs.PeerCertificates, x509.ExtKeyUsageServerAuth, check)
			return err
		},
	}
}

// PeerIdentity is the identity of the peer of an established connection
// made with a config of this package: its certificate was verified by the
// handshake.
func PeerIdentity(cs tls.ConnectionState) (Identity, error) {
	if !cs.HandshakeComplete || len(cs.PeerCertificates) == 0 {
		return Identity{}, fmt.Errorf("%w: the connection has no verified peer certificate", ErrIdentity)
	}
	return IdentityOf(cs.PeerCertificates[0])
}

// PeerNode is the node id the peer's verified certificate names; a client
// certificate is refused.
func PeerNode(cs tls.ConnectionState) (ids.NodeID, error) {
	id, err := PeerIdentity(cs)
	if err != nil {
		return ids.None, err
	}
	if err := AnyNode(id); err != nil {
		return ids.None, err
	}
	return id.Node, nil
}
