package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/regionfile"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// writeScattered puts a few byte strings at scattered offsets of region
// small (100 pages of 4 KiB): pages 0, 37, 49 and 50 (a write across their
// boundary) and 99.
func writeScattered(t *testing.T, sock string) {
	t.Helper()
	for _, w := range []struct{ off, data string }{
		{"0", "first page"},
		{"151652", "page 37, inside"},
		{"204797", "across 49 and 50"},
		{"409590", "last page"},
	} {
		run(t, sock, runOpts{}, "put", "small", w.off, w.data).ok(t)
	}
}

// wholeRegion reads a region through get --raw.
func wholeRegion(t *testing.T, sock, name string, size uint64) string {
	t.Helper()
	return run(t, sock, runOpts{}, "get", name, "0", FormatSize(size), "--raw").ok(t).stdout
}

func TestRegionExportImport(t *testing.T) {
	f, sock := serveFake(t)
	writeScattered(t, sock)
	file := filepath.Join(t.TempDir(), "small.dsmr")
	out := run(t, sock, runOpts{}, "region", "export", "small", file).ok(t).stdout
	if !strings.Contains(out, "exported region small (400 KiB in 4 KiB pages, epoch 12): 5 populated pages of 100 to "+file) {
		t.Errorf("export summary: %q", out)
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	h, n, err := regionfile.Verify(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	if h.Name != "small" || h.Size != 100*4096 || h.PageSize != 4096 || h.Durability != regionfile.DurabilityMemory || h.Epoch != 12 || n != 5 {
		t.Errorf("file header %+v with %d records; want small, 100 pages of 4 KiB, memory, epoch 12, 5 records", h, n)
	}
	if matches, _ := filepath.Glob(filepath.Join(filepath.Dir(file), ".*tmp*")); len(matches) != 0 {
		t.Errorf("export left temporary files: %v", matches)
	}

	f.mu.Lock()
	writes, synced := f.writes, f.synced
	f.mu.Unlock()
	out = run(t, sock, runOpts{}, "region", "import", "copy", file).ok(t).stdout
	if want := "imported 5 pages (20 KiB) of region small from " + file + " into new region copy (400 KiB in 4 KiB pages), synced, in "; !strings.HasPrefix(out, want) {
		t.Errorf("import summary %q, want it to start %q", out, want)
	}
	f.mu.Lock()
	r := f.regions["copy"]
	dw, ds := f.writes-writes, f.synced-synced
	f.mu.Unlock()
	if r == nil || r.Size != 100*4096 || r.PageSize != 4096 || r.Durability != dsmpb.Durability_DURABILITY_MEMORY {
		t.Fatalf("import created %+v, want a memory region of 100 pages of 4 KiB", r)
	}
	// Pages 0, 37, 49-50, 99: one write per run of consecutive pages.
	if dw != 4 || ds != dw {
		t.Errorf("import made %d writes, %d synced; want 4, all synced", dw, ds)
	}
	a, b := wholeRegion(t, sock, "small", 100*4096), wholeRegion(t, sock, "copy", 100*4096)
	if a != b {
		t.Fatal("region copy differs from region small after export and import")
	}
	for _, w := range []struct {
		off  int
		want string
	}{{0, "first page"}, {151652, "page 37, inside"}, {204797, "across 49 and 50"}, {409590, "last page"},
		{4096, strings.Repeat("\x00", 4096)}, {300000, strings.Repeat("\x00", 1000)}} {
		if got := b[w.off : w.off+len(w.want)]; got != w.want {
			t.Errorf("copy at %d = %q, want %q", w.off, got, w.want)
		}
	}

	// Into an existing region of the same sizes: only the file's pages.
	run(t, sock, runOpts{}, "put", "copy", "8192", "kept").ok(t)
	out = run(t, sock, runOpts{}, "region", "import", "copy", file, "--create=false").ok(t).stdout
	if !strings.Contains(out, "into existing region copy") {
		t.Errorf("import into an existing region: %q", out)
	}
	if got := run(t, sock, runOpts{}, "get", "copy", "8192", "4", "--raw").ok(t).stdout; got != "kept" {
		t.Errorf("a page the file does not list was changed: %q", got)
	}
}

func TestRegionExportRefusesExistingFile(t *testing.T) {
	_, sock := serveFake(t)
	file := filepath.Join(t.TempDir(), "x.dsmr")
	if err := os.WriteFile(file, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := run(t, sock, runOpts{}, "region", "export", "small", file)
	if r.code != ExitError || !strings.Contains(r.stderr, "exists") || !strings.Contains(r.stderr, "--force") {
		t.Errorf("export over an existing file: exit %d, %q", r.code, r.stderr)
	}
	if b, _ := os.ReadFile(file); string(b) != "keep me" {
		t.Errorf("the existing file was changed: %q", b)
	}
	run(t, sock, runOpts{}, "region", "export", "small", file, "--force").ok(t)
	if _, _, err := regionfile.Verify(bytes.NewReader(mustRead(t, file))); err != nil {
		t.Errorf("export --force: %v", err)
	}
}

func mustRead(t *testing.T, file string) []byte {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRegionExportImportStdio(t *testing.T) {
	_, sock := serveFake(t)
	writeScattered(t, sock)
	r := run(t, sock, runOpts{}, "region", "export", "small", "-").ok(t)
	if !strings.HasPrefix(r.stdout, regionfile.Magic) || !strings.Contains(r.stderr, "5 populated pages of 100 to stdout") {
		t.Fatalf("export to stdout: stdout %d bytes starting %q, stderr %q", len(r.stdout), r.stdout[:min(8, len(r.stdout))], r.stderr)
	}
	out := run(t, sock, runOpts{stdin: r.stdout}, "region", "import", "piped", "-").ok(t).stdout
	if !strings.Contains(out, "imported 5 pages (20 KiB) of region small from stdin into new region piped") {
		t.Errorf("import from stdin: %q", out)
	}
	if wholeRegion(t, sock, "small", 100*4096) != wholeRegion(t, sock, "piped", 100*4096) {
		t.Error("region piped differs from region small")
	}
}

// TestRegionExportImportHugePages moves 2 MiB pages, larger than one
// ReadMemory or WriteMemory request.
func TestRegionExportImportHugePages(t *testing.T) {
	f, sock := serveFake(t)
	f.mu.Lock()
	f.addRegion("huge", 4<<20, 2<<20, dsmpb.Durability_DURABILITY_DURABLE)
	f.mu.Unlock()
	run(t, sock, runOpts{}, "put", "huge", "3MiB", "second page, second half").ok(t)
	file := filepath.Join(t.TempDir(), "huge.dsmr")
	run(t, sock, runOpts{}, "region", "export", "huge", file).ok(t)
	h, n, err := regionfile.Verify(bytes.NewReader(mustRead(t, file)))
	if err != nil || n != 1 || h.PageSize != 2<<20 || h.Durability != regionfile.DurabilityDurable {
		t.Fatalf("file: %+v, %d records, %v; want one 2 MiB page, durable", h, n, err)
	}
	run(t, sock, runOpts{}, "region", "import", "huge2", file).ok(t)
	f.mu.Lock()
	d := f.regions["huge2"].GetDurability()
	f.mu.Unlock()
	if d != dsmpb.Durability_DURABILITY_DURABLE {
		t.Errorf("import created huge2 %v, want durable as the file says", d)
	}
	if wholeRegion(t, sock, "huge", 4<<20) != wholeRegion(t, sock, "huge2", 4<<20) {
		t.Error("region huge2 differs from region huge")
	}
}

func TestRegionImportRefusesBadFile(t *testing.T) {
	f, sock := serveFake(t)
	writeScattered(t, sock)
	file := filepath.Join(t.TempDir(), "small.dsmr")
	run(t, sock, runOpts{}, "region", "export", "small", file).ok(t)
	good := mustRead(t, file)
	flipped := bytes.Clone(good)
	flipped[len(flipped)/2] ^= 1
	for _, c := range []struct {
		name string
		data []byte
		want []string
	}{
		{"flipped", flipped, []string{"checksum mismatch", "SHA-256", "nothing was written"}},
		{"truncated", good[:len(good)-100], []string{"truncated", "nothing was written"}},
		{"no records", good[:100], []string{"truncated at byte 100", "(page 0)", "nothing was written"}},
		{"not a region file", []byte("hello, world, this is not it"), []string{"not a region file", "nothing was written"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			bad := filepath.Join(t.TempDir(), "bad.dsmr")
			if err := os.WriteFile(bad, c.data, 0o644); err != nil {
				t.Fatal(err)
			}
			f.mu.Lock()
			writes := f.writes
			f.mu.Unlock()
			for _, src := range []struct {
				file  string
				stdin string
			}{{bad, ""}, {"-", string(c.data)}} {
				r := run(t, sock, runOpts{stdin: src.stdin}, "region", "import", "bad", src.file)
				if r.code != ExitError {
					t.Errorf("import of %s: exit %d, want %d", src.file, r.code, ExitError)
				}
				for _, w := range c.want {
					if !strings.Contains(r.stderr, w) {
						t.Errorf("import of %s: stderr %q does not say %q", src.file, r.stderr, w)
					}
				}
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.regions["bad"] != nil || f.writes != writes {
				t.Errorf("a refused import created the region (%v) or wrote %d times", f.regions["bad"] != nil, f.writes-writes)
			}
		})
	}
}

func TestRegionImportMismatch(t *testing.T) {
	f, sock := serveFake(t)
	f.mu.Lock()
	f.addRegion("p4k", 1<<20, 4096, dsmpb.Durability_DURABILITY_MEMORY)
	f.addRegion("p64k", 1<<20, 64<<10, dsmpb.Durability_DURABILITY_MEMORY)
	f.mu.Unlock()
	run(t, sock, runOpts{}, "put", "p4k", "100", "data").ok(t)
	file := filepath.Join(t.TempDir(), "p4k.dsmr")
	run(t, sock, runOpts{}, "region", "export", "p4k", file).ok(t)
	f.mu.Lock()
	writes := f.writes
	f.mu.Unlock()
	for _, c := range []struct{ region, want string }{
		{"p64k", "region p64k is 1 MiB in 64 KiB pages, the file (of region p4k) is 1 MiB in 4 KiB pages: nothing was written"},
		{"small", "region small is 400 KiB in 4 KiB pages, the file (of region p4k) is 1 MiB in 4 KiB pages"},
	} {
		r := run(t, sock, runOpts{}, "region", "import", c.region, file)
		if r.code != ExitError || !strings.Contains(r.stderr, c.want) || !strings.Contains(r.stderr, "import into a new region name") {
			t.Errorf("import into %s: exit %d, %q; want %q", c.region, r.code, r.stderr, c.want)
		}
	}
	r := run(t, sock, runOpts{}, "region", "import", "absent", file, "--create=false")
	if r.code != ExitError || !strings.Contains(r.stderr, "region absent does not exist") {
		t.Errorf("import --create=false into a missing region: exit %d, %q", r.code, r.stderr)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.writes != writes || f.regions["absent"] != nil {
		t.Errorf("refused imports wrote %d times or created region absent", f.writes-writes)
	}
}

func TestRegionExportImportJSONAndProgress(t *testing.T) {
	_, sock := serveFake(t)
	writeScattered(t, sock)
	file := filepath.Join(t.TempDir(), "small.dsmr")
	var e exportJSON
	r := run(t, sock, runOpts{}, "region", "export", "small", file, "--json", "--progress", "always").ok(t)
	decode(t, r.stdout, &e)
	if e.Region != "small" || e.Pages != 5 || e.PagesRead != 100 || e.FileBytes != int64(len(mustRead(t, file))) || len(e.SHA256) != 64 {
		t.Errorf("export --json: %+v", e)
	}
	if !strings.Contains(r.stderr, "export [") || !strings.Contains(r.stderr, "100% 400 KiB/400 KiB") {
		t.Errorf("export --progress always drew no full bar: %q", r.stderr)
	}
	var i importJSON
	r = run(t, sock, runOpts{}, "region", "import", "copy", file, "--json").ok(t)
	decode(t, r.stdout, &i)
	if i.Region != "copy" || i.FromRegion != "small" || !i.Created || i.Pages != 5 || !i.Synced || i.SHA256 != e.SHA256 {
		t.Errorf("import --json: %+v (export's sha256 %s)", i, e.SHA256)
	}
	if r.stderr != "" {
		t.Errorf("import on a non-terminal drew on stderr: %q", r.stderr)
	}
	r = run(t, sock, runOpts{}, "region", "import", "copy2", file, "--progress", "always").ok(t)
	if !strings.Contains(r.stderr, "check  [==============================] 100%") ||
		!strings.Contains(r.stderr, "import [==============================] 100%") {
		t.Errorf("import --progress always drew no full bars: %q", r.stderr)
	}
	r = run(t, sock, runOpts{}, "region", "import", "copy", file, "--quiet").ok(t)
	if r.stdout != "" || r.stderr != "" {
		t.Errorf("import --quiet printed %q, %q", r.stdout, r.stderr)
	}
}

func TestRegionExportImportFailures(t *testing.T) {
	f, sock := serveFake(t)
	f.mu.Lock()
	f.addRegion("mid", 8<<20, 4096, dsmpb.Durability_DURABILITY_MEMORY)
	f.mu.Unlock()
	for _, off := range []string{"0", "1MiB", "3MiB", "5MiB", "7MiB"} {
		run(t, sock, runOpts{}, "put", "mid", off, "data at "+off).ok(t)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "mid.dsmr")
	f.mu.Lock()
	f.failReadAt = 5 << 20
	f.mu.Unlock()
	r := run(t, sock, runOpts{}, "region", "export", "mid", file)
	if r.code != ExitError || !strings.Contains(r.stderr, "export of region mid: reading bytes 0x500000-0x5fffff") {
		t.Errorf("export with a failing read: exit %d, %q", r.code, r.stderr)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("a failed export left %d files, the first %s", len(left), left[0].Name())
	}

	f.mu.Lock()
	f.failReadAt = 0
	f.mu.Unlock()
	run(t, sock, runOpts{}, "region", "export", "mid", file).ok(t)
	f.mu.Lock()
	f.failWriteAt = 4 << 20
	f.mu.Unlock()
	r = run(t, sock, runOpts{}, "region", "import", "mid2", file)
	if r.code != ExitError || !strings.Contains(r.stderr, "import into region mid2 stopped after") ||
		!strings.Contains(r.stderr, "writing bytes 0x") {
		t.Errorf("import with a failing write: exit %d, %q", r.code, r.stderr)
	}

	r = run(t, sock, runOpts{tty: true}, "region", "export", "mid", "-")
	if r.code != ExitUsage || r.stdout != "" {
		t.Errorf("export to a terminal: exit %d, %d bytes on stdout", r.code, len(r.stdout))
	}
}

func TestTransferLine(t *testing.T) {
	tr := &transfer{label: "export", total: 4 << 20}
	tr.add(1<<20, 256)
	if got, want := tr.line(2*time.Second), "export [=======                       ]  25% 1 MiB/4 MiB · 128 pages/s · 524.3kB/s · ETA 6s"; got != want {
		t.Errorf("line = %q\n      want %q", got, want)
	}
	chk := &transfer{label: "check ", noPages: true}
	chk.add(3000, 0)
	if got, want := chk.line(time.Second), "check  2.9 KiB · 3000B/s"; got != want {
		t.Errorf("line of an unknown total = %q, want %q", got, want)
	}
}
