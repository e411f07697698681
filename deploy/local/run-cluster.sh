#!/usr/bin/env bash
# run-cluster.sh starts a local three-node DSM cluster on loopback, with its
# data under ./.run/ (override with DSM_RUN_DIR), waits until dsmctl status
# says healthy, prints how to reach it, and stops every dsmd on Ctrl-C or
# when it exits. Nothing to configure. `make run` calls it.
#
# Environment (all optional): DSM_RUN_DIR (data and logs, default ./.run),
# PORT_BASE (default 7946), BIN_DIR (where the binaries go, default ./bin),
# GO (the go command), DSM_TLS (1, the default: a cluster CA and the nodes'
# certificates are made under DSM_RUN_DIR/tls with `dsmctl tls` on the first
# run, and every TCP listener speaks mutual TLS; 0: plain TCP on loopback).
#
# Ports: node i (1..3) uses 127.0.0.1:(7946 + 10*(i-1)) for gossip and the
# next three ports for Raft, directory RPC and verbs; PORT_BASE moves them.
set -euo pipefail

cd "$(dirname "$0")/../.."
ROOT=$PWD
RUN_DIR=${DSM_RUN_DIR:-$ROOT/.run}
PORT_BASE=${PORT_BASE:-7946}
BIN=${BIN_DIR:-$ROOT/bin}
GO=${GO:-go}
N=3

echo "building $BIN/dsmd and $BIN/dsmctl"
mkdir -p "$BIN"
"$GO" build -o "$BIN/dsmd" ./cmd/dsmd
"$GO" build -o "$BIN/dsmctl" ./cmd/dsmctl

mkdir -p "$RUN_DIR"
TLS_DIR=$RUN_DIR/tls
tls_args=()
if [ "${DSM_TLS:-1}" != 0 ]; then
	if [ ! -e "$TLS_DIR/ca.pem" ]; then
		"$BIN/dsmctl" tls ca create --dir "$TLS_DIR"
	fi
	for i in $(seq 1 $N); do
		if [ ! -e "$TLS_DIR/node-$i.pem" ]; then
			"$BIN/dsmctl" tls cert create --node "$i" --dir "$TLS_DIR"
		fi
	done
	if [ ! -e "$TLS_DIR/client.pem" ]; then
		"$BIN/dsmctl" tls cert create --client --dir "$TLS_DIR"
	fi
	tls_args=(--tls-dir "$TLS_DIR")
fi
pids=()
stopping=0
cleanup() {
	[ "$stopping" = 1 ] && return
	stopping=1
	if [ ${#pids[@]} -gt 0 ]; then
		echo
		echo "stopping the cluster (graceful leave)"
		for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
		for p in "${pids[@]}"; do
			for _ in $(seq 1 150); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
			kill -KILL "$p" 2>/dev/null || true
			wait "$p" 2>/dev/null || true
		done
	fi
	echo "stopped; data and logs are in $RUN_DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Gossip is encrypted: one key for the cluster, made on the first run and
# kept in the run directory (each node then keeps its keyring in its data
# directory; dsmctl keyring rotates it).
KEYRING=$RUN_DIR/gossip-keyring.json
if [ ! -s "$KEYRING" ]; then
	(umask 077 && printf '["%s"]\n' "$("$BIN/dsmctl" keygen)" >"$KEYRING")
fi

join=127.0.0.1:$PORT_BASE
for i in $(seq 1 $N); do
	dir=$RUN_DIR/n$i
	mkdir -p "$dir"
	base=$((PORT_BASE + 10 * (i - 1)))
	"$BIN/dsmd" --id "$i" --data-dir "$dir" --bind 127.0.0.1 --port-base "$base" \
		--bootstrap-expect $N --join "$join" --gossip-keyring-file "$KEYRING" ${tls_args[@]+"${tls_args[@]}"} \
		--metrics-addr "127.0.0.1:$((base + 5))" >"$dir/dsmd.log" 2>&1 &
	pids+=($!)
	echo "n$i: pid $! socket $dir/dsmd.sock console http://127.0.0.1:$((base + 5))/ metrics http://127.0.0.1:$((base + 5))/metrics log $dir/dsmd.log"
done

echo "waiting for a healthy cluster"
ok=0
for _ in $(seq 1 120); do
	for p in "${pids[@]}"; do
		if ! kill -0 "$p" 2>/dev/null; then
			echo "a dsmd exited early; its log:" >&2
			tail -n 20 "$RUN_DIR"/n*/dsmd.log >&2
			exit 1
		fi
	done
	if "$BIN/dsmctl" --addr "$RUN_DIR/n1/dsmd.sock" --timeout 2s status >/dev/null 2>&1; then
		ok=1
		break
	fi
	sleep 0.5
done
if [ "$ok" != 1 ]; then
	echo "the cluster did not become healthy in 60 s:" >&2
	"$BIN/dsmctl" --addr "$RUN_DIR/n1/dsmd.sock" status >&2 || true
	exit 1
fi
"$BIN/dsmctl" --addr "$RUN_DIR/n1/dsmd.sock" status || true
cat <<MSG

The cluster is up. Web console: http://127.0.0.1:$((PORT_BASE + 5))/ (n1's; every node serves one)
In another shell:
  export DSM_ADDR=$RUN_DIR/n1/dsmd.sock     # or n2, n3
  $BIN/dsmctl status
  $BIN/dsmctl region create demo 64MiB

Ctrl-C stops all three dsmd.
MSG
if [ ${#tls_args[@]} -gt 0 ]; then
	cat <<MSG
Every TCP port speaks mutual TLS with the CA in $TLS_DIR (docs/security.md);
dsmctl over TCP: --tls-dir $TLS_DIR. Rotate n1's certificate with
  $BIN/dsmctl tls cert create --node 1 --dir $TLS_DIR --replace && kill -HUP ${pids[0]}
MSG
fi
wait
