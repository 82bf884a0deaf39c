#!/usr/bin/env bash
# One-GPU check of the training path on a CUDA machine as it comes (its own torch, no flash-attn needed):
# post-training runs (text arm, tokenswap arm padded and packed, tokenswap under DeepSpeed ZeRO-3, QLoRA, Liger),
# the packed-attention exactness tests on CUDA (every kernel, bf16), and tokens/s per GPU, MFU and peak memory,
# padded vs packed, on a Qwen2-VL-2B-shaped model plus one 7B-shaped LoRA step. Ends with one summary table.
#
#   bash benchmarks/gpu_check.sh                    # on a machine with one CUDA GPU (about 5-8 minutes)
#   bash benchmarks/gpu_check.sh --wheels DIR       # first install the wheels benchmarks/gpu_wheels.sh DIR fetched
#   bash benchmarks/gpu_check.sh --dry-run          # anywhere: check the packages, the configs and overrides,
#                                                   # print the commands, run nothing
#   STEPS=40 OUT=/tmp/gpu_check PYTHON=python3 bash benchmarks/gpu_check.sh
#
# Uses the torch that is installed (nothing here pins or installs torch) and this checkout's tokenswap (put first
# on PYTHONPATH, not installed). A bare CUDA image usually lacks trl, datasets, deepspeed, peft, bitsandbytes,
# liger-kernel or our transformers release: benchmarks/gpu_wheels.sh DIR downloads them on a machine with package
# access, and --wheels DIR installs them into a private folder ($OUT/site) first. Runs whose optional package
# cannot load (bitsandbytes: qlora, liger-kernel: liger) are reported as skipped with the reason, not as failures.
# Builds a small real-architecture Qwen2-VL (hidden 1024, 8 layers, random weights) and the tiny drawn-shapes
# image store into $OUT; each run is recipes/post_train.py under `accelerate launch` for $STEPS steps in bf16 with
# model.attn_implementation=auto; samples/s from log_history.json (warm-up included), peak memory from torch's
# max_memory_allocated (benchmarks/peak_memory.py) and nvidia-smi sampled every 200 ms. Exits non-zero if any
# step fails.
set -uo pipefail

cd "$(dirname "$0")/.."
REPO=$(pwd)
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3
OUT=${OUT:-/tmp/tokenswap_gpu_check}
STEPS=${STEPS:-20}
DRY_RUN=0
WHEELS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --wheels) WHEELS=${2:?--wheels needs a folder (made by benchmarks/gpu_wheels.sh)}; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (use --dry-run, --wheels DIR, or env STEPS/OUT/PYTHON)" >&2; exit 2 ;;
  esac
  shift
done

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1
SITE="$OUT/site"
if [ -n "$WHEELS" ]; then
  ls "$WHEELS"/*.whl >/dev/null 2>&1 || { echo "gpu_check: no wheels in $WHEELS (run benchmarks/gpu_wheels.sh $WHEELS)" >&2; exit 2; }
  if [ "$DRY_RUN" = 1 ]; then
    echo "gpu_check: would install $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS into $SITE"
  else
    mkdir -p "$SITE"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "$WHEELS"/*.whl || { echo "gpu_check: installing the wheels of $WHEELS failed" >&2; exit 1; }
  fi
fi
# This checkout first, then the private wheels, then whatever the machine has.
export PYTHONPATH="$REPO${WHEELS:+:$SITE}${PYTHONPATH:+:$PYTHONPATH}"

# ---------------------------------------------------------------------------- packages
# Required: the recipes cannot run without them. Optional: one run each, skipped with the reason.
mkdir -p "$OUT"
"$PYTHON" - <<'PY' > "$OUT/packages.txt" 2>&1
import importlib
required = ["torch", "transformers", "accelerate", "peft", "datasets", "trl", "deepspeed", "PIL", "yaml", "tokenswap"]
optional = {"bitsandbytes": "tokenswap_qlora", "liger_kernel": "tokenswap_liger"}
missing = []
for name in required + list(optional):
    try:
        module = importlib.import_module(name)
        print(f"ok {name} {getattr(module, '__version__', '')}")
    except Exception as e:  # a broken install fails differently from a missing one; both stop that run
        reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        print(f"{'skip ' + optional[name] if name in optional else 'missing'} {name} {reason}")
PY
grep -E '^(missing|skip) ' "$OUT/packages.txt" | sed 's/^/gpu_check: /'
if grep -q '^missing ' "$OUT/packages.txt"; then
  echo "gpu_check: required packages are missing: on a machine with package access run" \
    "'bash benchmarks/gpu_wheels.sh DIR', copy DIR here and pass --wheels DIR" >&2
  [ "$DRY_RUN" = 1 ] || exit 2
fi
declare -A SKIP
while read -r _ run _ reason; do SKIP[$run]=$reason; done < <(grep '^skip ' "$OUT/packages.txt")

# ---------------------------------------------------------------------------- guard
if [ "$DRY_RUN" = 0 ]; then
  if ! "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_check: no CUDA device visible (CUDA_VISIBLE_DEVICES='${CUDA_VISIBLE_DEVICES-<unset>}');" \
      "run it on a GPU machine, or pass --dry-run to only validate the commands" >&2
    exit 2
  fi
  "$PYTHON" -c "import torch; from tokenswap.attention import packed_attention_choice as c; \
print('gpu_check:', torch.cuda.get_device_name(0), '| torch', torch.__version__, '| packed attention:', *c('auto', 'cuda'))"
fi

# ---------------------------------------------------------------------------- runs
# name | accelerate config + flags | base YAML | extra overrides
RUNS=(
  "text|--config_file configs/accelerate/single_gpu.yaml|tiny/post_text.yaml|"
  "tokenswap|--config_file configs/accelerate/single_gpu.yaml|tiny/post_tokenswap.yaml|image_store=$OUT/store"
  "tokenswap_packed|--config_file configs/accelerate/single_gpu.yaml|tiny/post_tokenswap.yaml|image_store=$OUT/store collator.packing=true collator.pixel_dtype=bfloat16"
  "tokenswap_zero3|--config_file configs/accelerate/zero3.yaml --num_processes 1|tiny/post_tokenswap.yaml|image_store=$OUT/store train.deepspeed=configs/deepspeed/zero3.json"
  # QLoRA (bitsandbytes NF4 on CUDA) and liger-kernel: the gpu extra (pip install -e '.[gpu]') or gpu_wheels.sh
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

PACKING_TEST=("$PYTHON" -m pytest -q -p no:cacheprovider -m gpu tests/tokenswap/test_packing.py)
PACKING_BENCH=("$PYTHON" benchmarks/gpu_packing.py --shape 2b --steps "${PACK_STEPS:-12}" --out "$OUT/gpu_packing.json")
SEVEN_B=("$PYTHON" benchmarks/gpu_packing.py --shape 7b --lora 16 --arms packed --steps "${SEVEN_B_STEPS:-4}"
         --out "$OUT/gpu_7b.json")

if [ "$DRY_RUN" = 1 ]; then
  for spec in "${RUNS[@]}"; do
    IFS='|' read -r name launch yaml extra <<< "$spec"
    echo "PEAK_MEMORY_JSON=$OUT/runs/$name.mem.json accelerate launch $launch benchmarks/peak_memory.py" \
      "recipes/post_train.py --config $yaml $(overrides "$name" "$extra")"
  done
  echo "${PACKING_TEST[*]}"
  echo "${PACKING_BENCH[*]}"
  echo "${SEVEN_B[*]}"
  for run in "${!SKIP[@]}"; do echo "gpu_check: $run would be skipped: ${SKIP[$run]}"; done
  echo "gpu_check: dry run passed"
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
  if [ -n "${SKIP[$name]:-}" ]; then
    RESULT[$name]="skipped (${SKIP[$name]})"
    echo "gpu_check: run $name skipped: ${SKIP[$name]}"
    continue
  fi
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

# ---------------------------------------------------------------------------- packed attention on CUDA + MFU
echo "gpu_check: packed rows equal their samples, every CUDA kernel, bf16: ${PACKING_TEST[*]}"
"${PACKING_TEST[@]}" > "$OUT/packing_test.log" 2>&1
rc=$?
PACKING_RESULT=$(grep -E '[0-9]+ (passed|failed)' "$OUT/packing_test.log" | tail -n 1)
if [ "$rc" != 0 ]; then
  echo "gpu_check: packing exactness on CUDA FAILED; last lines of $OUT/packing_test.log:" >&2
  tail -n 40 "$OUT/packing_test.log" >&2
  status=1
fi
for bench in PACKING_BENCH SEVEN_B; do
  declare -n cmd=$bench
  echo "gpu_check: ${cmd[*]}"
  timeout 900 "${cmd[@]}" > "$OUT/$bench.log" 2>&1 || { echo "gpu_check: ${cmd[*]} FAILED" >&2; tail -n 30 "$OUT/$bench.log" >&2; status=1; }
  unset -n cmd
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
echo "packing exactness (CUDA, bf16): ${PACKING_RESULT:-no result}"
for bench in PACKING_BENCH SEVEN_B; do grep -E '^(gpu_packing:|arm |padded|packed)' "$OUT/$bench.log" 2>/dev/null; done

[ "$status" = 0 ] && echo "gpu_check: all runs passed ($STEPS steps each, outputs in $OUT)"
exit "$status"
