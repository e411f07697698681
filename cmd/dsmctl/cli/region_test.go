package cli

import (
	"strings"
	"testing"

	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// addHuge adds to the fake a region of 16 TiB in 2 MiB shards: 8388608
// shards, more than one RegionInfo lists.
func addHuge(f *fakeAdmin) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.addRegion("huge", 16<<40, 4096, dsmpb.Durability_DURABILITY_MEMORY)
	r.Shards = 16 << 40 >> 21
}

func TestRegionInfoPaging(t *testing.T) {
	f, sock := serveFake(t)
	addHuge(f)
	f.mu.Lock()
	f.maps["huge"] = map[uint32][]int32{1: {4242, 4243}, 2: {0}}
	f.mapErr[3] = "n3 did not answer: node: closed"
	f.mu.Unlock()

	golden(t, "region-info-huge", run(t, sock, runOpts{}, "region", "info", "huge").ok(t).stdout)
	f.mu.Lock()
	reqs := f.infoReqs
	f.infoReqs = nil
	f.mu.Unlock()
	if len(reqs) != 1 || reqs[0].FirstShard != 0 || reqs[0].MaxShards != 64 {
		t.Errorf("region info asked %v, want one request for shards 0-63", reqs)
	}

	// The end of the listing: no line about more.
	r := run(t, sock, runOpts{}, "region", "info", "huge", "--shards", "8388600:").ok(t)
	if !strings.Contains(r.stdout, "\n8388607  ") || strings.Contains(r.stdout, "more shard") ||
		!strings.Contains(r.stdout, "placement of the listed shards 8388600-8388607 only (of 8388608)") {
		t.Errorf("region info --shards 8388600:\n%s", r.stdout)
	}

	// More than one request holds: dsmctl pages through them.
	var v regionInfoJSON
	f.mu.Lock()
	f.infoReqs = nil
	f.mu.Unlock()
	decode(t, run(t, sock, runOpts{}, "region", "info", "huge", "--shards", "100:70100", "--json").ok(t).stdout, &v)
	f.mu.Lock()
	reqs = f.infoReqs
	f.mu.Unlock()
	if len(v.Shards) != 70000 || v.Shards[0].Index != 100 || v.Shards[69999].Index != 70099 || v.NextShard != 70100 ||
		v.ShardCount != 8388608 || v.HomesComplete || len(reqs) != 2 || reqs[1].FirstShard != 65636 || reqs[1].MaxShards != 4464 {
		t.Errorf("--shards 100:70100: %d shards, next %d, count %d, homes complete %v; requests %v",
			len(v.Shards), v.NextShard, v.ShardCount, v.HomesComplete, reqs)
	}
	if len(v.Mappings) != 3 || len(v.Mappings[0].PIDs) != 2 || v.Mappings[2].Error == "" {
		t.Errorf("mappings: %+v", v.Mappings)
	}

	// Past the last shard is a usage error, whether dsmctl or dsmd says so.
	if r := run(t, sock, runOpts{}, "region", "info", "huge", "--shards", "8388608:"); r.code != ExitUsage ||
		!strings.Contains(r.stderr, "region huge has 8388608 shards") {
		t.Errorf("--shards past the end: exit %d, %q", r.code, r.stderr)
	}
	if r := run(t, sock, runOpts{}, "region", "info", "huge", "--shards", "9000000:"); r.code != ExitUsage ||
		!strings.Contains(r.stderr, "8388608 shards") {
		t.Errorf("--shards past the end: exit %d, %q", r.code, r.stderr)
	}
	for _, bad := range []string{"5", "9:3", "x:"} {
		if r := run(t, sock, runOpts{}, "region", "info", "huge", "--shards", bad); r.code != ExitUsage {
			t.Errorf("--shards %s: exit %d, %q", bad, r.code, r.stderr)
		}
	}
}

// TestRegionInfoSummary checks that the per-node sums cover every shard of
// a region of up to 65536 shards even when only some are listed.
func TestRegionInfoSummary(t *testing.T) {
	f, sock := serveFake(t)
	f.mu.Lock()
	f.addRegion("mid", 1<<30, 4096, dsmpb.Durability_DURABILITY_MEMORY).Shards = 512
	f.mu.Unlock()
	var v regionInfoJSON
	decode(t, run(t, sock, runOpts{}, "region", "info", "mid", "--json").ok(t).stdout, &v)
	var shards int
	for _, h := range v.Homes {
		shards += h.Shards
	}
	if len(v.Shards) != 64 || v.NextShard != 64 || !v.HomesComplete || shards != 512 {
		t.Errorf("mid: %d listed, next %d, homes complete %v over %d shards", len(v.Shards), v.NextShard, v.HomesComplete, shards)
	}
	r := run(t, sock, runOpts{}, "region", "info", "mid").ok(t)
	if !strings.HasSuffix(r.stdout, "\n448 more shards: list the next 64 with --shards 64:128, all with --shards 64:\n") {
		t.Errorf("no line about the shards not listed:\n%s", r.stdout)
	}
}

// TestRegionInfoOlderDaemon checks region info against a dsmd without
// shard paging and without Mappings.
func TestRegionInfoOlderDaemon(t *testing.T) {
	f, sock := serveFake(t)
	f.mu.Lock()
	f.oldRegionInfo, f.noMappings = true, true
	f.mu.Unlock()
	r := run(t, sock, runOpts{}, "region", "info", "feat", "--shards", "1:3").ok(t)
	for _, w := range []string{"· 4 shards ·", "mappings: unknown: this dsmd does not report mappings",
		"\n1      65536-131071   n2    n3\n2      131072-196607  n3    n1\n1 more shard: list the next 1 with --shards 3:4"} {
		if !strings.Contains(r.stdout, w) {
			t.Errorf("region info against an older dsmd lacks %q:\n%s", w, r.stdout)
		}
	}
	var v regionInfoJSON
	decode(t, run(t, sock, runOpts{}, "region", "info", "feat", "--json").ok(t).stdout, &v)
	if len(v.Shards) != 4 || v.ShardCount != 4 || v.Mappings != nil || v.MappingsError == "" {
		t.Errorf("region info --json against an older dsmd: %+v", v)
	}
}
