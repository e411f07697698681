package tlsconf

import (
	"crypto/x509"
	"net/url"
	"testing"
	"time"
)

// FuzzIdentityOf: a peer's certificate comes from the network; whatever
// parses as one, IdentityOf returns an identity or an error, never panics,
// and an identity it returns is a node from 1 or the client.
func FuzzIdentityOf(f *testing.F) {
	ca, err := NewCA("fuzz", time.Hour)
	if err != nil {
		f.Fatal(err)
	}
	for _, r := range []Request{{Node: 1}, {Node: 4294967295}, {Client: true}} {
		is, err := ca.Issue(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(is.Cert.Raw, is.Cert.URIs[0].String())
	}
	f.Add(ca.Cert.Raw, "dsm://node/0")
	f.Add([]byte{}, "dsm://node/99999999999")
	f.Fuzz(func(t *testing.T, der []byte, uri string) {
		check := func(c *x509.Certificate) {
			id, err := IdentityOf(c)
			if err == nil && id.Client == (id.Node != 0) {
				t.Fatalf("identity %+v of %v", id, c.URIs)
			}
		}
		if c, err := x509.ParseCertificate(der); err == nil {
			check(c)
		}
		// The URI alone, as a certificate would carry it.
		if u, err := url.Parse(uri); err == nil {
			check(&x509.Certificate{URIs: []*url.URL{u}})
		}
	})
}
