#!/usr/bin/env bash
# Installs origami's build and test dependencies from Debian packages, and the server tests'
# npm packages (the official openai client, pinned by tests/server/package-lock.json).
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
packages=(build-essential cmake pkg-config nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev
          libbenchmark-dev python3 python3-jinja2
          # the server (Boost.Beast/Asio headers)
          libboost-dev
          # the libFuzzer harnesses (scripts/fuzz.sh): clang, its sanitizer/fuzzer runtimes,
          # clang's OpenMP, llvm-symbolizer for readable crash stacks
          clang libclang-rt-dev libomp-dev llvm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The server tests run on Node with npm. A machine may already have a Node build that bundles
# npm (Debian's npm package would conflict with it): install them only when missing.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
# Without the npm registry (an offline GPU machine) the server tests cannot run; the build can.
(cd "$(dirname "$0")/../tests/server" && npm ci --no-audit --no-fund --loglevel=error) ||
  echo "install-deps: warning: npm ci failed in tests/server; the server tests will fail" >&2
