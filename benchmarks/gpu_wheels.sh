#!/usr/bin/env bash
# Download, on a machine with package access, the wheels the GPU image lacks, for
# `bash benchmarks/gpu_check.sh --wheels DIR` on the GPU machine (which reaches no package index).
#
#   bash benchmarks/gpu_wheels.sh DIR               # Python 3.12, manylinux x86_64 (the GPU image's)
#   PYVER=3.11 bash benchmarks/gpu_wheels.sh DIR    # another Python (the CPU twin: this machine's)
#
# What the runs need, at the versions the test suite runs against (constraints.txt), minus what the image already
# has (benchmarks/gpu_image.txt): a package is left out when the image's version is the tested one, or satisfies
# every carried package's requirement on it (huggingface_hub: the image's 1.33 meets transformers 5.24's
# >=1.31,<3; the tested 2.x would shadow it and needs httpx2, which the image lacks). Then every requirement of
# every carried wheel is checked against the carried wheels and the image's list; one that neither meets fails
# here, not on the GPU. No torch, CUDA or numpy wheels. deepspeed is built here as a pure-Python wheel
# (DS_BUILD_OPS=0: its ops JIT-compile on the GPU machine when used; ZeRO-3 needs none); bitsandbytes is cut down
# to its CUDA 13 and CPU libraries. Every carried wheel is one pinned version (name==version: a range would carry
# whatever is newest on the day); the script prints each wheel's sha256 and the total size, which must stay within
# CARRY_LIMIT_MB (40). liger-kernel is not carried: no release can patch Qwen2-VL under transformers 5.24 (see
# DROPPED in gpu_check.sh), so gpu_check.sh drops its run and says why.
set -euo pipefail

DIR=${1:?usage: bash benchmarks/gpu_wheels.sh DIR}
cd "$(dirname "$0")/.."
VENV_PY=${VENV_PY:-.venv/bin/python}
[ -x "$VENV_PY" ] || { echo "gpu_wheels: $VENV_PY not found; run 'make setup' first (deepspeed's build needs its torch)" >&2; exit 2; }
PYVER=${PYVER:-3.12}
LIMIT_MB=${CARRY_LIMIT_MB:-40}
mkdir -p "$DIR"
rm -f "$DIR"/*.whl

# What the runs import (and what those need that the image lacks). typing_extensions: the carried pydantic and pydantic_core need
# >= 4.16.0, and the image's version is not known (gpu_image.txt lists it without one), so the tested one travels
# (a 45 KB wheel) rather than a preflight failure on the GPU.
NEEDED="transformers tokenizers huggingface_hub safetensors accelerate peft trl datasets dill multiprocess deepspeed
        pydantic pydantic_core annotated_types typing_inspection typing_extensions hjson bitsandbytes"
PLAN=$("$VENV_PY" - "$PYVER" $NEEDED <<'PY'
import importlib.metadata as md
import re
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as canon
from packaging.version import Version

pyver, needed = sys.argv[1], [canon(n) for n in sys.argv[2:]]
def pins(path):
    out = {}
    for line in open(path):
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[canon(name)] = version or None
    return out
tested, image = pins("constraints.txt"), pins("benchmarks/gpu_image.txt")
env = {"python_version": pyver, "python_full_version": pyver + ".0", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython", "extra": ""}
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
own = project["dependencies"] + project["optional-dependencies"]["train"]  # the core and the recipes' extra
def requires(name):  # the tested version's requirements (installed in the test environment); tokenswap's own
    if name == "tokenswap":
        return [Requirement(r) for r in own]
    try:
        reqs = md.requires(name) or []
    except md.PackageNotFoundError:
        return []
    return [r for r in map(Requirement, reqs) if not r.marker or r.marker.evaluate(env)]
carry, kept = [], []
for name in needed:
    if name not in tested:
        sys.exit(f"gpu_wheels: {name} has no pinned version in constraints.txt; pin it there (name==version)")
    have = image.get(name, "absent")
    if have == tested[name]:
        kept.append(f"{name} {have} (the tested version)")
        continue
    if have not in ("absent", None):
        wants = [(other, r) for other in ["tokenswap", *needed] if other != name for r in requires(other)
                 if canon(r.name) == name]
        if all(r.specifier.contains(Version(have), prereleases=True) for _, r in wants):
            why = ", ".join(f"{o} {r.specifier or 'any'}" for o, r in wants) or "nothing carried asks for it"
            kept.append(f"{name} {have} (tested {tested[name]}; {why})")
            continue
    carry.append(f"{name}=={tested[name]}")
print("KEPT " + "; ".join(kept))
print("CARRY " + " ".join(carry))
PY
)
KEPT=$(sed -n 's/^KEPT //p' <<< "$PLAN")
read -r -a SPECS <<< "$(sed -n 's/^CARRY //p' <<< "$PLAN")"
echo "gpu_wheels: the image's own kept: $KEPT"
echo "gpu_wheels: carried: ${SPECS[*]}"

DOWNLOAD=()
DS=""
for s in "${SPECS[@]}"; do
  case "$s" in deepspeed==*) DS=${s#deepspeed==} ;; *) DOWNLOAD+=("$s") ;; esac
done
PLATFORMS=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
           manylinux2014_x86_64 manylinux1_x86_64; do PLATFORMS+=(--platform "$tag"); done
"$VENV_PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  "${PLATFORMS[@]}" -d "$DIR" "${DOWNLOAD[@]}" 2> >(grep -v "is ignored: it is neither" >&2)
# deepspeed publishes an sdist only; its build imports torch (this venv's), and DS_BUILD_OPS=0 keeps it pure Python.
if [ -n "$DS" ]; then
  DS_BUILD_OPS=0 "$VENV_PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DIR" "deepspeed==$DS" \
    2> >(grep -v "is ignored: it is neither" >&2)
fi

# bitsandbytes: keep the CUDA 13 and CPU libraries only (and drop them from RECORD, which pip checks).
for whl in "$DIR"/bitsandbytes-*.whl; do
  [ -f "$whl" ] || continue
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

# Every carried wheel's requirements, against the carried wheels and the image's list.
"$VENV_PY" - "$DIR" "$PYVER" <<'PY'
import sys, zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as canon
from packaging.version import Version

folder, pyver = Path(sys.argv[1]), sys.argv[2]
env = {"python_version": pyver, "python_full_version": pyver + ".0", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython", "extra": ""}
metas = {}
for whl in sorted(folder.glob("*.whl")):
    with zipfile.ZipFile(whl) as z:
        meta = Parser().parsestr(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode())
    metas[canon(meta["Name"])] = meta
have = {name: meta["Version"] for name, meta in metas.items()}
image = {}
for line in open("benchmarks/gpu_image.txt"):
    line = line.split("#")[0].strip()
    if line:
        name, _, version = line.partition("==")
        image[canon(name)] = version or None
problems, unchecked = [], set()
for name, meta in metas.items():
    for raw in meta.get_all("Requires-Dist") or []:
        r = Requirement(raw)
        if r.marker and not r.marker.evaluate(env):
            continue
        dep = canon(r.name)
        version = have.get(dep, image.get(dep, "absent"))
        if version == "absent":
            problems.append(f"{name} {have[name]} needs {r}, which is neither carried nor in the image")
        elif version is None:
            unchecked.add(dep)
        elif not r.specifier.contains(Version(version), prereleases=True):
            where = "carried" if dep in have else "the image's"
            problems.append(f"{name} {have[name]} needs {r}; {where} {dep} is {version}")
if unchecked:
    print(f"gpu_wheels: versions not in gpu_image.txt, checked on the GPU machine by gpu_check.sh: {' '.join(sorted(unchecked))}")
if problems:
    print("gpu_wheels: the carried set would not load on the image:\n  " + "\n  ".join(problems), file=sys.stderr)
    sys.exit(1)
PY

# What travels, by content: the same pins give the same hashes, so two builds can be compared line by line.
(cd "$DIR" && sha256sum -- *.whl) | while read -r sum file; do
  echo "gpu_wheels: sha256 $sum $(du -k "$DIR/$file" | cut -f1) KB $file"
done
MB=$(du -cm "$DIR"/*.whl | tail -n 1 | cut -f1)
BYTES=$(du -cb "$DIR"/*.whl | tail -n 1 | cut -f1)
echo "gpu_wheels: $(ls "$DIR"/*.whl | wc -l) wheels, $(awk -v b="$BYTES" 'BEGIN{printf "%.1f", b / 1048576}') MB carried in total (limit $LIMIT_MB MB)"
if [ "$BYTES" -gt $((LIMIT_MB * 1048576)) ]; then
  echo "gpu_wheels: over the $LIMIT_MB MB limit" >&2
  exit 1
fi
echo "gpu_wheels: on the GPU machine: bash benchmarks/gpu_check.sh --wheels $DIR"
