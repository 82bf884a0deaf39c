#!/usr/bin/env bash
# One-GPU check of the training path on a CUDA machine as it comes (its own torch, no flash-attn needed), in two
# parts ordered by value, for one 900 s lease (each part one device command of at most 600 s):
#   part 1 (at most 330 s, install and preflight included; twice in one lease with the machine's start): the
#           packed-attention exactness tests on CUDA (every kernel, bf16, head_dim 128 with 7:1 grouped-query
#           attention), then tokens/s, MFU and peak memory padded vs packed on a Qwen2-VL-2B-shaped model and on a
#           7B-shaped LoRA model (benchmarks/gpu_packing.py);
#   part 2 (what the lease has left, less a margin to rerun one run): post-training recipe runs, most valuable first:
#           tokenswap arm packed, configs/one_gpu/post_tokenswap.yaml (the README's one-GPU config), tokenswap arm
#           padded, text arm, tokenswap under DeepSpeed ZeRO-3, QLoRA (packed). A run that does not fit in the time
#           left is skipped and the report says so; the liger run is dropped, and says why.
#
#   bash benchmarks/gpu_check.sh --part 1 --wheels .whl --archive $OUT/part1.tar.gz     # on the GPU machine, then
#   bash benchmarks/gpu_check.sh --part 2 --wheels .whl --lease-left S --archive $OUT/part2.tar.gz
#     (S: the device tool's budget_left_s when part 2 starts; each archive is the part's whole report, one file)
#   bash benchmarks/gpu_check.sh --dry-run [--part 1|2]          # anywhere: the same steps on the CPU twin
#   STEPS=40 SCRATCH=/tmp/gpu_check PYTHON=python3 bash benchmarks/gpu_check.sh
#
# --only a,b: only these steps of the part (run names, exactness, gpu_packing_2b, gpu_packing_7b), to rerun one.
# --wheels DIR: install the wheels benchmarks/gpu_wheels.sh DIR built into this Python's own environment (pip
# --no-index --find-links, after pip's dry-run plan: exit 2, one line, if it would replace a package the image has),
# once: a later part on the same machine finds them installed (same wheels, same hashes) and reuses them, and its
# preflight checks only what the earlier part's did not. --report DIR: where the summary
# (summary.txt, rewritten after every step), the logs and the JSON figures go (a few MB; default $SCRATCH/report).
# --archive FILE: that folder as one .tar.gz, rewritten after every step and when the script ends, so a part
# stopped at any point still returns every figure it measured in one file. --lease-left S: the device seconds
# left when the part starts; the part keeps LEASE_RESERVE (60 s: the transfer back, the give-back) and
# RERUN_MARGIN (100 s: one run's timeout and a command's start, to rerun a failed run) and uses at most 540 s.
# Everything else (the model, the image store, checkpoints) stays in $SCRATCH under /tmp. --dry-run: the CPU twin
# of the GPU image (benchmarks/gpu_twin.sh: the image's packages at their versions, cached), the wheels
# gpu_wheels.sh builds for this machine's Python installed as above (into $SCRATCH/env, which sees the twin), then the
# same plan check, preflight, steps (one CPU step each, toy width), parsing and summary: what would fail on the
# GPU fails here first.
#
# The plan (benchmarks/gpu_report.py PLAN): every step's estimate on the H200 and its timeout, at least 1.5x the
# estimate; part 1's timeouts sum to at most 330 s. The script refuses to start (exit 2) when the plan, with any
# timeout set in the environment, breaks either rule, on the twin too. A step starts only when its timeout fits
# in what is left of PART_BUDGET (part 1: 330 s; part 2: from --lease-left, else 440 s), so a part never overruns
# its share of the lease. A part-1 step that does not fit fails the part (its figures are the point of the lease);
# a part-2 run that does not fit reads "skipped (lease: ...)" and the part still passes. Each part's preflight
# imports only what that part's steps import and checks those packages' requirements, prints every unmet one on a
# line of its own, and skips (does not fail) each step whose package is missing or unmet, saying so. Uses the
# torch that is installed (nothing here installs torch) and this checkout's tokenswap, first on PYTHONPATH. Exits
# non-zero if any step fails.
set -uo pipefail

cd "$(dirname "$0")/.."
REPO=$(pwd)
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3
DRY_RUN=0
WHEELS=""
PART=all
REPORT=""
ONLY=""
ARCHIVE=""
LEASE_LEFT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --wheels) WHEELS=${2:?--wheels needs a folder (made by benchmarks/gpu_wheels.sh)}; shift ;;
    --part) PART=${2:?--part needs 1, 2 or all}; shift ;;
    --report) REPORT=${2:?--report needs a folder}; shift ;;
    --only) ONLY=",${2:?--only needs step names, comma-separated},"; shift ;;
    --archive) ARCHIVE=${2:?--archive needs a file name ending in .tar.gz}; shift ;;
    --lease-left) LEASE_LEFT=${2:?--lease-left needs the device seconds left}; shift ;;
    -h|--help) sed -n '2,44p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (use --part 1|2, --wheels DIR, --report DIR, --archive FILE," \
         "--lease-left S, --dry-run)" >&2; exit 2 ;;
  esac
  shift
done
case "$PART" in 1|2|all) ;; *) echo "gpu_check: --part must be 1, 2 or all, got $PART" >&2; exit 2 ;; esac
case "$ARCHIVE" in ""|*.tar.gz) ;; *) echo "gpu_check: --archive must name a .tar.gz file, got $ARCHIVE" >&2; exit 2 ;; esac
case "$LEASE_LEFT" in ""|*[!0-9]*) [ -z "$LEASE_LEFT" ] || { echo "gpu_check: --lease-left must be whole seconds, got $LEASE_LEFT" >&2; exit 2; } ;; esac

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1
START=$SECONDS
if [ "$DRY_RUN" = 1 ]; then
  # A shared 2-core CPU is far slower than the GPU: the twin checks the steps, not the lease.
  DEFAULT_BUDGET=3000
  DEVICE=cpu
  STEPS=${STEPS:-2}
  PYTHON=$(bash benchmarks/gpu_twin.sh | tail -n 1) || { echo "gpu_check: building the CPU twin failed" >&2; exit 1; }
  if [ -z "$WHEELS" ]; then
    TWIN_PYVER=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    KEY=$(cat constraints.txt benchmarks/gpu_image.txt benchmarks/gpu_wheels.sh pyproject.toml | sha256sum | cut -c1-12)
    WHEELS=$HOME/.cache/tokenswap/gpu_twin_wheels-$TWIN_PYVER-$KEY
    if [ ! -f "$WHEELS/.complete" ]; then
      PYVER=$TWIN_PYVER bash benchmarks/gpu_wheels.sh "$WHEELS" | grep -v '^gpu_wheels: sha256 ' || { echo "gpu_check: gpu_wheels.sh failed" >&2; exit 1; }
      touch "$WHEELS/.complete"
    fi
  fi
  echo "gpu_check: dry run on the CPU twin ($PYTHON, wheels $WHEELS)"
else
  DEVICE=cuda
  STEPS=${STEPS:-20}
fi
# The plan's timeouts (T_<step>), the margins, and the GPU plan checked: a broken rule stops here, twin or GPU.
PLAN_SH=$("$PYTHON" benchmarks/gpu_report.py plan --device "$DEVICE")
plan_rc=$?
eval "$PLAN_SH"
[ "$plan_rc" = 0 ] || { echo "gpu_check: the plan in benchmarks/gpu_report.py breaks its rules (above); fix PLAN or the timeouts set" >&2; exit 2; }
if [ "$DRY_RUN" != 1 ]; then
  DEFAULT_BUDGET=$([ "$PART" = 1 ] && echo 330 || echo $(( 540 - RERUN_MARGIN )))
fi
if [ -n "$LEASE_LEFT" ]; then
  # What this part may use of the lease: the rest, less the transfer back, the give-back and a rerun's margin.
  FROM_LEASE=$(( LEASE_LEFT - LEASE_RESERVE - RERUN_MARGIN ))
  [ "$FROM_LEASE" -lt 0 ] && FROM_LEASE=0
  [ "$FROM_LEASE" -gt 540 ] && FROM_LEASE=540
  DEFAULT_BUDGET=$FROM_LEASE
  echo "gpu_check: --lease-left $LEASE_LEFT: this part uses at most $FROM_LEASE s, keeping $LEASE_RESERVE s for the" \
    "way back and $RERUN_MARGIN s to rerun one run"
fi
PART_BUDGET=${PART_BUDGET:-$DEFAULT_BUDGET}
SCRATCH=${SCRATCH:-/tmp/tokenswap_gpu_check}
REPORT=${REPORT:-$SCRATCH/report}
[ "$PART" = 1 ] || rm -rf "$SCRATCH/runs"
# The report folder is emptied of an earlier report's files, so it must be empty or one of ours.
if [ -d "$REPORT" ] && [ -n "$(ls -A "$REPORT")" ] && [ ! -f "$REPORT/.gpu_check_report" ]; then
  echo "gpu_check: --report $REPORT is not empty and holds no earlier report; name a new or empty folder" >&2
  exit 2
fi
mkdir -p "$SCRATCH/runs" "$REPORT"
REPORT=$(cd "$REPORT" && pwd)
rm -rf "$REPORT/runs" "$REPORT/results.jsonl" "$REPORT"/*.log "$REPORT"/*.json "$REPORT/summary.txt"
touch "$REPORT/.gpu_check_report"
: > "$REPORT/results.jsonl"
# The report as one file (the device tool brings back a few files only): rewritten after every step and at the end.
archive() {
  [ -n "$ARCHIVE" ] || return 0
  mkdir -p "$(dirname "$ARCHIVE")"
  tar czf "$ARCHIVE.partial" -C "$(dirname "$REPORT")" "$(basename "$REPORT")" && mv -f "$ARCHIVE.partial" "$ARCHIVE"
}
trap archive EXIT
# The carried wheels go into the image's own environment (pip from the folder, no index): what the image has stays,
# so the runs use its torch, transformers, accelerate and peft. The twin is cached and must stay as built, so on it
# a fresh environment in $SCRATCH/env sees the twin's packages through a .pth and takes the install instead.
STAMP_FILE="$SCRATCH/.gpu_check_wheels"
if [ -n "$WHEELS" ]; then
  ls "$WHEELS"/*.whl >/dev/null 2>&1 || { echo "gpu_check: no wheels in $WHEELS (run benchmarks/gpu_wheels.sh $WHEELS)" >&2; exit 2; }
  STAMP=$( (cd "$WHEELS" && sha256sum -- *.whl) | sha256sum | cut -c1-16)
  ENV_DIR="$SCRATCH/env"
  if [ -f "$STAMP_FILE" ] && [ "$(cat "$STAMP_FILE")" = "$STAMP" ]; then
    # An earlier part of this lease installed these very wheels: reinstalling would cost seconds of GPU time.
    echo "gpu_check: the wheels of $WHEELS are installed already (by an earlier part): not reinstalled"
  else
    rm -f "$STAMP_FILE" "$SCRATCH/preflight_checked.json"
    if [ "$DRY_RUN" = 1 ]; then
      rm -rf "$ENV_DIR"
      "$PYTHON" -m venv --without-pip "$ENV_DIR" || { echo "gpu_check: making $ENV_DIR failed" >&2; exit 1; }
      "$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > \
        "$("$ENV_DIR/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/gpu_twin.pth"
    fi
  fi
  [ "$DRY_RUN" = 1 ] && PYTHON="$ENV_DIR/bin/python"
  if [ ! -f "$STAMP_FILE" ]; then
    INSTALL_START=$SECONDS
    # pip's plan first: a carried wheel that would replace one of the image's packages stops the check here (2).
    # One pip cannot resolve (3: an image version no list gives, say) stops part 2, whose runs need the wheels;
    # part 1's steps need none of them, so it goes on without, and its preflight says what is missing.
    "$PYTHON" benchmarks/gpu_report.py install-plan --wheels "$WHEELS" --scratch "$SCRATCH"
    plan_rc=$?
    if [ "$plan_rc" = 3 ] && [ "$PART" = 1 ]; then
      echo "gpu_check: part 1 goes on without the carried wheels (its steps need none of them); part 2 would stop here" >&2
      : > "$SCRATCH/carried.txt"
    elif [ "$plan_rc" != 0 ]; then
      exit 2
    fi
    echo "gpu_check: installing the wheels of $WHEELS into $("$PYTHON" -c 'import sys; print(sys.prefix)')"
    left=$(( T_install - (SECONDS - INSTALL_START) )); [ "$left" -lt 1 ] && left=1
    mapfile -t REQS < "$SCRATCH/carried.txt"
    if [ "${#REQS[@]}" -gt 0 ]; then
      timeout "$left" "$PYTHON" -m pip install -q --disable-pip-version-check --no-index --find-links "$WHEELS" \
        --no-compile --no-cache-dir "${REQS[@]}" 2> >(grep -v "is ignored: it is neither" >&2) || {
        echo "gpu_check: installing the wheels of $WHEELS failed (or took over $T_install s with its plan)" >&2; exit 1; }
      echo "$STAMP" > "$STAMP_FILE"
    fi
  fi
fi
# This checkout first, then whatever the environment has.
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
REPORT_PY=("$PYTHON" benchmarks/gpu_report.py --report "$REPORT" --scratch "$SCRATCH" --device "$DEVICE")

if [ "$DEVICE" = cuda ] && ! "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_check: no CUDA device visible (CUDA_VISIBLE_DEVICES='${CUDA_VISIBLE_DEVICES-<unset>}');" \
    "run it on a GPU machine, or pass --dry-run to check everything on the CPU twin" >&2
  exit 2
fi

# ---------------------------------------------------------------------------- preflight: this part's packages only
case "$PART" in 1) PRE_TIMEOUT=$T_preflight ;; 2) PRE_TIMEOUT=$T_preflight_2 ;; *) PRE_TIMEOUT=$(( T_preflight + T_preflight_2 )) ;; esac
timeout "$PRE_TIMEOUT" "${REPORT_PY[@]}" preflight --part "$PART" ${WHEELS:+--carried "$SCRATCH/carried.txt"}
rc=$?
if [ "$rc" != 0 ]; then
  echo "gpu_check: preflight failed (exit $rc; 124: over its $PRE_TIMEOUT s): see above; $REPORT/summary.txt" >&2
  exit 2
fi
declare -A SKIP
while IFS=$'\t' read -r step reason; do [ -n "$step" ] && SKIP[$step]=$reason; done < "$SCRATCH/skips.txt"
# skipped NAME KIND: 0 (and the skip recorded, said) when the preflight skipped the step for a package or dropped it.
skipped() {
  [ -n "${SKIP[$1]:-}" ] || return 1
  "${REPORT_PY[@]}" skip "$1" "${SKIP[$1]}" --kind "$2" >/dev/null
  echo "gpu_check: $1 skipped: ${SKIP[$1]}"
  archive
}

# ---------------------------------------------------------------------------- what each part runs
# Recipe runs, most valuable first (part 2 runs them in this order while they fit):
# name | accelerate config + flags | base YAML | extra overrides
RUNS=(
  "tokenswap_packed|--config_file configs/accelerate/single_gpu.yaml|tiny/post_tokenswap.yaml|image_store=$SCRATCH/store collator.packing=true collator.pixel_dtype=bfloat16"
  # the README's one-GPU config as a user launches it, on the check's model, store and the tiny data (one micro-batch
  # a step: the run must fit its timeout)
  "one_gpu_tokenswap|--config_file configs/accelerate/single_gpu.yaml|one_gpu/post_tokenswap.yaml|image_store=$SCRATCH/store data.llava_json=tests/assets/llava_tiny.json data.llava_image_root=tests/assets/images data.swap_dataset=tests/assets/swap_tiny.jsonl train.gradient_accumulation_steps=1"
  "tokenswap|--config_file configs/accelerate/single_gpu.yaml|tiny/post_tokenswap.yaml|image_store=$SCRATCH/store"
  "text|--config_file configs/accelerate/single_gpu.yaml|tiny/post_text.yaml|"
  "tokenswap_zero3|--config_file configs/accelerate/zero3.yaml --num_processes 1|tiny/post_tokenswap.yaml|image_store=$SCRATCH/store train.deepspeed=configs/deepspeed/zero3.json"
  # QLoRA (bitsandbytes NF4), packed: its packed rows must reach the kernel the summary names
  "tokenswap_qlora|--config_file configs/accelerate/single_gpu.yaml|tiny/post_tokenswap.yaml|image_store=$SCRATCH/store model.load_in_4bit=true model.lora.r=16 collator.packing=true collator.pixel_dtype=bfloat16"
  # dropped (gpu_report.py DROPPED: no liger-kernel release patches Qwen2-VL under transformers 5.24); said, not run
  "tokenswap_liger|--config_file configs/accelerate/single_gpu.yaml|tiny/post_tokenswap.yaml|image_store=$SCRATCH/store train.use_liger_kernel=true"
)
if [ "$DEVICE" = cuda ]; then
  BENCHES=("gpu_packing_2b|--shape 2b --steps ${PACK_STEPS:-6}|$T_gpu_packing_2b"
           "gpu_packing_7b|--shape 7b --lora 16 --steps ${SEVEN_B_STEPS:-3}|$T_gpu_packing_7b")
else
  BENCHES=("gpu_packing_tiny|--shape tiny --device cpu --steps 1|$T_gpu_packing_2b")
fi
LOG_EVERY=$(( STEPS >= 20 ? 5 : 1 ))
CPU=$([ "$DEVICE" = cpu ] && echo true || echo false)
overrides() {  # $1 name, $2 extra overrides: what every run shares, so the arms differ only where they must
  echo "run.output_dir=$SCRATCH/runs/$1 model.name_or_path=$SCRATCH/model model.dtype=bfloat16" \
    "model.attn_implementation=auto train.bf16=true train.use_cpu=$CPU train.max_steps=$STEPS" \
    "train.logging_steps=$LOG_EVERY train.save_steps=100000 train.report_to=[none] wandb.mode=disabled gap_eval.bench=null $2"
}
in_part() { [ "$PART" = all ] || [ "$PART" = "$1" ]; }
wanted() { [ -z "$ONLY" ] || [[ "$ONLY" == *",$1,"* ]]; }  # --only: rerun some steps of a part

# fits NAME TIMEOUT KIND WHY: 0 when the step's timeout fits in what is left of the part, else records the skip.
fits() {
  local left=$(( PART_BUDGET - (SECONDS - START) ))
  if [ "$left" -lt "$2" ]; then
    "${REPORT_PY[@]}" skip "$1" "$4: ${left} s left of PART_BUDGET=$PART_BUDGET, the step may take ${2} s" \
      --kind "$3" >/dev/null
    echo "gpu_check: $1 skipped: ${left} s left of PART_BUDGET=$PART_BUDGET, it may take $2 s" >&2
    archive
    return 1
  fi
  STEP_START=$SECONDS
}
# report ARGS...: a gpu_report.py step that records a result, with the wall seconds of the step that made it.
report() { GPU_CHECK_STEP_S=$(( SECONDS - STEP_START )) "${REPORT_PY[@]}" "$@"; local rc=$?; archive; return "$rc"; }

status=0
if in_part 1; then
  # -------------------------------------------------------------------------- packed attention exactness
  TEST_TIMEOUT=$T_exactness
  if ! wanted exactness || skipped exactness exactness; then
    :
  elif fits "exactness" "$TEST_TIMEOUT" exactness "part budget"; then
    echo "gpu_check: packed rows equal their samples on $DEVICE, every kernel, bf16, head_dim 128 + GQA 7:1"
    timeout -k 10 "$TEST_TIMEOUT" "$PYTHON" -m pytest -v -p no:cacheprovider -m gpu -rs \
      --junitxml "$SCRATCH/packing_test.xml" tests/tokenswap/test_packing.py > "$SCRATCH/packing_test.log" 2>&1
    rc=$?
    [ "$rc" != 0 ] && tail -n 30 "$SCRATCH/packing_test.log" >&2
    report tests "$rc" || status=1
  else
    status=1
  fi
  # -------------------------------------------------------------------------- tokens/s, MFU, peak memory
  for b in "${BENCHES[@]}"; do
    IFS='|' read -r name bargs btimeout <<< "$b"
    wanted "$name" || continue
    skipped "$name" bench && continue
    fits "$name" "$btimeout" bench "part budget" || { status=1; continue; }
    echo "gpu_check: benchmarks/gpu_packing.py $bargs"
    # shellcheck disable=SC2086
    timeout -k 10 "$btimeout" "$PYTHON" benchmarks/gpu_packing.py $bargs --out "$SCRATCH/$name.json" \
      > "$SCRATCH/$name.log" 2>&1
    rc=$?
    [ "$rc" != 0 ] && tail -n 30 "$SCRATCH/$name.log" >&2
    report bench "$name" "$rc" || status=1
  done
fi

if in_part 2; then
  # Every run's YAML + overrides against PostTrainConfig first, in one process (cheap; catches typos before GPU time).
  SPECS=()
  for spec in "${RUNS[@]}"; do
    IFS='|' read -r name _ yaml extra <<< "$spec"
    [ -n "${SKIP[$name]:-}" ] && continue
    SPECS+=("$name" "$yaml" "$(overrides "$name" "$extra")")
  done
  if [ "${#SPECS[@]}" -gt 0 ]; then
    timeout "$T_configs" "$PYTHON" - "${SPECS[@]}" <<'PY' || { echo "gpu_check: a run's config is invalid" >&2; exit 1; }
import importlib.util, sys
spec = importlib.util.spec_from_file_location("post_train", "recipes/post_train.py")
module = importlib.util.module_from_spec(spec)
sys.modules["post_train"] = module  # dataclasses resolve annotations through sys.modules
spec.loader.exec_module(module)
from tokenswap.config import load_config
args = sys.argv[1:]
for name, yaml, overrides in zip(args[::3], args[1::3], args[2::3]):
    load_config(module.PostTrainConfig, yaml, overrides.split())
print(f"gpu_check: configs and overrides of {len(args) // 3} runs are valid")
PY
    STEP_START=$SECONDS
    timeout "$T_assets" "${REPORT_PY[@]}" assets > "$SCRATCH/assets.log" 2>&1 || { cat "$SCRATCH/assets.log" >&2; status=1; }
    grep '^gpu_check: model' "$SCRATCH/assets.log"
    [ -f "$SCRATCH/model/config.json" ] || { echo "gpu_check: building the model/store failed" >&2; exit 1; }
    archive
  fi

  RUN_TIMEOUT=$T_run
  for spec in "${RUNS[@]}"; do
    IFS='|' read -r name launch yaml extra <<< "$spec"
    wanted "$name" || continue
    skipped "$name" run && continue
    # What does not fit in the lease is skipped and said; the part still passes (its runs are the lesser value).
    fits "$name" "$RUN_TIMEOUT" run lease || continue
    log="$SCRATCH/runs/$name.log"
    smi_pid=""
    if [ "$DEVICE" = cuda ]; then
      nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$SCRATCH/runs/$name.smi" 2>/dev/null &
      smi_pid=$!
    fi
    echo "gpu_check: run $name (log: $log)"
    # shellcheck disable=SC2086
    PEAK_MEMORY_JSON="$SCRATCH/runs/$name.mem.json" timeout -k 10 "$RUN_TIMEOUT" "$PYTHON" -m accelerate.commands.launch \
      $launch benchmarks/peak_memory.py recipes/post_train.py --config "$yaml" $(overrides "$name" "$extra") > "$log" 2>&1
    rc=$?
    [ -n "$smi_pid" ] && { kill "$smi_pid" 2>/dev/null; wait "$smi_pid" 2>/dev/null; }
    [ "$rc" != 0 ] && { echo "gpu_check: run $name FAILED (exit $rc); last lines of $log:" >&2; tail -n 30 "$log" >&2; }
    report run "$name" "$rc" || status=1
  done
fi

echo "gpu_check: part $PART took $(( SECONDS - START )) s; summary: $REPORT/summary.txt"
if [ "$status" = 0 ]; then
  [ "$DRY_RUN" = 1 ] && echo "gpu_check: dry run passed" || echo "gpu_check: all steps passed ($STEPS steps a run)"
fi
exit "$status"
