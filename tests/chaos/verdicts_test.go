package chaos

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A failure verdict is a loss of the failed node at the earliest time any
// dsmd log shows it; a graceful departure or a line without failures is
// none.
func TestFailureVerdicts(t *testing.T) {
	dir := t.TempDir()
	logs := map[int]string{
		1: `time=2026-12-02T08:56:32.706Z level=INFO msg="directory: member failed" node=n1 member=n2 epoch=e11
time=2026-12-02T08:56:32.650Z level=INFO msg="directory: epoch" node=n1 epoch=e11 joined=[] departed=[n2] failed=[n2]
time=2026-12-02T08:56:40.000Z level=INFO msg="directory: epoch" node=n1 epoch=e12 joined=[] departed=[n3] failed=[]
`,
		3: `time=2026-12-02T08:56:32.640Z level=INFO msg="directory: epoch" node=n3 epoch=e11 joined=[] departed="[n1 n2]" failed="[n1 n2]"
time=2026-12-02T08:57:00.000Z level=INFO msg="directory: epoch" node=n3 epoch=e11 joined=[] departed=[] failed=[n2]
`,
	}
	dirs := map[int]string{}
	for n, l := range logs {
		d := filepath.Join(dir, "n", string(rune('0'+n)))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "dsmd.log"), []byte(l), 0o644); err != nil {
			t.Fatal(err)
		}
		dirs[n] = d
	}
	dirs[2] = filepath.Join(dir, "absent")
	evs, err := failureVerdicts(dirs)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]string{1: "08:56:32.640", 2: "08:56:32.640"}
	if len(evs) != len(want) {
		t.Fatalf("events %+v, want losses of n1 and n2", evs)
	}
	for _, e := range evs {
		got := time.Unix(0, e.T).UTC().Format("15:04:05.000")
		if e.What != evLoss || want[e.Node] != got {
			t.Errorf("event %+v at %s; want a loss of n%d at %s", e, got, e.Node, want[e.Node])
		}
	}
}
