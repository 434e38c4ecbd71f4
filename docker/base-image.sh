#!/usr/bin/env bash
# Make a Debian bookworm base image (Python 3.11) without Docker Hub: debootstrap a minimal
# root file system from an apt mirror and `docker import` it. Pass the result to the build:
#   sudo docker/base-image.sh                       # -> headway-base:bookworm
#   HEADWAY_BASE_IMAGE=headway-base:bookworm docker/e2e.sh
#   docker build --build-arg BASE_IMAGE=headway-base:bookworm -f docker/Dockerfile -t headway:latest .
# Needs root, debootstrap (apt-get install debootstrap) and a running Docker engine.
#
# Environment:
#   MIRROR    Debian mirror (default: the first deb.debian.org-style URI apt uses here)
#   EXTRA_CA  space-separated CA certificates (PEM, *.crt) to trust inside the image, for a
#             TLS-intercepting proxy between the build and PyPI (default: every file in
#             /usr/local/share/ca-certificates, i.e. what this host added to its own trust store)
set -euo pipefail

TAG=${1:-headway-base:bookworm}
if [[ -z ${MIRROR:-} ]]; then
    MIRROR=$(grep -hoE '^(URIs:|deb) *https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null \
        | grep -oE 'https?://[^ ]+' | head -n1 || true)
    MIRROR=${MIRROR:-http://deb.debian.org/debian}
fi
if [[ $(id -u) -ne 0 ]]; then echo "error: run as root (debootstrap needs it)" >&2; exit 2; fi
command -v debootstrap >/dev/null || { echo "error: debootstrap missing: apt-get install -y debootstrap" >&2; exit 2; }
docker info >/dev/null 2>&1 || { echo "error: no Docker engine reachable (see docker/README.md, 'Offline')" >&2; exit 2; }

ROOTFS=$(mktemp -d /var/tmp/headway-rootfs.XXXXXX)
trap 'rm -rf --one-file-system "$ROOTFS"' EXIT

echo "debootstrap bookworm from $MIRROR into $ROOTFS"
# python3-venv brings ensurepip (pip inside a venv: Debian's own pip refuses system installs, PEP 668)
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 \
    || { tail -20 "$ROOTFS.log" >&2; exit 1; }
rm -f "$ROOTFS.log"

extra=${EXTRA_CA-$(ls /usr/local/share/ca-certificates/*.crt 2>/dev/null || true)}
if [[ -n $extra ]]; then
    for ca in $extra; do cp "$ca" "$ROOTFS/usr/local/share/ca-certificates/"; echo "trusting $ca"; done
    chroot "$ROOTFS" update-ca-certificates >/dev/null
fi
chroot "$ROOTFS" apt-get clean
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/log/*.log "$ROOTFS"/tmp/*

tar -C "$ROOTFS" --numeric-owner -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
    --change 'CMD ["/bin/bash"]' \
    - "$TAG"
docker run --rm "$TAG" python3 -c 'import sys, venv, ensurepip; print("base image ok: Python", sys.version.split()[0])'
echo "made $TAG; build with --build-arg BASE_IMAGE=$TAG (or HEADWAY_BASE_IMAGE=$TAG for compose and e2e.sh)"
