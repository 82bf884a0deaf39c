#!/usr/bin/env bash
# One-GPU smoke benchmark of post-training: text arm, tokenswap arm (padded and packed), tokenswap under DeepSpeed
# ZeRO-3, QLoRA (bitsandbytes NF4) and liger-kernel; packing equivalence under flash-attention 2; tokens/s per GPU and MFU, padded vs packed, 2B-shaped model.
#
#   bash benchmarks/gpu_check.sh                 # on a machine with one CUDA GPU (a few minutes)
#   bash benchmarks/gpu_check.sh --dry-run       # anywhere: validate the configs + overrides, print the commands
#   STEPS=40 OUT=/tmp/gpu_check PYTHON=.venv/bin/python bash benchmarks/gpu_check.sh
#
# Builds a small real-architecture Qwen2-VL (hidden 1024, 8 layers, random weights, tokenizer trained on
# the test assets) and the tiny drawn-shapes image store into $OUT, then runs recipes/post_train.py under
# `accelerate launch` for $STEPS steps in bf16 with attn_implementation=auto (flash-attention 2 when
# installed), on tests/assets/{llava_tiny.json,swap_tiny.jsonl}. Prints samples/s (log_history.json
# `train_samples_per_second`, which includes the first steps' warm-up) and peak memory: torch's
# max_memory_allocated of rank 0 (benchmarks/peak_memory.py wraps the recipe) and the device-wide
# maximum of `nvidia-smi --query-gpu=memory.used` sampled every 200 ms.
# Then (PACK, issue 11): tests/tokenswap/test_packing.py -m gpu (packed batch == samples one at a time with
# flash_attention_2 in bf16, every packable family) and benchmarks/gpu_packing.py (a Qwen2-VL-2B-shaped model
# from config, bf16 + flash-attn 2: non-pad tokens/s per GPU, images/s, padding, TFLOP/s and MFU, padded vs packed
# batches of the long-tailed benchmark data). Exits non-zero if any step fails.
set -uo pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python
OUT=${OUT:-/tmp/tokenswap_gpu_check}
STEPS=${STEPS:-20}
DRY_RUN=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $arg (use --dry-run or env STEPS/OUT/PYTHON)" >&2; exit 2 ;;
  esac
done

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false

# ---------------------------------------------------------------------------- guard
if [ "$DRY_RUN" = 0 ]; then
  if ! "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_check: no CUDA device visible (CUDA_VISIBLE_DEVICES='${CUDA_VISIBLE_DEVICES-<unset>}');" \
      "run it on a GPU machine, or pass --dry-run to only validate the commands" >&2
    exit 2
  fi
  "$PYTHON" -c "import importlib.util as u, torch; print('gpu_check:', torch.cuda.get_device_name(0), '| torch', \
torch.__version__, '| flash_attn', 'installed' if u.find_spec('flash_attn') else 'absent (sdpa)')"
fi

# ---------------------------------------------------------------------------- runs
# name | accelerate config + flags | base YAML | extra overrides
RUNS=(
  "text|--config_file configs/accelerate/single_gpu.yaml|tiny/post_text.yaml|"
  "tokenswap|--config_file configs/accelerate/single_gpu.yaml|tiny/post_tokenswap.yaml|image_store=$OUT/store"
  "tokenswap_packed|--config_file configs/accelerate/single_gpu.yaml|tiny/post_tokenswap.yaml|image_store=$OUT/store collator.packing=true collator.pixel_dtype=bfloat16"
  "tokenswap_zero3|--config_file configs/accelerate/zero3.yaml --num_processes 1|tiny/post_tokenswap.yaml|image_store=$OUT/store train.deepspeed=configs/deepspeed/zero3.json"
  # QLoRA (bitsandbytes NF4 on CUDA) and liger-kernel: both from the gpu extra (pip install -e '.[gpu]')
  "tokenswap_qlora|--config_file configs/accelerate/single_gpu.yaml|tiny/post_tokenswap.yaml|image_store=$OUT/store model.load_in_4bit=true model.lora.r=16"
  "tokenswap_liger|--config_file configs/accelerate/single_gpu.yaml|tiny/post_tokenswap.yaml|image_store=$OUT/store train.use_liger_kernel=true"
)

overrides() {  # $1 name, $2 extra overrides: what every run shares, so the arms differ only where they must
  echo "run.output_dir=$OUT/runs/$1 model.name_or_path=$OUT/model model.dtype=bfloat16" \
    "model.attn_implementation=auto train.bf16=true train.use_cpu=false train.max_steps=$STEPS" \
    "train.logging_steps=5 train.save_steps=100000 train.report_to=[none] wandb.mode=disabled $2"
}

# Validate every run's YAML + overrides against PostTrainConfig first (cheap; catches typos before GPU time).
for spec in "${RUNS[@]}"; do
  IFS='|' read -r name _ yaml extra <<< "$spec"
  # shellcheck disable=SC2046
  "$PYTHON" - "$yaml" $(overrides "$name" "$extra") <<'PY' || { echo "gpu_check: config of run $name is invalid" >&2; exit 1; }
import importlib.util, sys
spec = importlib.util.spec_from_file_location("post_train", "recipes/post_train.py")
module = importlib.util.module_from_spec(spec)
sys.modules["post_train"] = module  # dataclasses resolve annotations through sys.modules
spec.loader.exec_module(module)
from tokenswap.config import load_config
load_config(module.PostTrainConfig, sys.argv[1], sys.argv[2:])
PY
done
echo "gpu_check: configs and overrides of ${#RUNS[@]} runs are valid"

PACKING_TEST=("$PYTHON" -m pytest -q -m gpu tests/tokenswap/test_packing.py)
PACKING_BENCH=("$PYTHON" benchmarks/gpu_packing.py --steps "${PACK_STEPS:-12}" --out "$OUT/gpu_packing.json")

if [ "$DRY_RUN" = 1 ]; then
  for spec in "${RUNS[@]}"; do
    IFS='|' read -r name launch yaml extra <<< "$spec"
    echo "PEAK_MEMORY_JSON=$OUT/runs/$name.mem.json accelerate launch $launch benchmarks/peak_memory.py" \
      "recipes/post_train.py --config $yaml $(overrides "$name" "$extra")"
  done
  echo "${PACKING_TEST[*]}"
  echo "${PACKING_BENCH[*]}"
  exit 0
fi

# ---------------------------------------------------------------------------- assets
mkdir -p "$OUT/runs"
"$PYTHON" - "$OUT" <<'PY' || { echo "gpu_check: building the model/store failed" >&2; exit 1; }
import json, sys
from pathlib import Path
from tokenswap.testing import build_tiny_qwen2vl, build_tiny_store
out = Path(sys.argv[1])
assets = Path("tests/assets")
corpus = [m["content"] for line in (assets / "swap_tiny.jsonl").read_text().splitlines() for m in json.loads(line)["messages"]]
corpus += [t["value"] for r in json.loads((assets / "llava_tiny.json").read_text()) for t in r["conversations"]]
# Real Qwen2-VL architecture at ~75M language-model parameters: big enough that attention kernels,
# bf16 and ZeRO-3 partitioning do real work, small enough to build in seconds.
print(build_tiny_qwen2vl(out / "model", corpus=corpus, vocab_size=2048, hidden_size=1024, num_layers=8))
print(build_tiny_store(out / "store").root)
PY

status=0
declare -A RESULT
for spec in "${RUNS[@]}"; do
  IFS='|' read -r name launch yaml extra <<< "$spec"
  rm -rf "$OUT/runs/$name" "$OUT/runs/$name.mem.json"
  log="$OUT/runs/$name.log"
  smi="$OUT/runs/$name.smi"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$smi" 2>/dev/null &
  smi_pid=$!
  echo "gpu_check: run $name (log: $log)"
  # shellcheck disable=SC2086
  PEAK_MEMORY_JSON="$OUT/runs/$name.mem.json" timeout 1200 "$PYTHON" -m accelerate.commands.launch $launch \
    benchmarks/peak_memory.py recipes/post_train.py --config "$yaml" $(overrides "$name" "$extra") > "$log" 2>&1
  rc=$?
  kill "$smi_pid" 2>/dev/null; wait "$smi_pid" 2>/dev/null
  if [ "$rc" != 0 ]; then
    echo "gpu_check: run $name FAILED (exit $rc); last lines of $log:" >&2
    tail -n 30 "$log" >&2
    RESULT[$name]="FAILED (exit $rc)"
    status=1
    continue
  fi
  RESULT[$name]=$("$PYTHON" - "$OUT/runs/$name" "$OUT/runs/$name.mem.json" "$smi" <<'PY'
import json, sys
history = json.load(open(f"{sys.argv[1]}/log_history.json"))
summary = [h for h in history if "train_samples_per_second" in h][-1]
losses = [h["loss"] for h in history if "loss" in h]
mem = json.load(open(sys.argv[2]))
smi = [int(x) for x in open(sys.argv[3]).read().split() if x.strip().isdigit()]
print(f"{summary['train_samples_per_second']:.2f}|{mem['max_memory_allocated_gib']:.2f}|"
      f"{(max(smi) / 1024 if smi else float('nan')):.2f}|{losses[0]:.3f} -> {losses[-1]:.3f}")
PY
  ) || { RESULT[$name]="FAILED (no log_history/peak memory)"; status=1; }
done

# ---------------------------------------------------------------------------- summary
printf '\n%-18s %12s %16s %18s %20s\n' run samples/s "peak alloc GiB" "nvidia-smi GiB" "loss first -> last"
for spec in "${RUNS[@]}"; do
  IFS='|' read -r name _ <<< "$spec"
  IFS='|' read -r sps alloc smi loss <<< "${RESULT[$name]}"
  if [ -z "${alloc:-}" ]; then
    printf '%-18s %s\n' "$name" "${RESULT[$name]}"
  else
    printf '%-18s %12s %16s %18s %20s\n' "$name" "$sps" "$alloc" "$smi" "$loss"
  fi
done

# ---------------------------------------------------------------------------- packing (flash-attention 2) + MFU
echo "gpu_check: packing equivalence with flash_attention_2: ${PACKING_TEST[*]}"
"${PACKING_TEST[@]}" || { echo "gpu_check: packing equivalence under flash_attention_2 FAILED" >&2; status=1; }
echo "gpu_check: tokens/s per GPU and MFU, padded vs packed: ${PACKING_BENCH[*]}"
timeout 1200 "${PACKING_BENCH[@]}" || { echo "gpu_check: benchmarks/gpu_packing.py FAILED" >&2; status=1; }
for spec in "${RUNS[@]}"; do  # the recipe's own perf/* log lines (ThroughputCallback), last logging step
  IFS='|' read -r name _ <<< "$spec"
  [ -f "$OUT/runs/$name/log_history.json" ] && "$PYTHON" - "$OUT/runs/$name/log_history.json" "$name" <<'PY'
import json, sys
perf = [h for h in json.load(open(sys.argv[1])) if "perf/tokens_per_s" in h]
if perf:
    h = perf[-1]
    mfu = f"{100 * h['perf/mfu']:.1f}%" if "perf/mfu" in h else "n/a"
    print(f"{sys.argv[2]:<18} perf: {h['perf/tokens_per_s']:.0f} tokens/s, padding {100 * h['perf/padding']:.1f}%, "
          f"{h.get('perf/tflops', float('nan')):.1f} TFLOP/s, MFU {mfu} (last logging step)")
PY
done

[ "$status" = 0 ] && echo "gpu_check: all runs passed ($STEPS steps each, outputs in $OUT/runs)"
exit "$status"
