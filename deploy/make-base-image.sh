#!/bin/sh
# Make a Python base image with no registry: Debian's debootstrap, imported into Docker.
#
#   sudo deploy/make-base-image.sh bookworm local/python:3.11-bookworm     # Python 3.11
#   sudo deploy/make-base-image.sh trixie   local/python:3.13-trixie       # Python 3.13
#   docker build --network host --build-arg PYTHON_IMAGE=local/python:3.11-bookworm --build-arg VARIANT=cpu-onnx .
#
# Needs root, debootstrap and a Debian mirror (DEBIAN_MIRROR, default http://deb.debian.org/debian);
# DOCKER (default docker) is the docker command, e.g. "docker -H unix:///path/docker.sock".
# The image is a minimal Debian (variant minbase) with python3, python3-venv and ca-certificates,
# a `python` link, and this machine's CA bundle (so pip works behind a TLS-inspecting proxy); apt's
# package lists and archives, documentation and man pages are removed, as in Docker's python:*-slim.
set -eu
suite=${1:?usage: make-base-image.sh SUITE TAG  (e.g. bookworm local/python:3.11-bookworm)}
tag=${2:?usage: make-base-image.sh SUITE TAG}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
docker=${DOCKER:-docker}
command -v debootstrap >/dev/null || { echo "make-base-image.sh: debootstrap is missing (apt-get install debootstrap)" >&2; exit 1; }
root=$(mktemp -d "${TMPDIR:-/tmp}/clipserve-base-$suite.XXXXXX")
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates "$suite" "$root" "$mirror" \
  > "$root.log" 2>&1 || { tail -n 30 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
fi
ln -sf python3 "$root/usr/bin/python"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/* \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/tmp/* "$root"/root/.cache
version=$(chroot "$root" python3 -c 'import platform; print(platform.python_version())')
tar -C "$root" --numeric-owner -c . | $docker import \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  --message "debootstrap --variant=minbase $suite (Python $version)" - "$tag" >/dev/null
echo "$tag: Debian $suite, Python $version"
