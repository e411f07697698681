package cli

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dsmkit/dsm/internal/regionfile"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// inflight is how many ReadMemory or WriteMemory batches export and import
// keep in flight at once.
const inflight = 4

// transferFlags are the flags export and import share.
type transferFlags struct {
	progress string
	quiet    bool
}

func (f *transferFlags) add(c *cobra.Command) {
	c.Flags().StringVar(&f.progress, "progress", "auto", "progress bar on stderr: auto (on a terminal), always, never")
	c.Flags().BoolVarP(&f.quiet, "quiet", "q", false, "no progress bar and no summary line (errors and --json output still print)")
}

func (f *transferFlags) check() error {
	switch f.progress {
	case "auto", "always", "never":
		return nil
	}
	return usagef("--progress %q: want auto, always or never", f.progress)
}

// bar is where the progress bar goes: stderr, or nil for none.
func (a *app) bar(f transferFlags) io.Writer {
	if f.quiet || f.progress == "never" || f.progress == "auto" && (!a.env.StderrTTY || a.json) {
		return nil
	}
	return a.env.Stderr
}

func fileDurability(d dsmpb.Durability) regionfile.Durability {
	if d == dsmpb.Durability_DURABILITY_DURABLE {
		return regionfile.DurabilityDurable
	}
	return regionfile.DurabilityMemory
}

func protoDurability(d regionfile.Durability) dsmpb.Durability {
	if d == regionfile.DurabilityDurable {
		return dsmpb.Durability_DURABILITY_DURABLE
	}
	return dsmpb.Durability_DURABILITY_MEMORY
}

// readRange reads n bytes of region name at off, at most chunk bytes a
// request, each request under --timeout.
func (a *app) readRange(ctx context.Context, cl dsmpb.AdminClient, name string, off, n uint64) ([]byte, error) {
	data := make([]byte, 0, n)
	for uint64(len(data)) < n {
		l := min(n-uint64(len(data)), chunk)
		at := off + uint64(len(data))
		cctx, cancel := context.WithTimeout(ctx, a.timeout)
		r, err := cl.ReadMemory(cctx, &dsmpb.ReadMemoryRequest{Region: name, Offset: at, Length: uint32(l)})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("reading bytes %#x-%#x: %w", at, at+l-1, err)
		}
		if uint64(len(r.Data)) != l {
			return nil, fmt.Errorf("dsmd at %s answered %d bytes for a read of %d at %#x", a.addr, len(r.Data), l, at)
		}
		data = append(data, r.Data...)
	}
	return data, nil
}

// writeRange writes data to region name at off, at most chunk bytes a
// request, each synced before it is answered.
func (a *app) writeRange(ctx context.Context, cl dsmpb.AdminClient, name string, off uint64, data []byte) error {
	for done := uint64(0); done < uint64(len(data)); {
		end := min(uint64(len(data)), done+chunk)
		cctx, cancel := context.WithTimeout(ctx, a.timeout)
		r, err := cl.WriteMemory(cctx, &dsmpb.WriteMemoryRequest{Region: name, Offset: off + done, Data: data[done:end], Sync: true})
		cancel()
		if err != nil {
			return fmt.Errorf("writing bytes %#x-%#x: %w", off+done, off+end-1, err)
		}
		if r.Written != end-done {
			return fmt.Errorf("dsmd at %s wrote %d bytes of %d at %#x", a.addr, r.Written, end-done, off+done)
		}
		done = end
	}
	return nil
}

// readRegion reads region name of size bytes in batches of batch bytes,
// up to inflight batches at once, and hands each to use in order of
// offset. It stops at the first error, of a read or of use, and returns
// when no read is left running.
func (a *app) readRegion(ctx context.Context, cl dsmpb.AdminClient, name string, size, batch uint64,
	use func(off uint64, data []byte) error) error {
	type result struct {
		data []byte
		err  error
	}
	var reads sync.WaitGroup
	defer reads.Wait() // after cancel, which stops the producer
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	futures := make(chan chan result, inflight-1)
	reads.Add(1)
	go func() {
		defer reads.Done()
		defer close(futures)
		for off := uint64(0); off < size; off += batch {
			ch := make(chan result, 1)
			select {
			case futures <- ch:
			case <-ctx.Done():
				return
			}
			reads.Add(1)
			go func(off uint64) {
				defer reads.Done()
				data, err := a.readRange(ctx, cl, name, off, min(batch, size-off))
				ch <- result{data, err}
			}(off)
		}
	}()
	off := uint64(0)
	for ch := range futures {
		r := <-ch
		if r.err != nil {
			return r.err
		}
		if err := use(off, r.data); err != nil {
			return err
		}
		off += uint64(len(r.data))
	}
	return ctx.Err()
}

// writer runs WriteMemory batches, up to inflight at once, and keeps the
// first error.
type writer struct {
	sem  chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	err  error
	ctx  context.Context
	stop context.CancelFunc
}

func newWriter(ctx context.Context) *writer {
	w := &writer{sem: make(chan struct{}, inflight)}
	w.ctx, w.stop = context.WithCancel(ctx)
	return w
}

// do runs f when a slot is free; it returns the first error so far.
func (w *writer) do(f func(context.Context) error) error {
	select {
	case w.sem <- struct{}{}:
	case <-w.ctx.Done():
		return w.wait()
	}
	if err := w.failed(); err != nil {
		<-w.sem
		return err
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer func() { <-w.sem }()
		if err := f(w.ctx); err != nil {
			w.mu.Lock()
			if w.err == nil {
				w.err = err
			}
			w.mu.Unlock()
			w.stop()
		}
	}()
	return nil
}

func (w *writer) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// wait waits for every write and returns the first error.
func (w *writer) wait() error {
	w.wg.Wait()
	defer w.stop()
	if err := w.failed(); err != nil {
		return err
	}
	return w.ctx.Err()
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

type exportJSON struct {
	Region     string `json:"region"`
	File       string `json:"file"`
	Size       uint64 `json:"size"`
	PageSize   uint32 `json:"page_size"`
	Durability string `json:"durability"`
	Epoch      uint64 `json:"epoch"`
	PagesRead  uint64 `json:"pages_read"`
	Pages      uint64 `json:"pages"` // populated pages, the file's records
	FileBytes  int64  `json:"file_bytes"`
	SHA256     string `json:"sha256"`
	ElapsedNS  int64  `json:"elapsed_ns"`
}

func (a *app) regionExportCmd() *cobra.Command {
	var force bool
	var tf transferFlags
	c := &cobra.Command{
		Use:   "export NAME FILE",
		Short: "Copy a region's populated pages into a file (FILE - is stdout)",
		Long: `export reads every page of region NAME through the coherence protocol, as
get does, and writes the pages that are not all zeros to FILE with the
region's spec and a SHA-256 of the whole file (the format is described in
internal/regionfile). A sparse region exports small; every page is still
read, so the time grows with the region's size.

The copy is consistent per page: each page is the latest written anywhere
in the cluster at the moment export read it, and pages are read one after
another from start to end. export syncs nothing itself. For a copy of a
chosen state, stop the writers, make a Sync point (dsm Sync of the region,
or put --sync), then export; writes that run during an export may be in
the file for some pages and not for others.

FILE is written to a temporary file beside it (mode 0600: the copy holds
the region's data) and renamed into place when complete, so a failed export
leaves no partial FILE. export refuses a FILE
that exists unless --force. With FILE "-" the file goes to stdout and the
summary line (or --json) to stderr.`,
		Example: "  dsmctl region export feat feat.dsmr\n" +
			"  dsmctl region export feat - | ssh backup 'cat > feat.dsmr'\n" +
			"  dsmctl region export feat feat.dsmr --force --json",
		Args:              args(2, 2, "NAME and FILE (or - for stdout)"),
		ValidArgsFunction: a.completeRegion,
		RunE: func(cmd *cobra.Command, argv []string) error {
			if err := tf.check(); err != nil {
				return err
			}
			name, file := argv[0], argv[1]
			if file == "-" && a.env.StdoutTTY {
				return usagef("FILE is - and stdout is a terminal: redirect stdout, or name a FILE")
			}
			if file != "-" && !force {
				if _, err := os.Lstat(file); err == nil {
					return hintError{fmt.Errorf("%s exists", file), "--force overwrites it"}
				}
			}
			cl, err := a.admin()
			if err != nil {
				return err
			}
			ctx, cancel := a.call(cmd)
			ri, err := cl.RegionInfo(ctx, &dsmpb.RegionInfoRequest{Name: name, MaxShards: 1})
			cancel()
			if err != nil {
				return err
			}
			r := ri.GetRegion()
			h := regionfile.Header{Name: r.GetName(), PageSize: r.GetPageSize(), Size: r.GetSize(),
				Durability: fileDurability(r.GetDurability()), Epoch: ri.GetEpoch(), ReadAt: a.env.Now()}
			out, summary := a.env.Stdout, a.env.Stdout
			var tmp *os.File
			if file == "-" {
				summary = a.env.Stderr
			} else {
				if tmp, err = os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".tmp-*"); err != nil {
					return err
				}
				defer func() {
					if tmp != nil {
						tmp.Close()
						os.Remove(tmp.Name())
					}
				}()
				out = tmp
			}
			cw := &countingWriter{w: out}
			w, err := regionfile.NewWriter(cw, h)
			if err != nil {
				return fmt.Errorf("region %s: %w", name, err)
			}
			ps := uint64(h.PageSize)
			t := startTransfer("export", int64(h.Size), a.bar(tf))
			err = a.readRegion(cmd.Context(), cl, name, h.Size, max(chunk, ps), func(off uint64, data []byte) error {
				for i := uint64(0); i < uint64(len(data)); i += ps {
					if _, err := w.WritePage((off+i)/ps, data[i:i+ps]); err != nil {
						return fmt.Errorf("writing %s: %w", file, err)
					}
				}
				t.add(int64(len(data)), int64(uint64(len(data))/ps))
				return nil
			})
			if err == nil {
				err = w.Close()
			}
			elapsed := t.finish()
			if err != nil {
				return fmt.Errorf("export of region %s: %w", name, err)
			}
			if tmp != nil {
				if err := tmp.Sync(); err != nil {
					return err
				}
				if err := tmp.Close(); err != nil {
					return err
				}
				if err := os.Rename(tmp.Name(), file); err != nil {
					return err
				}
				tmp = nil
			}
			v := exportJSON{Region: name, File: file, Size: h.Size, PageSize: h.PageSize, Durability: h.Durability.String(),
				Epoch: h.Epoch, PagesRead: h.Pages(), Pages: w.Pages(), FileBytes: cw.n,
				SHA256: hex.EncodeToString(w.Sum()), ElapsedNS: int64(elapsed)}
			if a.json {
				return a.printJSONTo(summary, v)
			}
			if tf.quiet {
				return nil
			}
			_, err = fmt.Fprintf(summary, "exported region %s (%s in %s pages, epoch %d): %d populated page%s of %d to %s, %s, sha256 %s, in %s\n",
				name, FormatSize(h.Size), FormatSize(ps), h.Epoch, v.Pages, plural(int(min(v.Pages, 2))), v.PagesRead,
				fileName(file, "stdout"), FormatSize(uint64(v.FileBytes)), v.SHA256[:16], elapsed.Round(time.Millisecond))
			return err
		},
	}
	c.Flags().BoolVar(&force, "force", false, "overwrite FILE if it exists")
	tf.add(c)
	return c
}

// fileName names FILE in messages: std ("stdin", "stdout") for "-".
func fileName(file, std string) string {
	if file == "-" {
		return std
	}
	return file
}

type importJSON struct {
	Region     string `json:"region"`
	File       string `json:"file"`
	FromRegion string `json:"from_region"` // the region the file was exported from
	Created    bool   `json:"created"`
	Size       uint64 `json:"size"`
	PageSize   uint32 `json:"page_size"`
	Pages      uint64 `json:"pages"`
	Bytes      uint64 `json:"bytes"`
	Synced     bool   `json:"synced"`
	SHA256     string `json:"sha256"`
	ElapsedNS  int64  `json:"elapsed_ns"`
}

func (a *app) regionImportCmd() *cobra.Command {
	var create bool
	var tf transferFlags
	c := &cobra.Command{
		Use:   "import NAME FILE",
		Short: "Load a file written by region export into region NAME (FILE - is stdin)",
		Long: `import checks FILE completely (format, sizes, page numbers and the SHA-256
of the whole file) before it writes anything, then writes every page the
file holds into region NAME through the coherence protocol, each write
synced (written back to its homes) before it is answered: when import
returns, every page of the file is synced.

FILE is read twice: once to check it, once to write it. With FILE "-",
stdin is copied to a temporary file (in $TMPDIR) while it is checked, and
written from there; the temporary file is removed at the end. A FILE that
changes between the two reads is found out by the second and reported
with how much of it was written.

NAME need not be the region the file was exported from. If NAME does not
exist, import creates it with the file's size, page size and durability
(--create=false refuses instead). If it exists, its size and page size
must be the file's; its durability may differ.

import writes only the pages the file holds: the file has no record of
all-zero pages, so a page of an existing region that the file does not
list keeps what it holds. For an exact copy, import into a new region (or
rm and let import create it).`,
		Example: "  dsmctl region import feat-restored feat.dsmr\n" +
			"  ssh backup 'cat feat.dsmr' | dsmctl region import feat -\n" +
			"  dsmctl region import feat feat.dsmr --create=false --json",
		Args:              args(2, 2, "NAME and FILE (or - for stdin)"),
		ValidArgsFunction: a.completeRegion,
		RunE: func(cmd *cobra.Command, argv []string) error {
			if err := tf.check(); err != nil {
				return err
			}
			name, file := argv[0], argv[1]
			src, size, cleanup, h, err := a.verifyImport(file, tf)
			if err != nil {
				return err
			}
			defer cleanup()
			cl, err := a.admin()
			if err != nil {
				return err
			}
			created, err := a.importTarget(cmd, cl, name, h, create)
			if err != nil {
				return err
			}
			if _, err := src.Seek(0, io.SeekStart); err != nil {
				return err
			}
			r, err := regionfile.NewReader(src)
			if err != nil {
				return fmt.Errorf("%s changed since it was checked: %w", fileName(file, "stdin"), err)
			}
			if r.Header() != h {
				return fmt.Errorf("%s changed since it was checked: its header differs", fileName(file, "stdin"))
			}
			ps := uint64(h.PageSize)
			t := startTransfer("import", size, a.bar(tf))
			wr := newWriter(cmd.Context())
			var run []byte
			var runStart uint64
			flush := func() error {
				if len(run) == 0 {
					return nil
				}
				data, off, pages := run, runStart*ps, int64(uint64(len(run))/ps)
				run = nil
				return wr.do(func(ctx context.Context) error {
					if err := a.writeRange(ctx, cl, name, off, data); err != nil {
						return err
					}
					t.add(int64(len(data))+8*pages, pages)
					return nil
				})
			}
			var werr error
			for werr == nil {
				no, data, err := r.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					werr = fmt.Errorf("%s changed since it was checked: %w", fileName(file, "stdin"), err)
					break
				}
				if len(run) > 0 && (no != runStart+uint64(len(run))/ps || uint64(len(run))+ps > max(chunk, ps)) {
					werr = flush()
				}
				if len(run) == 0 {
					runStart = no
					run = make([]byte, 0, max(chunk, ps))
				}
				run = append(run, data...)
			}
			if werr == nil {
				werr = flush()
			}
			if err := wr.wait(); werr == nil {
				werr = err
			}
			if werr == nil && size > 0 {
				t.bytes.Store(size) // the header and the trailer, not counted by the writes
			}
			elapsed := t.finish()
			if werr != nil {
				done := t.pages.Load()
				what := "existing"
				if created {
					what = "new"
				}
				return fmt.Errorf("import into region %s stopped after %d of the file's pages (the %s region holds those, synced): %w",
					name, done, what, werr)
			}
			v := importJSON{Region: name, File: file, FromRegion: h.Name, Created: created, Size: h.Size, PageSize: h.PageSize,
				Pages: r.Pages(), Bytes: r.Pages() * ps, Synced: true, SHA256: hex.EncodeToString(r.Sum()),
				ElapsedNS: int64(elapsed)}
			if a.json {
				return a.printJSON(v)
			}
			if tf.quiet {
				return nil
			}
			what := "existing region"
			if created {
				what = "new region"
			}
			_, err = fmt.Fprintf(a.env.Stdout, "imported %d page%s (%s) of region %s from %s into %s %s (%s in %s pages), synced, in %s\n",
				v.Pages, plural(int(min(v.Pages, 2))), FormatSize(v.Bytes), h.Name, fileName(file, "stdin"), what, name,
				FormatSize(h.Size), FormatSize(ps), elapsed.Round(time.Millisecond))
			return err
		},
	}
	c.Flags().BoolVar(&create, "create", true, "create region NAME when it does not exist (--create=false: refuse)")
	tf.add(c)
	return c
}

// verifyImport opens FILE (for "-", a temporary copy of stdin made while
// checking it) and checks it whole. It returns the file to read again, its
// size, a cleanup and the file's header.
func (a *app) verifyImport(file string, tf transferFlags) (src *os.File, size int64, cleanup func(), h regionfile.Header, err error) {
	var in io.Reader
	if file == "-" {
		tmp, err := os.CreateTemp("", "dsmctl-import-*.dsmr")
		if err != nil {
			return nil, 0, nil, h, fmt.Errorf("a temporary file for stdin: %w", err)
		}
		os.Remove(tmp.Name()) // unlinked: gone when closed, whatever happens
		src, in = tmp, io.TeeReader(a.env.Stdin, tmp)
	} else {
		f, err := os.Open(file)
		if err != nil {
			return nil, 0, nil, h, err
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, 0, nil, h, err
		}
		src, in, size = f, f, st.Size()
	}
	cleanup = func() { src.Close() }
	t := startTransferOf(&transfer{label: "check ", total: size, noPages: true, w: a.bar(tf)})
	pr := &progressReader{r: in, t: t}
	h, _, err = regionfile.Verify(pr)
	t.finish()
	if err != nil {
		cleanup()
		return nil, 0, nil, h, fmt.Errorf("%s: %w; nothing was written", fileName(file, "stdin"), err)
	}
	if file == "-" {
		size = pr.n
	}
	return src, size, cleanup, h, nil
}

// progressReader counts the bytes read through it into a transfer.
type progressReader struct {
	r io.Reader
	t *transfer
	n int64
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.n += int64(n)
	p.t.add(int64(n), 0)
	return n, err
}

// importTarget makes sure region name can take the file of header h:
// it creates it (when create) or checks its sizes. It reports whether it
// created it.
func (a *app) importTarget(cmd *cobra.Command, cl dsmpb.AdminClient, name string, h regionfile.Header, create bool) (bool, error) {
	ctx, cancel := a.call(cmd)
	ri, err := cl.RegionInfo(ctx, &dsmpb.RegionInfoRequest{Name: name, MaxShards: 1})
	cancel()
	switch {
	case status.Code(err) == codes.NotFound && !create:
		return false, hintError{fmt.Errorf("region %s does not exist and --create=false", name),
			"without --create=false import creates it"}
	case status.Code(err) == codes.NotFound:
		ctx, cancel := a.call(cmd)
		cr, err := cl.CreateRegion(ctx, &dsmpb.CreateRegionRequest{Name: name, Size: h.Size, PageSize: h.PageSize,
			Durability: protoDurability(h.Durability)})
		cancel()
		if err != nil {
			return false, fmt.Errorf("creating region %s for the file: %w", name, err)
		}
		return !cr.Existed, nil
	case err != nil:
		return false, err
	}
	r := ri.GetRegion()
	if r.GetPageSize() != h.PageSize || r.GetSize() != h.Size {
		return false, hintError{
			fmt.Errorf("region %s is %s in %s pages, the file (of region %s) is %s in %s pages: nothing was written",
				name, FormatSize(r.GetSize()), FormatSize(uint64(r.GetPageSize())), h.Name, FormatSize(h.Size), FormatSize(uint64(h.PageSize))),
			"import into a new region name, which import creates with the file's sizes"}
	}
	return false, nil
}
