#!/usr/bin/env bash
# Installs what the demo and the tests need on a Debian machine that has Go:
# the one list of packages, used by scripts/demo.sh, scripts/test.sh and
# .ci/run. Does nothing when every command is already there (so it is cheap
# to call every time). Run as root. DEPS_PROFILE=demo installs only what the
# demo needs. crictl is not a Debian 12 package: scripts/crictl.sh builds it
# from the Go module proxy (the containerd test calls it).
set -euo pipefail

# command -> Debian package that provides it
declare -A demo=(
  [ip]=iproute2 [ping]=iputils-ping [iptables]=iptables [nft]=nftables
)
declare -A full=(
  [tcpdump]=tcpdump [iperf3]=iperf3 [pgrep]=procps [unshare]=util-linux
  [mount]=mount [containerd]=containerd [runc]=runc [podman]=podman
  [etcd]=etcd-server [busybox]=busybox-static [strace]=strace
  [nc.openbsd]=netcat-openbsd [curl]=curl [dash]=dash [dnsmasq]=dnsmasq-base
  # test/armvm: the arm VMs, and depmod -b for their initramfs
  [qemu-system-aarch64]=qemu-system-arm [depmod]=kmod
)

missing=()
check() {
  local -n m=$1
  for cmd in "${!m[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "$cmd" >/dev/null 2>&1 || missing+=("${m[$cmd]}")
  done
}
check demo
[ "${DEPS_PROFILE:-full}" = demo ] || check full
# The test images need the static busybox; Debian's busybox (dynamic) also
# provides the command, so ask dpkg for the package itself.
if [ "${DEPS_PROFILE:-full}" != demo ] && command -v dpkg >/dev/null && ! dpkg -s busybox-static >/dev/null 2>&1; then
  [[ " ${missing[*]} " == *" busybox-static "* ]] || missing+=(busybox-static)
fi
[ -e /etc/ssl/certs/ca-certificates.crt ] || missing+=(ca-certificates)

if [ "${#missing[@]}" -gt 0 ]; then
  [ "$(id -u)" = 0 ] || { echo "deps.sh: missing ${missing[*]}; run as root to install them" >&2; exit 1; }
  if ! command -v apt-get >/dev/null; then
    echo "deps.sh: missing packages ${missing[*]} and no apt-get to install them" >&2; exit 1
  fi
  echo "deps.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v go >/dev/null || [ -x /usr/local/go/bin/go ] || { echo "deps.sh: Go is needed (https://go.dev/doc/install); /usr/local/go/bin/go not found" >&2; exit 1; }
