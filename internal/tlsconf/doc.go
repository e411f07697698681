// Package tlsconf is the mutual TLS of the cluster's TCP listeners: one
// cluster CA signs a certificate for every node and for each operator's
// dsmctl, and every connection checks the other side's certificate against
// that CA and the identity it names.
//
// # Identities
//
// A certificate names its holder with a URI subject alternative name:
//
//	dsm://node/N    node N (N a node id from 1); usable as server and client
//	dsm://client    an operator's client (dsmctl); usable as client only
//
// The subject's common name repeats it for people ("node-3", "client"),
// and is never used for a decision. A node certificate also carries the
// IP and DNS names given when it was made (127.0.0.1 always), but peers
// identify each other by the URI, not by address: a node is who its
// certificate says, wherever it connects from.
//
// # Files
//
// Issue writes PEM files into one directory, the names dsmd's --tls-dir and
// dsmctl's --tls-dir look for (FilesIn):
//
//	ca.pem, ca-key.pem              the cluster CA (keep ca-key.pem off the nodes)
//	node-N.pem, node-N-key.pem      node N
//	client.pem, client-key.pem      dsmctl
//
// # Configs and reload
//
// A Manager holds the CA pool and this process's certificate, loaded from
// files, and hands out tls.Configs that read them at each handshake
// (GetConfigForClient, GetClientCertificate, VerifyConnection): Reload
// swaps the files' contents in, and every later handshake uses them; the
// connections already up keep the keys they agreed on. Every config is TLS
// 1.3 only and requires a certificate of the peer that chains to the CA
// and whose identity passes the caller's check (Node, AnyNode,
// NodeOrClient).
package tlsconf
