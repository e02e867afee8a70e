#!/bin/sh
# Python 3.11 for aarch64, with cffi, unpacked into folder $1 (nothing is installed on this
# machine): Debian's own packages for the release this machine runs, fetched by apt into a private
# package state under $1/.apt (the system's sources and keys; the system's package lists and dpkg
# are left as they are). `qemu-aarch64 -L $1 $1/usr/bin/python3.11` then runs it (user mode).
# Used by `make portability` to run the cards' one reader against the CPU oracle built for
# aarch64. Safe to run again: an existing interpreter is kept.
set -eu
root=${1:?usage: aarch64_python.sh FOLDER}
if [ -x "$root/usr/bin/python3.11" ] && [ -f "$root/usr/lib/python3/dist-packages/cffi/__init__.py" ]; then
    exit 0
fi
state=$root/.apt
mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$state/debs"
apt_private="-o APT::Architecture=arm64 -o APT::Architectures::=arm64 -o Dir::State::Lists=$state/lists \
 -o Dir::Cache=$state/cache -o Dir::State::status=/dev/null -o Debug::NoLocking=1 -q"
apt-get $apt_private update >/dev/null
# The interpreter and the standard library, the C runtime they link, and cffi with its parser.
(cd "$state/debs" && apt-get $apt_private download \
    libc6 zlib1g libexpat1 libffi8 \
    python3.11-minimal libpython3.11-minimal libpython3.11-stdlib \
    python3-cffi-backend python3-cffi python3-pycparser python3-ply 2>&1 | grep -v '^Get:' | grep -v '^W: Download is performed unsandboxed' || true)
for deb in "$state"/debs/*.deb; do dpkg-deb -x "$deb" "$root"; done
test -x "$root/usr/bin/python3.11"
