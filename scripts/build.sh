#!/usr/bin/env bash
# Builds origami (Release) into build/. Adds the CUDA backend when nvcc is found, unless
# ORIGAMI_CUDA=OFF is set.
set -euo pipefail
cd "$(dirname "$0")/.."
cuda=${ORIGAMI_CUDA:-auto}
if [ "$cuda" = auto ]; then
  if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then cuda=ON; else cuda=OFF; fi
fi
extra=()
if [ "$cuda" = ON ] && ! command -v nvcc >/dev/null 2>&1; then extra+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc); fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DORIGAMI_CUDA="$cuda" "${extra[@]}" >/dev/null
cmake --build build -j"$(nproc)"
