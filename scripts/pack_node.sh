#!/usr/bin/env bash
# Packs what the GPU machine (Ubuntu 24.04 x86-64: no node, no network) needs to run the server
# tests (tests/server, the openai npm client): this machine's node binary (stripped) and
# tests/server/node_modules, xz-compressed into .node/ at the repository root (git-ignored, about
# 25 MB). Carry .node to the device and there `source scripts/lib/node_unpack.sh`.
#   scripts/pack_node.sh            (after `npm ci` in tests/server; NODE=/path/to/node to pick one)
# The node binary must be x86-64 and need no shared library beyond glibc and libstdc++ (the
# nodejs.org / NodeSource builds do; a distribution's node linking libnode.so does not travel).
set -euo pipefail
cd "$(dirname "$0")/.."
NODE=${NODE:-$(command -v node || true)}
if [ -z "$NODE" ] || [ ! -x "$NODE" ]; then echo "pack_node: no node found (set NODE=/path/to/node)" >&2; exit 1; fi
[ -d tests/server/node_modules/openai ] || { echo "pack_node: tests/server/node_modules lacks openai: run 'npm ci' in tests/server first" >&2; exit 1; }
[ "$(uname -m)" = x86_64 ] || { echo "pack_node: this machine is $(uname -m); the device needs an x86-64 node" >&2; exit 1; }
if ldd "$NODE" | grep -qE 'libnode|libuv|libicu|libssl|not found'; then
  echo "pack_node: $NODE needs shared libraries the device lacks:" >&2
  ldd "$NODE" | grep -E 'libnode|libuv|libicu|libssl|not found' >&2
  exit 1
fi

mkdir -p .node
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Debug info is most of an unstripped node; the x86 filter helps xz on machine code.
if command -v strip > /dev/null; then strip -o "$tmp/node" "$NODE"; else cp "$NODE" "$tmp/node"; fi
"$tmp/node" --version > /dev/null
xz --x86 --lzma2=preset=9e -c "$tmp/node" > .node/node.xz.tmp
mv .node/node.xz.tmp .node/node.xz
# node_modules may be a link (to another checkout's): pack what it points to.
tar -C "$(realpath tests/server/node_modules)" -cf - . | xz -9 > .node/node_modules.tar.xz.tmp
mv .node/node_modules.tar.xz.tmp .node/node_modules.tar.xz
"$NODE" --version > .node/VERSION
du -ch .node/node.xz .node/node_modules.tar.xz
