# shellcheck shell=bash
# Sourced on the GPU machine to run the server tests there:
#   source scripts/lib/node_unpack.sh
# Unpacks .node/ (made by scripts/pack_node.sh, carried with the repository) into /tmp/node
# (NODE_DIR overrides), puts its node first on PATH and links its node_modules into tests/server.
# Sourced, not run: it returns (never exits) with a message on failure.

# xz -dc, or Python's lzma where xz is missing.
_node_unxz() {
  if command -v xz > /dev/null; then xz -dc "$1"
  else python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$1"; fi
}

node_unpack() {
  local root dir pack
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  dir=${NODE_DIR:-/tmp/node}
  pack=$root/.node
  if [ ! -f "$pack/node.xz" ] || [ ! -f "$pack/node_modules.tar.xz" ]; then
    echo "node_unpack: $pack lacks node.xz or node_modules.tar.xz (run scripts/pack_node.sh and carry .node)" >&2
    return 1
  fi
  mkdir -p "$dir/bin" || return 1
  rm -rf "$dir/node_modules" && mkdir -p "$dir/node_modules" || return 1
  _node_unxz "$pack/node.xz" > "$dir/bin/node.tmp" && chmod +x "$dir/bin/node.tmp" && mv "$dir/bin/node.tmp" "$dir/bin/node" \
    || { echo "node_unpack: could not unpack node into $dir/bin" >&2; return 1; }
  _node_unxz "$pack/node_modules.tar.xz" | tar -xf - -C "$dir/node_modules" \
    || { echo "node_unpack: could not unpack node_modules into $dir" >&2; return 1; }
  case ":$PATH:" in *":$dir/bin:"*) ;; *) export PATH="$dir/bin:$PATH" ;; esac
  # A real node_modules folder there (an `npm ci` of that checkout) is left as it is.
  local link=$root/tests/server/node_modules
  if [ -e "$link" ] && [ ! -L "$link" ]; then
    echo "node_unpack: $link is a folder, left as it is" >&2
  else
    ln -sfn "$dir/node_modules" "$link" || return 1
  fi
  echo "node_unpack: node $("$dir/bin/node" --version) in $dir/bin, tests/server/node_modules -> $dir/node_modules"
}

node_unpack
