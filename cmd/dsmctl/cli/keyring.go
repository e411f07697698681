package cli

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

type keyringKeyJSON struct {
	Key       string `json:"key"`
	Installed uint32 `json:"installed"`
	Primary   uint32 `json:"primary"`
}

type keyringErrorJSON struct {
	Node  uint32 `json:"node_id"`
	Error string `json:"error"`
}

type keyringJSON struct {
	Op      string             `json:"op"`
	Members uint32             `json:"members"`
	Keys    []keyringKeyJSON   `json:"keys"`
	Errors  []keyringErrorJSON `json:"errors"`
}

func (a *app) keyringCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "keyring",
		Short: "List and rotate the gossip encryption keys of every member",
		Long: `keyring lists and changes the keys that encrypt gossip (AES-GCM), on every
alive member at once, as consul keyring does. Gossip is encrypted with the
primary key; a packet is accepted if any installed key opens it. Each
member keeps its keyring in its data directory, so a restart keeps the
keys installed here.

To rotate: install the new key, use it (refused until every member holds
it), then remove the old one (refused while it is any member's primary).
A node that joins later needs one of the installed keys: give it the
primary with --gossip-key.

Only root and dsmd's user may manage the keys.`,
		Example: "  dsmctl keyring list\n" +
			"  NEW=$(dsmctl keygen)\n" +
			"  dsmctl keyring install $NEW && dsmctl keyring use $NEW && dsmctl keyring remove $OLD",
		Args: args(0, 0, "a subcommand (list, install, use, remove)"),
		RunE: needSubcommand,
	}
	op := func(name string, o dsmpb.KeyringOp, short, example string) *cobra.Command {
		use, n, what := name+" KEY", 1, "KEY"
		if o == dsmpb.KeyringOp_KEYRING_OP_LIST {
			use, n, what = name, 0, "no arguments"
		}
		return &cobra.Command{
			Use:     use,
			Short:   short,
			Example: example,
			Args:    args(n, n, what),
			RunE: func(cmd *cobra.Command, argv []string) error {
				req := &dsmpb.KeyringRequest{Op: o}
				if n == 1 {
					req.Key = strings.TrimSpace(argv[0])
				}
				cl, err := a.admin()
				if err != nil {
					return err
				}
				ctx, cancel := a.call(cmd)
				defer cancel()
				resp, err := cl.Keyring(ctx, req)
				if err != nil {
					return err
				}
				return a.printKeyring(name, resp)
			},
		}
	}
	c.AddCommand(
		op("list", dsmpb.KeyringOp_KEYRING_OP_LIST, "List the keys the members hold, and which they encrypt with",
			"  dsmctl keyring list\n  dsmctl keyring list --json | jq -r '.keys[] | select(.primary > 0) | .key'"),
		op("install", dsmpb.KeyringOp_KEYRING_OP_INSTALL, "Install a key on every member (it decrypts; it does not encrypt yet)",
			"  dsmctl keyring install $(dsmctl keygen)"),
		op("use", dsmpb.KeyringOp_KEYRING_OP_USE, "Make an installed key the primary on every member (refused unless all hold it)",
			"  dsmctl keyring use pUqJrVyVRj5jsiYEkM/tFQYfWyJIv4s3XkvDwy7Cu5s="),
		op("remove", dsmpb.KeyringOp_KEYRING_OP_REMOVE, "Remove a key from every member (refused while it is a primary)",
			"  dsmctl keyring remove HvY8ubRZMgafUOWvrOadwOckTqbcgyMGS7WzWUx1Eqk="),
	)
	return c
}

func (a *app) printKeyring(op string, resp *dsmpb.KeyringResponse) error {
	v := keyringJSON{Op: op, Members: resp.GetMembers(), Keys: []keyringKeyJSON{}, Errors: []keyringErrorJSON{}}
	for _, k := range resp.GetKeys() {
		v.Keys = append(v.Keys, keyringKeyJSON{k.GetKey(), k.GetInstalled(), k.GetPrimary()})
	}
	for _, e := range resp.GetErrors() {
		v.Errors = append(v.Errors, keyringErrorJSON{e.GetNodeId(), e.GetError()})
	}
	var err error
	if a.json {
		err = a.printJSON(v)
	} else {
		var w strings.Builder
		if op != "list" {
			fmt.Fprintf(&w, "%s: done on %d of %d members\n\n", op, int(v.Members)-len(v.Errors), v.Members)
		}
		t := newTable("KEY", "INSTALLED", "PRIMARY")
		for _, k := range v.Keys {
			t.row(k.Key, fmt.Sprintf("%d/%d", k.Installed, v.Members), fmt.Sprintf("%d/%d", k.Primary, v.Members))
		}
		t.write(&w)
		for _, e := range v.Errors {
			fmt.Fprintf(&w, "%s: %s\n", node(e.Node), userMessage(e.Error))
		}
		_, err = fmt.Fprint(a.env.Stdout, w.String())
	}
	if err == nil && len(v.Errors) > 0 {
		return errors.New("not every member answered or applied it: run it again once they are back")
	}
	return err
}

func (a *app) keygenCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "keygen",
		Short: "Print a new gossip encryption key (32 random bytes, base64)",
		Long: `keygen prints a new random key for dsmd --gossip-key and dsmctl keyring
install: 32 bytes (AES-256) from the system's random source, in base64. It
talks to no dsmd.`,
		Example: "  dsmd --gossip-key $(dsmctl keygen) ...",
		Args:    args(0, 0, "no arguments"),
		RunE: func(*cobra.Command, []string) error {
			k := make([]byte, 32)
			if _, err := rand.Read(k); err != nil {
				return fmt.Errorf("no randomness: %w", err)
			}
			_, err := fmt.Fprintln(a.env.Stdout, base64.StdEncoding.EncodeToString(k))
			return err
		},
	}
}
