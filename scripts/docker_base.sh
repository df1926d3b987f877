#!/usr/bin/env bash
# A local base image for the Dockerfile, for a machine that reaches no image registry (only Debian's and
# Python's package indexes): a minimal Debian root file system with Python in a venv, this machine's DNS
# settings and pip's CA bundle, and torch from pip; imported as TAG (default nmt-base:local).
#
#   bash scripts/docker_base.sh [TAG]          # as root, with debootstrap and a running Docker engine
#   docker build --network host --build-arg BASE=nmt-base:local -t nmt .
#
# TORCH (default 2.13.0) is the torch version: one the test suite has run on. SUITE (default bookworm)
# and DEBIAN_MIRROR pick the Debian release and mirror.
set -euo pipefail
# shellcheck source=scripts/script_usage.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/script_usage.sh"   # beside this file, links followed
[[ $# -le 1 && "${1:-}" != -* ]] || usage_error "takes [TAG], got '$*'"
tag="${1:-nmt-base:local}"
[[ $EUID -eq 0 ]] || usage_error "needs root (debootstrap, chroot)"
command -v debootstrap > /dev/null || usage_error "needs debootstrap (apt-get install debootstrap)"
docker info > /dev/null 2>&1 || usage_error "needs a running Docker engine"

root="$(mktemp -d)" wheels="$(mktemp -d)"
trap 'umount "$root/proc" 2>/dev/null || true; rm -rf "$root" "$wheels"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates "${SUITE:-bookworm}" "$root" \
  "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" > /dev/null
cp /etc/resolv.conf "$root/etc/resolv.conf"
cert="${PIP_CERT:-$(pip config list 2>/dev/null | sed -n "s/^[a-z]*\.cert='\(.*\)'$/\1/p" | tail -1)}"   # pip's own
cert="${cert:-/etc/ssl/certs/ca-certificates.crt}"                          # (`pip config get` misses files)
cp "$cert" "$root/etc/ssl/certs/ca-certificates.crt"
pip download -q --no-deps -d "$wheels" "torch==${TORCH:-2.13.0}"
cp "$wheels"/torch-*.whl "$root/tmp/"
mount -t proc proc "$root/proc"
inside=(env)                                # without this machine's PIP_* settings: their paths are not there
for name in $(compgen -e); do [[ "$name" == PIP_* ]] && inside+=(-u "$name"); done
chroot "$root" "${inside[@]}" python3 -m venv /opt/venv
chroot "$root" "${inside[@]}" sh -c 'PIP_CERT=/etc/ssl/certs/ca-certificates.crt /opt/venv/bin/pip install -q /tmp/torch-*.whl \
  && rm /tmp/torch-*.whl && /opt/venv/bin/python -c "import torch; print(\"torch\", torch.__version__)"'
umount "$root/proc"
tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$tag" > /dev/null
echo "base image $tag: $(docker image inspect --format '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1 / 1e6}')"
