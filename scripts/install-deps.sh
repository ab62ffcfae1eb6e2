#!/usr/bin/env bash
# Installs origami's dependencies from Debian packages.
#   scripts/install-deps.sh          what building and running the `origami` CLI needs
#   scripts/install-deps.sh --test   also the test tools: GoogleTest/Benchmark, clang and its
#                                    fuzzer runtimes, Node with npm and the server tests' npm
#                                    packages (the official openai client, pinned by
#                                    tests/server/package-lock.json)
set -euo pipefail
test_deps=0
for arg in "$@"; do
  case "$arg" in
    --test) test_deps=1 ;;
    *) echo "scripts/install-deps.sh: unknown argument '$arg' (expected --test)" >&2; exit 2 ;;
  esac
done
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
packages=(build-essential cmake pkg-config nlohmann-json3-dev libcli11-dev
          # the server (Boost.Beast/Asio headers)
          libboost-dev
          # compiler cache: rebuilds and the test build reuse the quick start's objects
          ccache)
if [ "$test_deps" = 1 ]; then
  packages+=(libgtest-dev libgmock-dev libbenchmark-dev python3 python3-jinja2
             # the libFuzzer harnesses (scripts/fuzz.sh): clang, its sanitizer/fuzzer runtimes,
             # clang's OpenMP, llvm-symbolizer for readable crash stacks
             clang libclang-rt-dev libomp-dev llvm)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "$test_deps" = 1 ]; then
  # The server tests run on Node with npm. A machine may already have a Node build that bundles
  # npm (Debian's npm package would conflict with it): install them only when missing.
  command -v node >/dev/null 2>&1 || missing+=(nodejs)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
fi
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  # Recommended packages only for the test tools (clang's, node's): the quick start needs none.
  recommends=(--no-install-recommends)
  if [ "$test_deps" = 1 ]; then recommends=(); fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${recommends[@]}" "${missing[@]}"
fi
if [ "$test_deps" = 1 ]; then
  # Without the npm registry (an offline GPU machine) the server tests cannot run; the build can.
  (cd "$(dirname "$0")/../tests/server" && npm ci --no-audit --no-fund --loglevel=error) ||
    echo "install-deps: warning: npm ci failed in tests/server; the server tests will fail" >&2
fi
