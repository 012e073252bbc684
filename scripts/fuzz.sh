#!/usr/bin/env bash
# Fuzzes every fuzz target for FUZZTIME (default 1m) each. Not part of
# scripts/test.sh: Go's fuzzing engine can stop with "context deadline
# exceeded" when the machine is loaded, which says nothing about Village.
# A failure here with a crasher written to testdata/fuzz is a real defect:
# the crasher then runs in every `go test` as part of the seed corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
FUZZTIME="${FUZZTIME:-1m}"
for pkg in $(go list ./...); do
  for target in $(go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true); do
    echo "-- $pkg $target (${FUZZTIME})"
    go test -run='^$' -fuzz="^${target}\$" -fuzztime="$FUZZTIME" -fuzzminimizetime=10s "$pkg"
  done
done
echo "== fuzzing found nothing"
