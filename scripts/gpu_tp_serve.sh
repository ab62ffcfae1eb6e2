#!/usr/bin/env bash
# `origami serve --tensor-parallel-size 2` against `--tensor-parallel-size 1` through the openai
# client (tests/server/tensor_parallel.test.mjs) on a machine with two GPUs: builds origami with
# the CUDA backend, unpacks node (.node, made here by scripts/pack_node.sh and carried), runs the
# test. Logs under $OUT (or /tmp/origami-gpu-tp-serve); the agreement table is in
# tensor_parallel.log ("[tp]" lines).
#   OUT=... BUILD=build-gpu [TP_SIZE=2] [TP_NEAR_TIE=0.05] scripts/gpu_tp_serve.sh
# .devdata (the fixtures, about 48 MB) and .node (about 22 MB) do not travel in one call with the
# repository (64 MiB), so on the device it takes two calls on the same warm machine (the build and
# .devdata stay there between them):
#   1. carry [".devdata"]:  NO_TEST=1 OUT=$OUT scripts/gpu_tp_serve.sh     (builds origami)
#   2. carry [".node"]:     NO_BUILD=1 OUT=$OUT scripts/gpu_tp_serve.sh    (runs the test)
# NO_BUILD=1 uses $BUILD/origami as it is; NO_TEST=1 stops after the build. TP_DEVICE=cpu
# TP_SIZE=1 NO_BUILD=1 BUILD=build runs the test's CPU self-check with a CPU build.
set -uo pipefail
source "$(dirname "$0")/lib/gpu_common.sh"
gpu_script_init /tmp/origami-gpu-tp-serve
TP_DEVICE=${TP_DEVICE:-cuda}

if [ "${NO_BUILD:-0}" != 1 ]; then
  gpu_device_info "$OUT/build.log"
  gpu_build "$BUILD" "$OUT/build.log" origami_cli || exit 1
  echo "build: rc=$GPU_BUILD_RC (${GPU_BUILD_SECONDS}s)"
  [ "$GPU_BUILD_RC" = 0 ] || { grep -E "error" "$OUT/build.log" | head -20; exit 1; }
fi
[ "${NO_TEST:-0}" = 1 ] && exit 0
BIN_PATH=$(cd "$ROOT" && realpath "$BUILD")/origami
[ -x "$BIN_PATH" ] || { echo "no origami at $BIN_PATH (build it first: NO_TEST=1 with .devdata carried)" >&2; exit 1; }
[ -f "$SH/models/origami-tiny-qwen3/config.json" ] || { echo "no tiny model under $SH/models (carry .devdata)" >&2; exit 1; }
# shellcheck source=/dev/null
source "$ROOT/scripts/lib/node_unpack.sh" || exit 1

cd "$ROOT/tests/server" || exit 1
ORIGAMI_TP_DEVICE=$TP_DEVICE ORIGAMI_TP_SIZE=${TP_SIZE:-2} ORIGAMI_TP_NEAR_TIE=${TP_NEAR_TIE:-0.05} \
  ORIGAMI_BIN=$BIN_PATH ORIGAMI_MODEL=$SH/models/origami-tiny-qwen3 \
  timeout 900 node --test --test-reporter=spec tensor_parallel.test.mjs > "$OUT/tensor_parallel.log" 2>&1
rc=$?
grep -E "^\s*(✔|✖|﹣)|\[tp\]|^ℹ (tests|pass|fail|skipped)" "$OUT/tensor_parallel.log"
echo "tensor_parallel.test.mjs: rc=$rc (log: $OUT/tensor_parallel.log)"
exit $rc
