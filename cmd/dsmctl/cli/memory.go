package cli

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// chunk is the most bytes one ReadMemory or WriteMemory carries (the Admin
// service's limit).
const chunk = 1 << 20

// maxGet bounds what get reads, so a typo in LEN does not pull a region
// into the terminal.
const maxGet = 64 << 20

func (a *app) getCmd() *cobra.Command {
	var raw bool
	c := &cobra.Command{
		Use:   "get REGION OFF LEN",
		Short: "Read region memory through the coherence protocol and hexdump it",
		Long: `get reads LEN bytes at OFF as a load on the answering node would: the pages
come through the coherence protocol, so the bytes are the latest written
anywhere in the cluster. OFF and LEN take units (4KiB) or hex (0x1000);
at most 64 MiB. Repeated lines of the dump are folded into one "*".`,
		Example:           "  dsmctl get feat 0 64\n  dsmctl get feat 0x1000 4KiB\n  dsmctl get feat 0 1MiB --raw > page.bin",
		Args:              args(3, 3, "REGION, OFF and LEN"),
		ValidArgsFunction: a.completeRegion,
		RunE: func(cmd *cobra.Command, argv []string) error {
			off, err := ParseSize(argv[1])
			if err != nil {
				return usagef("OFF: %v", err)
			}
			n, err := ParseSize(argv[2])
			if err != nil {
				return usagef("LEN: %v", err)
			}
			if n == 0 {
				return usagef("LEN is zero: nothing to read")
			}
			if n > maxGet {
				return usagef("LEN %s is more than get reads (%s)", FormatSize(n), FormatSize(maxGet))
			}
			cl, err := a.admin()
			if err != nil {
				return err
			}
			data := make([]byte, 0, n)
			for uint64(len(data)) < n {
				l := min(n-uint64(len(data)), chunk)
				ctx, cancel := a.call(cmd)
				r, err := cl.ReadMemory(ctx, &dsmpb.ReadMemoryRequest{
					Region: argv[0], Offset: off + uint64(len(data)), Length: uint32(l)})
				cancel()
				if err != nil {
					return err
				}
				if uint64(len(r.Data)) != l {
					return fmt.Errorf("dsmd at %s answered %d bytes for a read of %d", a.addr, len(r.Data), l)
				}
				data = append(data, r.Data...)
			}
			switch {
			case a.json:
				return a.printJSON(struct {
					Region string `json:"region"`
					Offset uint64 `json:"offset"`
					Length uint64 `json:"length"`
					Data   []byte `json:"data"` // base64
				}{argv[0], off, n, data})
			case raw:
				_, err := a.env.Stdout.Write(data)
				return err
			}
			_, err = io.WriteString(a.env.Stdout, hexdump(data, off))
			return err
		},
	}
	c.Flags().BoolVar(&raw, "raw", false, "write the bytes as they are, not a hexdump")
	return c
}

// hexdump formats data that starts at offset base, 16 bytes a line with
// offsets, hex and printable ASCII; a run of lines equal to the one before
// is folded into one "*" line.
func hexdump(data []byte, base uint64) string {
	digits := max(8, len(fmt.Sprintf("%x", base+uint64(len(data)))))
	var b strings.Builder
	var prev []byte
	folded := false
	for i := 0; i < len(data); i += 16 {
		line := data[i:min(i+16, len(data))]
		if prev != nil && len(line) == 16 && bytes.Equal(line, prev) && i+16 < len(data) {
			if !folded {
				b.WriteString("*\n")
				folded = true
			}
			continue
		}
		folded = false
		prev = line
		fmt.Fprintf(&b, "%0*x ", digits, base+uint64(i))
		for j := 0; j < 16; j++ {
			if j%8 == 0 {
				b.WriteByte(' ')
			}
			if j < len(line) {
				fmt.Fprintf(&b, "%02x ", line[j])
			} else {
				b.WriteString("   ")
			}
		}
		b.WriteString(" |")
		for _, c := range line {
			if c < 0x20 || c > 0x7e {
				c = '.'
			}
			b.WriteByte(c)
		}
		b.WriteString("|\n")
	}
	fmt.Fprintf(&b, "%0*x\n", digits, base+uint64(len(data)))
	return b.String()
}

func (a *app) putCmd() *cobra.Command {
	var hexData, sync bool
	c := &cobra.Command{
		Use:   "put REGION OFF DATA|-",
		Short: "Write bytes into region memory through the coherence protocol",
		Long: `put writes DATA at OFF as a store on the answering node would: after it
returns, a read anywhere in the cluster sees the bytes. DATA is taken as
text, or as hex with --hex; "-" reads the bytes from stdin. OFF takes units
or hex (0x1000). With --sync the written range is also synced before put
returns: written back to its homes and backups, and for a durable region
on disk there too (not loaded again after a restart yet).`,
		Example:           "  dsmctl put feat 0 hello\n  dsmctl put feat 0x1000 deadbeef --hex\n  dsmctl put feat 4KiB - < page.bin",
		Args:              args(3, 3, "REGION, OFF and DATA (or - for stdin)"),
		ValidArgsFunction: a.completeRegion,
		RunE: func(cmd *cobra.Command, argv []string) error {
			off, err := ParseSize(argv[1])
			if err != nil {
				return usagef("OFF: %v", err)
			}
			var data []byte
			switch {
			case argv[2] == "-":
				if data, err = io.ReadAll(a.env.Stdin); err != nil {
					return fmt.Errorf("reading stdin: %w", err)
				}
			case hexData:
				if data, err = hex.DecodeString(strings.TrimPrefix(argv[2], "0x")); err != nil {
					return usagef("DATA is not hex: %v", err)
				}
			default:
				data = []byte(argv[2])
			}
			if hexData && argv[2] == "-" {
				if data, err = hex.DecodeString(strings.TrimSpace(string(data))); err != nil {
					return usagef("stdin is not hex: %v", err)
				}
			}
			if len(data) == 0 {
				return usagef("nothing to write: DATA is empty")
			}
			cl, err := a.admin()
			if err != nil {
				return err
			}
			var written uint64
			for written < uint64(len(data)) {
				end := min(uint64(len(data)), written+chunk)
				ctx, cancel := a.call(cmd)
				r, err := cl.WriteMemory(ctx, &dsmpb.WriteMemoryRequest{
					Region: argv[0], Offset: off + written, Data: data[written:end], Sync: sync})
				cancel()
				if err != nil {
					if written > 0 {
						return fmt.Errorf("after %d of %d bytes: %w", written, len(data), err)
					}
					return err
				}
				if r.Written != end-written {
					return fmt.Errorf("dsmd at %s wrote %d bytes of %d", a.addr, r.Written, end-written)
				}
				written = end
			}
			if a.json {
				return a.printJSON(struct {
					Region  string `json:"region"`
					Offset  uint64 `json:"offset"`
					Written uint64 `json:"written"`
					Synced  bool   `json:"synced"`
				}{argv[0], off, written, sync})
			}
			what := ""
			if sync {
				what = ", synced"
			}
			_, err = fmt.Fprintf(a.env.Stdout, "wrote %d byte%s to %s at %#x%s\n", written, plural(int(written)), argv[0], off, what)
			return err
		},
	}
	c.Flags().BoolVar(&hexData, "hex", false, "DATA (or stdin) is hex, like deadbeef")
	c.Flags().BoolVar(&sync, "sync", false, "sync the written range (back to its homes' memory) before returning")
	return c
}
