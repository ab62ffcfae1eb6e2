#!/usr/bin/env bash
# Installs origami's build and test dependencies from Debian packages.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
packages=(build-essential cmake pkg-config nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev
          libbenchmark-dev python3 python3-jinja2
          # the libFuzzer harnesses (scripts/fuzz.sh): clang, its sanitizer/fuzzer runtimes,
          # clang's OpenMP, llvm-symbolizer for readable crash stacks
          clang libclang-rt-dev libomp-dev llvm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
