#!/usr/bin/env bash
# fuzz-all.sh runs every fuzz target of the tree, one after another, for
# FUZZTIME each (default 30s), and prints the executions of each and their
# total. It fails when a target finds a failing input (written under the
# package's testdata/fuzz, which makes it a regression test), or fails for
# any reason but one: Go's fuzzing coordinator sometimes misses its own
# shutdown deadline on a loaded machine ("context deadline exceeded" with no
# failing input), which is reported and not counted as a failure.
# `make fuzz` calls it. GO and TAGS (e.g. "-tags ofi") may be set.
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-30s}
total=0
status=0
while read -r f; do
	dir=$(dirname "$f")
	for name in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$f"); do
		echo "== $dir $name ($FUZZTIME)"
		out=$("$GO" test ${TAGS:-} "./$dir" -run '^$' -fuzz "^$name\$" -fuzztime "$FUZZTIME" -parallel 1 2>&1)
		rc=$?
		execs=$(printf '%s\n' "$out" | sed -n 's/.*execs: \([0-9]*\).*/\1/p' | tail -1)
		total=$((total + ${execs:-0}))
		if [ $rc -ne 0 ]; then
			if printf '%s\n' "$out" | grep -q 'Failing input written\|panic:'; then
				printf '%s\n' "$out"
				status=1
			elif printf '%s\n' "$out" | grep -q 'context deadline exceeded'; then
				echo "   ${execs:-0} executions; the fuzzing coordinator missed its shutdown deadline (no failing input)"
				continue
			else
				printf '%s\n' "$out"
				status=1
			fi
		fi
		echo "   ${execs:-0} executions"
	done
done < <(grep -rl --include='*_test.go' '^func Fuzz' . | sort)
echo "fuzz: $total executions in all"
exit $status
