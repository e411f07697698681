package cli

import (
	"context"
	"io"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// FuzzRender decodes arbitrary bytes as the answers dsmd sends to pages and
// top, and draws them: whatever a daemon (or a corrupted stream) sends,
// dsmctl prints something and never panics.
func FuzzRender(f *testing.F) {
	fake := newFakeAdmin()
	pages, _ := fake.Pages(context.Background(), &dsmpb.PagesRequest{Region: "small", Group: 3, Cluster: true})
	b, _ := proto.Marshal(pages)
	f.Add(b)
	stats, _ := fake.Stats(context.Background(), &dsmpb.StatsRequest{})
	b, _ = proto.Marshal(stats)
	f.Add(b)
	f.Add(mustMarshal(&dsmpb.PagesResponse{PageCount: 0, Cells: []*dsmpb.PageCell{
		{Modified: 3, Owners: make([]uint32, 30)}, {Shared: 1, MaxSharers: 1 << 31}}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var p dsmpb.PagesResponse
		if proto.Unmarshal(b, &p) == nil {
			for _, color := range []bool{false, true} {
				if err := newGrid(&p).render(io.Discard, 7, color); err != nil {
					t.Fatal(err)
				}
			}
		}
		var s dsmpb.StatsResponse
		if proto.Unmarshal(b, &s) == nil {
			m := map[uint32]*dsmpb.NodeStats{}
			for _, n := range s.Nodes {
				m[n.NodeId] = n
			}
			a := &app{env: Env{Stdout: io.Discard, Getenv: func(string) string { return "" }}}
			if err := a.renderTop(topFrame(m, m, time.Second)); err != nil {
				t.Fatal(err)
			}
		}
	})
}

func mustMarshal(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}
