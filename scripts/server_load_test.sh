#!/usr/bin/env bash
# The server's load test at full size: LOAD_N (default 1000) concurrent streaming requests to
# `origami serve` (tiny model, CPU), 20% of the clients disconnecting at random points; checks
# that the server stays up, completed requests equal their prompt's greedy text alone, the KV
# blocks in use return to zero, and no file descriptor or thread leaks. CI runs it with 200
# (ctest server_load). Usage: scripts/server_load_test.sh [N]   (BIN: the origami binary)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-}
if [ -z "$BIN" ]; then for b in build/origami build-dev/origami; do [ -x "$b" ] && { BIN=$b; break; }; done; fi
[ -d tests/server/node_modules/openai ] || (cd tests/server && npm ci --no-audit --no-fund --loglevel=error)
cd tests/server
ORIGAMI_BIN=$(realpath "../../$BIN") LOAD_N=${1:-${LOAD_N:-1000}} node --test load.test.mjs
