#!/usr/bin/env bash
# Online serving benchmark: for each KV configuration, starts `origami serve`, runs
# `origami bench serve` at each request rate, then `origami bench` (offline, same prompts) on the
# same workload, and prints one table of TTFT / TPOT / ITL / output tokens/s.
#
#   scripts/bench_serve.sh [engine flags...]
#   e.g. on the GPU machine (Qwen3-8B shape, dummy weights, 128 -> 1024):
#   scripts/bench_serve.sh --model ../shared/configs/qwen3-8b --dummy-weights \
#       --tokenizer ../shared/tokenizers/qwen3 --device cuda
#
# Environment: BIN (default build/origami, else build-gpu/origami), NUM_PROMPTS (256),
# INPUT_LEN (128), OUTPUT_LEN (1024), RATES ("4 16 64 inf"), MAX_CONCURRENCY (0: none),
# CONFIGS ("full zipage:1024": policy[:budget]), PORT (8765), OUT (/tmp/origami-bench-serve:
# logs and JSON). The engine flags go to both `serve` and `bench`.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-}
if [ -z "$BIN" ]; then for b in build/origami build-gpu/origami build-dev/origami; do [ -x "$b" ] && { BIN=$b; break; }; done; fi
[ -x "$BIN" ] || { echo "bench_serve.sh: no origami binary (set BIN)" >&2; exit 2; }
NUM_PROMPTS=${NUM_PROMPTS:-256}
INPUT_LEN=${INPUT_LEN:-128}
OUTPUT_LEN=${OUTPUT_LEN:-1024}
RATES=${RATES:-4 16 64 inf}
MAX_CONCURRENCY=${MAX_CONCURRENCY:-0}
CONFIGS=${CONFIGS:-full zipage:1024}
PORT=${PORT:-8765}
OUT=${OUT:-/tmp/origami-bench-serve}
mkdir -p "$OUT"
ENGINE_FLAGS=("$@")
ROWS="$OUT/rows.txt"
: > "$ROWS"

row() {  # config, rate, json file
  python3 - "$1" "$2" "$3" >> "$ROWS" <<'PY'
import json, sys
cfg, rate, path = sys.argv[1:4]
try:
    j = json.load(open(path))
except Exception:
    print(f"{cfg:<14} {rate:>8}  (no result: see the logs)"); sys.exit()
if rate == "offline":
    print(f"{cfg:<14} {rate:>8} {j['output_tokens_per_second']:>10.0f} {j['mean_ttft_ms']:>9.1f} {'':>9} {j['p99_ttft_ms']:>9.1f}"
          f" {j['mean_tpot_ms']:>9.2f} {'':>9} {j['p99_tpot_ms']:>9.2f} {'':>9} {'':>9} {j['failed']:>6}")
else:
    print(f"{cfg:<14} {rate:>8} {j['output_tokens_per_second']:>10.0f} {j['mean_ttft_ms']:>9.1f} {j['median_ttft_ms']:>9.1f}"
          f" {j['p99_ttft_ms']:>9.1f} {j['mean_tpot_ms']:>9.2f} {j['median_tpot_ms']:>9.2f} {j['p99_tpot_ms']:>9.2f}"
          f" {j['mean_itl_ms']:>9.2f} {j['p99_itl_ms']:>9.2f} {j['failed']:>6}")
PY
}

for cfg in $CONFIGS; do
  policy=${cfg%%:*}
  flags=(--kv-policy "$policy")
  if [ "$cfg" != "$policy" ]; then flags+=(--kv-budget "${cfg#*:}"); fi
  if [ "$policy" = full ]; then flags+=(--query-slots -1); fi
  tag=${cfg//:/-}
  "$BIN" serve "${ENGINE_FLAGS[@]}" "${flags[@]}" --port "$PORT" > "$OUT/serve-$tag.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do grep -q "serving" "$OUT/serve-$tag.log" 2>/dev/null && break; kill -0 $pid 2>/dev/null || break; sleep 0.5; done
  if ! grep -q "serving" "$OUT/serve-$tag.log"; then
    echo "bench_serve.sh: the server did not start ($cfg):" >&2; tail -5 "$OUT/serve-$tag.log" >&2
    kill $pid 2>/dev/null; continue
  fi
  # A short warm-up (CUDA graphs, allocator) so that the first rate is not charged for it.
  "$BIN" bench serve --base-url "http://127.0.0.1:$PORT" --num-prompts 8 --input-len "$INPUT_LEN" --output-len 16 --quiet --json > /dev/null 2>&1
  for rate in $RATES; do
    "$BIN" bench serve --base-url "http://127.0.0.1:$PORT" --num-prompts "$NUM_PROMPTS" --input-len "$INPUT_LEN" \
      --output-len "$OUTPUT_LEN" --request-rate "$rate" --max-concurrency "$MAX_CONCURRENCY" --quiet --json \
      > "$OUT/serve-$tag-rate-$rate.json" 2>> "$OUT/serve-$tag-client.log"
    row "$cfg" "$rate" "$OUT/serve-$tag-rate-$rate.json"
  done
  curl -s "http://127.0.0.1:$PORT/metrics" > "$OUT/serve-$tag-metrics.txt" 2>/dev/null
  kill -TERM $pid; wait $pid
  "$BIN" bench "${ENGINE_FLAGS[@]}" "${flags[@]}" --num-prompts "$NUM_PROMPTS" --input-len "$INPUT_LEN" \
    --output-len "$OUTPUT_LEN" --quiet --json > "$OUT/bench-$tag.json" 2> "$OUT/bench-$tag.log"
  row "$cfg" offline "$OUT/bench-$tag.json"
done

echo "origami bench serve: $NUM_PROMPTS x ($INPUT_LEN -> $OUTPUT_LEN), engine flags: ${ENGINE_FLAGS[*]}"
printf '%-14s %8s %10s %9s %9s %9s %9s %9s %9s %9s %9s %6s\n' config rate "out tok/s" "TTFT avg" "TTFT p50" "TTFT p99" \
  "TPOT avg" "TPOT p50" "TPOT p99" "ITL avg" "ITL p99" failed
cat "$ROWS"
echo "(ms; 'offline' = origami bench on the same prompts; logs and JSON in $OUT)"
