#!/usr/bin/env bash
# idle-cpu.sh measures what an idle cluster costs: it starts the local
# three-node cluster of run-cluster.sh, creates 8 regions of 64 MiB, lets it
# settle for 15 s, then reads each dsmd's utime+stime from /proc/PID/stat
# over SECONDS (default 60) and prints it as a share of one CPU, the leader
# named; then it stops the cluster. docs/benchmarks.md has the figures.
#
#   deploy/local/idle-cpu.sh [SECONDS]
#
# Environment: as run-cluster.sh (DSM_RUN_DIR, default ./.run-idle; PORT_BASE;
# BIN_DIR; GO: GO=true measures the binaries already in BIN_DIR without
# building them).
set -euo pipefail

cd "$(dirname "$0")/../.."
SECS=${1:-60}
RUN=${DSM_RUN_DIR:-$PWD/.run-idle}
BIN=${BIN_DIR:-$PWD/bin}
rm -rf "$RUN"
mkdir -p "$RUN"
DSM_RUN_DIR=$RUN BIN_DIR=$BIN deploy/local/run-cluster.sh >"$RUN/cluster.out" 2>&1 &
cluster=$!
trap 'kill -TERM $cluster 2>/dev/null; wait $cluster 2>/dev/null || true' EXIT
for _ in $(seq 1 180); do
	grep -q "The cluster is up" "$RUN/cluster.out" 2>/dev/null && break
	kill -0 $cluster 2>/dev/null || { cat "$RUN/cluster.out" >&2; exit 1; }
	sleep 1
done
export DSM_ADDR=$RUN/n1/dsmd.sock
for i in $(seq 1 8); do
	"$BIN/dsmctl" region create "idle$i" 64MiB >/dev/null
done
leader=$("$BIN/dsmctl" status | sed -n 's/.*leader n\([0-9]*\).*/\1/p' | head -n1)
sleep 15

hz=$(getconf CLK_TCK)
pids=()
for i in 1 2 3; do
	pids+=("$(pgrep -f "^$BIN/dsmd --id $i --data-dir $RUN/n$i ")")
done
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
t0=()
for p in "${pids[@]}"; do t0+=("$(ticks "$p")"); done
s0=$(date +%s.%N)
sleep "$SECS"
s1=$(date +%s.%N)
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for i in 1 2 3; do
	p=${pids[$((i - 1))]}
	role=follower
	[ "$i" = "$leader" ] && role=leader
	awk -v a="${t0[$((i - 1))]}" -v b="$(ticks "$p")" -v hz="$hz" -v s="$(echo "$s1 - $s0" | bc)" -v n="n$i" -v r="$role" \
		'BEGIN { printf "%s (%s): %.2f%% of a CPU (%d ticks of 1/%d s in %.1f s)\n", n, r, 100 * (b - a) / hz / s, b - a, hz, s }'
done
