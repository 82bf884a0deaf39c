#!/usr/bin/env bash
# Download, on a machine with package access, the wheels the GPU image lacks, for
# `bash benchmarks/gpu_check.sh --wheels DIR` on the GPU machine (which reaches no package index).
#
#   bash benchmarks/gpu_wheels.sh DIR               # Python 3.12, manylinux x86_64 (the GPU image's)
#   PYVER=3.11 bash benchmarks/gpu_wheels.sh DIR    # another Python (the CPU twin: this machine's)
#
# Only what the image lacks travels, at the versions the test suite runs against (constraints.txt): tokenswap's
# requirements (pyproject.toml: dependencies and the extras named in GPU_EXTRAS, default train) and everything they
# need, less what the image has (benchmarks/gpu_image.txt). The image's own packages (torch, transformers,
# accelerate, peft, tokenizers, huggingface_hub, safetensors, numpy, ...) are never carried: gpu_check.sh installs
# the wheels into the image's environment with pip, which would replace them. A requirement the image's version
# does not meet stops the script here (exit 2, one line each: widen the range), not on the GPU. Then every
# requirement of every carried wheel is checked against the carried wheels and the image's list. No torch, CUDA or
# numpy wheels. deepspeed is built here as a pure-Python wheel (DS_BUILD_OPS=0: its ops JIT-compile on the GPU
# machine when used; ZeRO-3 needs none); bitsandbytes (ALSO: the QLoRA run) is cut down to its CUDA 13 and CPU
# libraries. Every carried wheel is one pinned version (name==version: a range would carry whatever is newest on
# the day); the script prints each wheel's sha256 and the total size, which must stay within CARRY_LIMIT_MB (40).
# liger-kernel is not carried (DROPPED in gpu_report.py says why), nor flash-attn (built against the image's torch).
set -euo pipefail

DIR=${1:?usage: bash benchmarks/gpu_wheels.sh DIR}
cd "$(dirname "$0")/.."
VENV_PY=${VENV_PY:-.venv/bin/python}
[ -x "$VENV_PY" ] || { echo "gpu_wheels: $VENV_PY not found; run 'make setup' first (deepspeed's build needs its torch)" >&2; exit 2; }
PYVER=${PYVER:-3.12}
LIMIT_MB=${CARRY_LIMIT_MB:-40}
mkdir -p "$DIR"
rm -f "$DIR"/*.whl

# What the runs need: tokenswap's own requirements (pyproject.toml's dependencies and the extras in GPU_EXTRAS) and
# ALSO (bitsandbytes: the QLoRA run; the rest of the gpu extra is flash-attn, built against the image's torch, and
# liger-kernel, dropped), then what those need, down to the last requirement (each at the tested version's
# requirements, read from this environment). A package the image has is never carried: pip would replace the
# image's own build. Its version must meet every requirement on it, else the script stops (exit 2, one line each)
# before downloading anything; a version the image list does not give is checked on the GPU machine by
# gpu_check.sh's install plan. What the image lacks travels at its tested version (constraints.txt).
GPU_EXTRAS=${GPU_EXTRAS:-train}
ALSO=${ALSO:-bitsandbytes}
PYPROJECT=${PYPROJECT:-pyproject.toml}  # another file: what a range change would carry, before making it
PLAN=$("$VENV_PY" - "$PYVER" "$GPU_EXTRAS" "$ALSO" "$PYPROJECT" <<'PY'
import importlib.metadata as md
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as canon
from packaging.version import Version

pyver, extras, also, pyproject = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4]
def pins(path):
    out = {}
    for line in open(path):
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[canon(name)] = version or None
    return out
tested, image = pins("constraints.txt"), pins("benchmarks/gpu_image.txt")
env = {"python_version": pyver, "python_full_version": pyver + ".0", "sys_platform": "linux", "os_name": "posix",
       "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "extra": ""}
project = tomllib.load(open(pyproject, "rb"))["project"]
groups = project.get("optional-dependencies", {})
unknown = [e for e in extras if e not in groups]
if unknown:
    print(f"PROBLEM GPU_EXTRAS names {' '.join(unknown)}, not an extra of pyproject.toml (extras: {' '.join(groups)})")
    sys.exit(0)
wanted = [(r, "tokenswap") for r in map(Requirement, project["dependencies"])]
wanted += [(r, f"tokenswap[{e}]") for e in extras for r in map(Requirement, groups[e])]
named = {canon(r.name): r for rs in groups.values() for r in map(Requirement, rs)}
wanted += [(named.get(canon(n), Requirement(n)), "the check's runs") for n in also]
carry, kept, problems, seen = {}, {}, [], set()
while wanted:
    r, who = wanted.pop(0)
    if r.marker and not r.marker.evaluate(env):
        continue
    name = canon(r.name)
    seen.add(name)
    if name in image:
        have = image[name]
        if have is None:
            kept.setdefault(name, "version checked on the GPU")
        elif r.specifier.contains(Version(have), prereleases=True):
            kept.setdefault(name, have)
        else:
            problems.append(f"{who} needs {r}; the image has {name} {have}, and pip would replace it")
        continue
    if name in carry:
        if not r.specifier.contains(Version(carry[name]), prereleases=True):
            problems.append(f"{who} needs {r}; the carried {name} is {carry[name]}")
        continue
    version = tested.get(name)
    if version is None:
        problems.append(f"{who} needs {r}; {name} has no pin in constraints.txt (name==version)")
        continue
    if not r.specifier.contains(Version(version), prereleases=True):
        problems.append(f"{who} needs {r}; constraints.txt pins {name}=={version}")
        continue
    try:
        installed = md.version(name)
    except md.PackageNotFoundError:
        installed = None
    if installed != version:
        problems.append(f"{name}: this environment has {installed}, constraints.txt {version}; run 'make setup'")
        continue
    carry[name] = version
    wanted += [(req, f"{name} {version}") for req in map(Requirement, md.requires(name) or [])]
for p in problems:
    print(f"PROBLEM {p}")
print("KEPT " + "; ".join(f"{n} {v}" for n, v in kept.items()))
print("CARRY " + " ".join(f"{n}=={v}" for n, v in carry.items()))
PY
)
if grep -q '^PROBLEM ' <<< "$PLAN"; then
  sed -n 's/^PROBLEM /gpu_wheels: /p' <<< "$PLAN" >&2
  exit 2
fi
KEPT=$(sed -n 's/^KEPT //p' <<< "$PLAN")
read -r -a SPECS <<< "$(sed -n 's/^CARRY //p' <<< "$PLAN")"
echo "gpu_wheels: the image's own, kept: $KEPT"
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
