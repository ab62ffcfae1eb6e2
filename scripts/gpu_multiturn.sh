#!/usr/bin/env bash
# Multi-turn serving on the GPU machine (issue: conversations that continue on their compressed
# KV): one `origami serve` per mode on the same workload, `origami bench serve --multiturn`
# against it, and a table of TTFT per turn, output tok/s and retained-context hits last.
#   MT_MODES   space-separated modes, each  name:serve-flags  (flags comma-separated), default:
#              recompute      no prefix caching, no retained contexts: every turn prefills it all
#              prefix         --enable-prefix-caching (full KV, block hashes: vLLM's way)
#              retained       retained contexts, full KV (prefix caching over whole conversations)
#              retained_zip   retained contexts compressed by Fast KVzip's global threshold
#   MT_CONFIG (qwen3-8b), MT_CONVERSATIONS (128), MT_TURNS (4), MT_DOC_LEN (4096),
#   MT_QUESTION_LEN (32), MT_OUTPUT_LEN (64), MT_THINK (0.5 s), MT_CONCURRENCY (conversations),
#   MT_DOCS (number of distinct documents, default = conversations), MT_TIMEOUT (per mode, 240 s),
#   MT_KV_DTYPE (bf16), MT_BUDGET (Fast KVzip budget, 1024); MT_MODEL (a real model instead of the
#   config's dummy weights), MT_DEVICE (cuda), MT_NO_BUILD=1 (use $BUILD as it is)
# Dummy weights; the answers' exact ids continue the conversation (`--answer-ids returned` when the
# client has it), so turn t >= 2 can continue turn t-1's retained context.
set -uo pipefail
source "$(dirname "$0")/lib/gpu_common.sh"
gpu_script_init /tmp/origami-gpu
if [ "${MT_NO_BUILD:-0}" != 1 ]; then  # MT_NO_BUILD=1 BUILD=build MT_DEVICE=cpu: a CPU smoke run
  gpu_device_info "$OUT/build.log"
  gpu_build "$BUILD" "$OUT/build.log" origami_cli || exit 1
  echo "build rc=$GPU_BUILD_RC (${GPU_BUILD_SECONDS}s) on $GPU_DEVICE"
fi
TOK=${MT_TOKENIZER:-$SH/models/origami-tiny-qwen3}  # any tokenizer: the workload is token ids
CFG=${MT_CONFIG:-qwen3-8b}
MODEL=${MT_MODEL:-$SH/configs/$CFG}
WEIGHTS=(--dummy-weights); [ -n "${MT_MODEL:-}" ] && WEIGHTS=()
N=${MT_CONVERSATIONS:-128}
BUDGET=${MT_BUDGET:-1024}
MODES=${MT_MODES:-"recompute:--no-retain-contexts prefix:--no-retain-contexts,--enable-prefix-caching retained: \
retained_zip:--kv-policy,fastkvzip,--kv-budget,$BUDGET,--kv-gates,random,--block-size,256"}
answer_ids=()
"$BUILD/origami" bench serve --help 2>/dev/null | grep -q -- --answer-ids && answer_ids=(--answer-ids returned)
PORT=${MT_PORT:-18231}
rows=()
for mode in $MODES; do
  name=${mode%%:*}
  IFS=, read -r -a flags <<< "${mode#*:}"
  "$BUILD/origami" serve --model "$MODEL" "${WEIGHTS[@]}" --tokenizer "$TOK" --device "${MT_DEVICE:-cuda}" \
    --host 127.0.0.1 --port "$PORT" --kv-cache-dtype "${MT_KV_DTYPE:-bf16}" "${flags[@]}" > "$OUT/serve_$name.log" 2>&1 &
  server=$!
  up=0
  for _ in $(seq 1 180); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null \
      && { up=1; break; }
    kill -0 $server 2>/dev/null || break
    sleep 1
  done
  if [ $up = 1 ]; then
    t0=$(date +%s)
    timeout "${MT_TIMEOUT:-240}" "$BUILD/origami" bench serve --base-url "http://127.0.0.1:$PORT" --multiturn \
      --conversations "$N" --turns "${MT_TURNS:-4}" --doc-len "${MT_DOC_LEN:-4096}" \
      --question-len "${MT_QUESTION_LEN:-32}" --output-len "${MT_OUTPUT_LEN:-64}" --think-time "${MT_THINK:-0.5}" \
      --num-documents "${MT_DOCS:-$N}" --max-concurrency "${MT_CONCURRENCY:-$N}" "${answer_ids[@]}" --json \
      > "$OUT/mt_$name.json" 2> "$OUT/mt_$name.err"
    echo "$name: rc=$? ($(( $(date +%s) - t0 )) s)"
  else
    echo "$name: the server did not come up"; tail -5 "$OUT/serve_$name.log"
  fi
  kill $server 2>/dev/null; wait $server 2>/dev/null
  rows+=("$(python3 - "$OUT/mt_$name.json" "$name" "${mode#*:}" <<'PY'
import json, sys
f, name, flags = sys.argv[1:]
try:
    j = json.load(open(f))
except Exception:
    print(f"| {name} | `{flags}` | failed | | | | |"); sys.exit()
turns = " / ".join(f"{t['mean_ttft_ms']:.0f}" for t in j["per_turn"])
p99 = " / ".join(f"{t['p99_ttft_ms']:.0f}" for t in j["per_turn"])
m = {k.split(":")[-1]: v for k, v in j.get("server_metrics", {}).items()}
hits = m.get("retained_hits_total", 0)
hit_tok = m.get("retained_hit_tokens_total", 0)
prefix = m.get("prefix_cache_hits_total", 0)
print(f"| {name} | `{flags.replace(',', ' ')}` | {turns} | {p99} | {j['output_tokens_per_second']:,.0f} | "
      f"{j['completed']} / {j['failed']} | {hits:.0f} ({hit_tok:,.0f} tok) | {prefix:,.0f} |")
PY
)")
done
echo
echo "${MT_MODEL:-$CFG}, $N conversations x ${MT_TURNS:-4} turns, documents ${MT_DOC_LEN:-4096} tokens, questions ${MT_QUESTION_LEN:-32}, answers ${MT_OUTPUT_LEN:-64}, think ${MT_THINK:-0.5} s, KV ${MT_KV_DTYPE:-bf16}"
echo "| mode | serve flags | TTFT mean per turn (ms) | TTFT p99 per turn (ms) | output tok/s | turns done / failed | retained hits | prefix-cache hits |"
echo "|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
