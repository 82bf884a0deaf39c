#!/usr/bin/env bash
# The CPU twin of the GPU image: a scratch environment with the image's packages (benchmarks/gpu_image.txt) at
# their versions, built once per version of that list and reused. Prints the twin's python on its last line.
#
#   bash benchmarks/gpu_twin.sh          # ~/.cache/tokenswap/gpu_twin-<hash of gpu_image.txt>/bin/python
#
# This machine's Python and torch (with the libraries torch's wheel needs; Python-specific wheels for this Python, same versions where PyPI has them;
# the exceptions are the `# twin:` notes in gpu_image.txt), everything else at the image's version, installed
# --no-deps: a package the image lacks is missing here too, so an import that would fail there fails here.
# benchmarks/gpu_check.sh --dry-run then carries the wheels over it exactly as on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
TWIN_PY=${TWIN_PY:-python3}
LIST=benchmarks/gpu_image.txt
KEY=$( (cat "$LIST" "$0"; "$TWIN_PY" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-12)
TWIN=${TWIN_DIR:-$HOME/.cache/tokenswap/gpu_twin-$KEY}
if [ ! -f "$TWIN/.complete" ]; then
  echo "gpu_twin: building $TWIN from $LIST" >&2
  rm -rf "$TWIN"
  mkdir -p "$(dirname "$TWIN")"
  "$TWIN_PY" -m venv "$TWIN"
  # A spec per line: the `# twin:` replacement where there is one, else the line itself.
  mapfile -t SPECS < <(sed -nE '/^[A-Za-z]/{s/^[^#]*#[[:space:]]*twin:[[:space:]]*([^[:space:]]+).*/\1/;s/[[:space:]]*#.*//;p}' "$LIST")
  # The twin's torch as this machine installs it (with the CUDA libraries its wheel links against, as the
  # image's has), then the image's list over it without dependencies.
  "$TWIN/bin/python" -m pip install -q --disable-pip-version-check $(printf '%s\n' "${SPECS[@]}" | grep -E '^torch(vision)?==') \
    2> >(grep -v "is ignored: it is neither" >&2) >&2
  "$TWIN/bin/python" -m pip install -q --disable-pip-version-check --no-deps "${SPECS[@]}" \
    2> >(grep -v "is ignored: it is neither" >&2) >&2
  # The twin is the image's only if pip kept every pinned version (name==version lines without a `# twin:` note).
  "$TWIN/bin/python" - "$LIST" >&2 <<'PY' || exit 1
import importlib.metadata as md
import sys

same, wrong = [], []
for line in open(sys.argv[1]):
    spec, _, note = line.partition("#")
    name, _, version = spec.strip().partition("==")
    if not version or "twin:" in note:
        continue
    have = md.version(name)
    (same if have == version else wrong).append(f"{name} {have}" + ("" if have == version else f" (image {version})"))
if wrong:
    sys.exit(f"gpu_twin: not the image's versions: {', '.join(wrong)}")
print(f"gpu_twin: the image's versions: {', '.join(same)}")
PY
  touch "$TWIN/.complete"
fi
echo "$TWIN/bin/python"
