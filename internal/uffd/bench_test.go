//go:build linux

package uffd

import (
	"fmt"
	"os"
	"testing"
	"time"
)

// BenchmarkFaultRoundTrip measures one fault served across processes: a
// client's load blocks, this process reads the message and resolves it, the
// client goes on to the next page. missing-copy resolves MISSING faults with
// UFFDIO_COPY (the page cache is emptied between sweeps); minor-continue
// resolves MINOR faults with UFFDIO_CONTINUE (the client drops its PTEs
// between sweeps, the memfd keeps the pages). One op is one fault.
func BenchmarkFaultRoundTrip(b *testing.B) {
	const pages = 256
	for _, kind := range []string{"missing-copy", "minor-continue"} {
		b.Run(kind, func(b *testing.B) {
			r := newRegion(b, pages)
			c := startClient(b, "client", r.mf, allModes)
			ps := uint64(os.Getpagesize())
			src := filled(1)
			if kind == "minor-continue" {
				for p := 0; p < pages; p++ {
					r.fill(p, 1)
				}
			}
			msgs := make([]Msg, 16)
			b.ResetTimer()
			for done := 0; done < b.N; {
				k := min(pages, b.N-done)
				b.StopTimer()
				if kind == "minor-continue" {
					c.send(b, "drop")
				} else if err := r.mf.PunchHole(0, int64(pages)*int64(ps)); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if _, err := c.conn.Write(fmt.Appendf(nil, "sweep %x", k)); err != nil {
					b.Fatal(err)
				}
				for served := 0; served < k; {
					c.u.SetReadDeadline(time.Now().Add(hangDeadline))
					n, err := c.u.Read(msgs)
					if err != nil {
						b.Fatal(err)
					}
					for _, m := range msgs[:n] {
						if kind == "minor-continue" {
							err = c.u.Continue(m.Address, ps, 0)
						} else {
							err = c.u.Copy(m.Address, src, 0)
						}
						if err != nil {
							b.Fatal(err)
						}
						if m.Address == c.page(served) {
							served++
						}
					}
				}
				if r, ok := <-c.replies; !ok || r != fmt.Sprintf("ok %02x", byte(k)) {
					b.Fatalf("sweep answered %q", r)
				}
				done += k
			}
		})
	}
}

// send issues a command that raises no fault and waits for its answer.
func (c *client) send(b *testing.B, cmd string) {
	if _, err := c.conn.Write([]byte(cmd)); err != nil {
		b.Fatal(err)
	}
	if r, ok := <-c.replies; !ok || r != "ok" {
		b.Fatalf("%s answered %q", cmd, r)
	}
}
