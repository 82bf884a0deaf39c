"""Run a recipe file as ``__main__`` and record its peak CUDA memory (used by benchmarks/gpu_check.sh).

    accelerate launch ... benchmarks/peak_memory.py recipes/post_train.py --config ... [overrides]

Writes ``{"max_memory_allocated_gib", "max_memory_reserved_gib"}`` of rank 0 to ``$PEAK_MEMORY_JSON``
when the recipe returns, so the recipes themselves carry no benchmarking code.
"""

from __future__ import annotations

import json
import os
import runpy
import sys

import torch


def main() -> None:
    recipe, *args = sys.argv[1:]
    # As `python recipes/x.py ...` would: the recipe's folder first on the path, its own argv.
    sys.path.insert(0, os.path.dirname(os.path.abspath(recipe)))
    sys.argv = [recipe, *args]
    runpy.run_path(recipe, run_name="__main__")
    out = os.environ.get("PEAK_MEMORY_JSON")
    if out and int(os.environ.get("RANK", "0")) == 0 and torch.cuda.is_available():
        stats = {
            "max_memory_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
            "max_memory_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
        }
        with open(out, "w") as f:
            json.dump(stats, f)


if __name__ == "__main__":
    main()
