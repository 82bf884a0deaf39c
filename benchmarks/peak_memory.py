"""Run a recipe file as ``__main__`` and record its peak memory (used by benchmarks/gpu_check.sh).

    accelerate launch ... benchmarks/peak_memory.py recipes/post_train.py --config ... [overrides]

Writes rank 0's ``{"max_memory_allocated_gib", "max_memory_reserved_gib", "max_rss_gib"}`` to
``$PEAK_MEMORY_JSON`` when the recipe has run (the CUDA figures are null without a GPU), so the recipes
themselves carry no benchmarking code. The recipe's last statement, ``end_script()``, may end the process
(after a gloo group); the JSON is written by the ``at_script_end`` hook it runs first, or after the recipe
returns when it never calls ``end_script``.
"""

from __future__ import annotations

import json
import os
import resource
import runpy
import sys

import torch

from tokenswap.ranks import rank_and_world
from tokenswap.training.distributed import at_script_end

_written = False


def write_stats() -> None:
    global _written
    out = os.environ.get("PEAK_MEMORY_JSON")
    if _written or not out or rank_and_world()[0] != 0:
        return
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    stats = {
        "max_memory_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "max_memory_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else None,
        "max_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,  # Linux: KiB
    }
    with open(out, "w") as f:
        json.dump(stats, f)
    _written = True


def main() -> None:
    recipe, *args = sys.argv[1:]
    # As `python recipes/x.py ...` would: the recipe's folder first on the path, its own argv.
    sys.path.insert(0, os.path.dirname(os.path.abspath(recipe)))
    sys.argv = [recipe, *args]
    at_script_end(write_stats)
    runpy.run_path(recipe, run_name="__main__")
    write_stats()


if __name__ == "__main__":
    main()
