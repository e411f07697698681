package engine

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/dsmkit/dsm/coherence"
	"github.com/dsmkit/dsm/internal/ids"
)

// A shard whose home and backup are both gone is brought back at a node
// that loaded its pages into its slots (LoadSlot, what dsmd does from its
// page store): once the placement moves the page there, a read from
// another member returns the loaded data, and a page not loaded reads
// zero. ClearSlots empties slots again.
func TestLoadedSlotsServeAfterMove(t *testing.T) {
	es := backupCluster(t, 1) // home n2, backup n3
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	old := bytes.Repeat([]byte{0x11}, 4096)
	if err := es[1].WriteMiss(ctx, testRegion, 5, nil); err != nil {
		t.Fatal(err)
	}
	if err := es[1].Evict(ctx, testRegion, 5, old); err != nil {
		t.Fatal(err)
	}
	w, _ := slot(es[2], 5)
	// The home and its backup die.
	for _, id := range []ids.NodeID{2, 3} {
		if err := es[id].Close(); err != nil {
			t.Fatal(err)
		}
	}
	stored := bytes.Repeat([]byte{0x77}, 4096)
	if err := es[4].LoadSlot(ctx, 5, w.Version(), stored); err != nil {
		t.Fatal(err)
	}
	if got, data := slot(es[4], 5); got != coherence.Stamp(w.Version()) || !bytes.Equal(data, stored) {
		t.Fatalf("loaded slot: %v beside %x..., want %v beside the stored data", got, data[:4], coherence.Stamp(w.Version()))
	}
	if err := es[4].LoadSlot(ctx, 5, 1, stored[:100]); err == nil {
		t.Fatal("a load of a short page was taken")
	}
	rc := coherence.Reconfigure{Epoch: 17, Members: []ids.NodeID{1, 4},
		HomeOf:  func(ids.PageNo) ids.NodeID { return 4 },
		Targets: []ids.NodeID{4},
		Backups: func(ids.PageNo) []ids.NodeID { return nil }}
	es[1].Reconfigure(rc)
	es[4].Reconfigure(rc)
	buf := make([]byte, 4096)
	if err := es[1].ReadMiss(ctx, testRegion, 5, buf); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, stored) {
		t.Fatalf("page 5 reads %x..., want the loaded %x...", buf[:4], stored[:4])
	}
	if err := es[1].ReadMiss(ctx, testRegion, 4, buf); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, make([]byte, 4096)) {
		t.Fatalf("page 4, never loaded, reads %x...", buf[:4])
	}
	// ClearSlots on a slot nobody uses (n1's copy of page 2).
	if err := es[1].LoadSlot(ctx, 2, 3, stored); err != nil {
		t.Fatal(err)
	}
	if n, err := es[1].ClearSlots(ctx, 2, 3); err != nil || n != 1 {
		t.Fatalf("ClearSlots: %d, %v; want 1 slot", n, err)
	}
	if w, data := slot(es[1], 2); w != 0 || !bytes.Equal(data, make([]byte, 4096)) || len(es[1].Populated(0, testPages)) != 0 {
		t.Fatalf("cleared slot: %v beside %x...", w, data[:4])
	}
}
