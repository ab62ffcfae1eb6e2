#!/usr/bin/env bash
# Builds origami (Release) into build/.
#   scripts/build.sh          the `origami` CLI and the libraries it links: what the quick start runs
#   scripts/build.sh --all    every target: tests, benchmarks, analysis tools (scripts/test.sh)
# The CUDA backend (ORIGAMI_CUDA=auto|ON|OFF, default auto):
#   default build: ON only where a GPU can use it (nvcc and a GPU that nvidia-smi lists);
#   --all:         ON wherever nvcc is found, so that CUDA code compiles on every test run (CI
#                  has nvcc and no GPU).
# ccache (Debian package) caches compiler output when installed: a rebuild, a second checkout or
# the test build after the quick start reuses what was compiled (ORIGAMI_CCACHE=0 turns it off).
set -euo pipefail
cd "$(dirname "$0")/.."
all=0
for arg in "$@"; do
  case "$arg" in
    --all) all=1 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "scripts/build.sh: unknown argument '$arg' (expected --all)" >&2; exit 2 ;;
  esac
done

nvcc_path=$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; } || true)
have_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }
cuda=${ORIGAMI_CUDA:-auto}
if [ "$cuda" = auto ]; then
  cuda=OFF
  if [ -n "$nvcc_path" ] && { [ "$all" = 1 ] || have_gpu; }; then cuda=ON; fi
fi
args=(-DCMAKE_BUILD_TYPE=Release -DORIGAMI_CUDA="$cuda")
if [ "$cuda" = ON ] && [ -n "$nvcc_path" ]; then args+=(-DCMAKE_CUDA_COMPILER="$nvcc_path"); fi
if [ "$all" = 1 ]; then args+=(-DORIGAMI_TESTS=ON); else args+=(-DORIGAMI_TESTS=OFF); fi
if [ "${ORIGAMI_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null 2>&1; then
  # base_dir makes the cached paths relative, so checkouts in other folders share the cache.
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(cd .. && pwd)}
  args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
else
  args+=(-UCMAKE_CXX_COMPILER_LAUNCHER -UCMAKE_CUDA_COMPILER_LAUNCHER)
fi
cmake -S . -B build "${args[@]}" >/dev/null
if [ "$all" = 1 ]; then
  cmake --build build -j"$(nproc)"
else
  cmake --build build -j"$(nproc)" --target origami_cli
fi
