#!/usr/bin/env bash
# Runs every test: vet, the unit and namespace tests, the end-to-end tests
# through libcni and cnitool with the built binaries, and each fuzz target for
# a short time. Needs root (tests make network namespaces) and the packages
# scripts/deps.sh installs (it runs first).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "test.sh: run as root (tests make network namespaces)" >&2; exit 1; }

export PATH="$PATH:/usr/local/go/bin"
./scripts/deps.sh
# crictl for the containerd test (test/runtime): built once from the module
# proxy and cached under /var/cache/village.
./scripts/crictl.sh >/dev/null

FUZZTIME="${FUZZTIME:-10s}"

echo "== go vet"
go vet ./...
# test/libcni-v1.1 is its own module (pinned to libcni 1.1.2): ./... skips it.
(cd test/libcni-v1.1 && go vet ./...)

echo "== build"
./build_linux.sh
export VILLAGE_BIN_DIR="$PWD/bin" VILLAGE_REF_BIN_DIR="$PWD/bin/ref"

echo "== go test"
go test -count=1 -timeout 60m ./... 2>&1 | tee /tmp/village-test.log

echo "== fuzz (${FUZZTIME} each)"
for pkg in $(go list ./...); do
  for target in $(go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true); do
    echo "-- $pkg $target"
    go test -run='^$' -fuzz="^${target}\$" -fuzztime="$FUZZTIME" -fuzzminimizetime=2s "$pkg"
  done
done
echo "== all tests passed"
