#!/usr/bin/env bash
# Download, on a machine with package access, the wheels a bare CUDA image lacks, for
# `bash benchmarks/gpu_check.sh --wheels DIR` on the GPU machine (which may reach no package index).
#
#   bash benchmarks/gpu_wheels.sh DIR               # Python 3.12, manylinux x86_64 (the usual CUDA image)
#   PYVER=3.11 bash benchmarks/gpu_wheels.sh DIR    # another Python on the GPU machine
#
# Versions: the ones this checkout's test suite runs against (read from .venv, made by `make setup`), so the GPU
# runs the code that was tested. No torch, CUDA or numpy wheels: the GPU machine's own stay. What it fetches:
# transformers (with tokenizers, huggingface_hub, safetensors), accelerate, peft, trl, datasets (with dill and
# multiprocess), deepspeed built here as a pure-Python wheel (DS_BUILD_OPS=0: its ops JIT-compile on the GPU
# machine when used; ZeRO-3 needs none), pydantic (deepspeed's config), liger-kernel, and bitsandbytes cut down to
# its CUDA 13 library (the full wheel carries every CUDA version's library, most of its size).
set -euo pipefail

DIR=${1:?usage: bash benchmarks/gpu_wheels.sh DIR}
cd "$(dirname "$0")/.."
VENV_PY=${VENV_PY:-.venv/bin/python}
[ -x "$VENV_PY" ] || { echo "gpu_wheels: $VENV_PY not found; run 'make setup' first (the versions come from it)" >&2; exit 2; }
PYVER=${PYVER:-3.12}
mkdir -p "$DIR"

version() { "$VENV_PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1" 2>/dev/null; }
PACKAGES=(transformers tokenizers huggingface_hub safetensors accelerate peft trl datasets dill multiprocess
          pydantic pydantic_core annotated_types typing_inspection hjson bitsandbytes)
SPECS=()
for p in "${PACKAGES[@]}"; do SPECS+=("$p==$(version "$p")"); done
# Not in the CPU test environment (GPU-only): the gpu extra's range in pyproject.toml.
SPECS+=("liger-kernel>=0.8.5,<0.9")

PLATFORMS=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
           manylinux2014_x86_64 manylinux1_x86_64; do PLATFORMS+=(--platform "$tag"); done
echo "gpu_wheels: ${SPECS[*]}"
"$VENV_PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  "${PLATFORMS[@]}" -d "$DIR" "${SPECS[@]}"

# deepspeed publishes an sdist only; its build imports torch (this venv's), and DS_BUILD_OPS=0 keeps it pure Python.
DS=$(version deepspeed)
DS_BUILD_OPS=0 "$VENV_PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DIR" "deepspeed==$DS"

# bitsandbytes: keep the CUDA 13 and CPU libraries only (and drop them from RECORD, which pip checks).
for whl in "$DIR"/bitsandbytes-*.whl; do
  "$VENV_PY" - "$whl" <<'PY'
import re, sys, zipfile
from pathlib import Path
src = Path(sys.argv[1])
tmp = src.with_suffix(".tmp")
drop = re.compile(r"libbitsandbytes_(cuda(?!13)\d+|rocm|xpu|mps)[^/]*\.(so|dll|dylib)$")
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
    for item in zin.infolist():
        if drop.search(item.filename):
            continue
        data = zin.read(item.filename)
        if item.filename.endswith(".dist-info/RECORD"):
            data = b"".join(line for line in data.splitlines(keepends=True)
                            if not drop.search(line.split(b",")[0].decode()))
        zout.writestr(item, data)
tmp.replace(src)
PY
done
ls -l "$DIR"
echo "gpu_wheels: $(ls "$DIR"/*.whl | wc -l) wheels, $(du -sh "$DIR" | cut -f1) in $DIR; on the GPU machine:" \
  "bash benchmarks/gpu_check.sh --wheels $DIR"
