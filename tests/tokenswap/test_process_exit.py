"""How a multi-process run ends: ``tokenswap.training.close_process_group`` (issue 21, item 8)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A gloo group whose worker threads stay alive after destroy_process_group(), because something still references
# the group (as DeepSpeed's engine, optimizer and parameters do). An object torn down with the module reports
# whether the interpreter was finalized while those threads ran: the moment a thread releasing Python-owned tensors
# aborts the process ("terminate called without an active exception").
_SCRIPT = textwrap.dedent(
    """
    import os, sys
    import torch.distributed as dist
    from tokenswap.training import close_process_group

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
    held = dist.new_group([0])


    class Finalized:
        def __del__(self, write=os.write):
            write(1, b"interpreter finalized with gloo threads alive\\n")


    marker = Finalized()
    print("run finished", end="")  # no newline: stays in the buffer unless it is flushed
    close_process_group()
    print("close_process_group returned")
    """
)


def test_close_process_group_ends_the_run_without_finalizing_beside_gloo_threads(free_port, tmp_path):
    script = tmp_path / "run.py"
    script.write_text(_SCRIPT.format(port=free_port))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "finalized" not in done.stdout and "returned" not in done.stdout
    assert done.stdout.startswith("run finished")  # buffered output is flushed before the process ends


def test_close_process_group_is_a_no_op_in_a_single_process():
    from tokenswap.training import close_process_group

    close_process_group()  # no process group: returns, so a recipe's main() called in-process returns too
