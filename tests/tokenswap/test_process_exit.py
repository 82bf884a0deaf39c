"""How a multi-process run ends: ``close_process_group`` returns, ``end_script`` ends a script (issues 21 and 27)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A gloo group whose worker threads stay alive after destroy_process_group(), because something still references
# the group (as DeepSpeed's engine, optimizer and parameters do). An object torn down with the module reports
# whether the interpreter was finalized while those threads ran: the moment a thread releasing Python-owned tensors
# aborts the process ("terminate called without an active exception").
_SCRIPT = textwrap.dedent(
    """
    import os, sys
    import torch.distributed as dist
    from tokenswap.training import at_script_end, close_process_group, end_script

    dist.init_process_group("{backend}", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
    held = dist.new_group([0])


    class Finalized:
        def __del__(self, write=os.write):
            write(1, b"interpreter finalized with gloo threads alive\\n")


    def main():  # a recipe's main(): ends with close_process_group()
        print("run finished", end="")  # no newline: stays in the buffer unless it is flushed
        close_process_group()


    marker = Finalized()
    at_script_end(lambda: print(" wrapper ran", end=""))  # benchmarks/peak_memory.py writes its JSON so
    main()
    print(" main returned", end="")  # a caller of main() (a sweep driver, a notebook) keeps control
    end_script()
    print(" end_script returned")
    """
)


def _run(tmp_path, port, backend="gloo"):
    script = tmp_path / "run.py"
    script.write_text(_SCRIPT.format(port=port, backend=backend))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.integration
def test_after_gloo_end_script_ends_the_run_without_finalizing_beside_gloo_threads(free_port, tmp_path):
    done = _run(tmp_path, free_port)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "finalized" not in done.stdout and "end_script returned" not in done.stdout
    # buffered output is flushed before the process ends; main() returned and the wrapper's last step ran
    assert done.stdout.startswith("run finished wrapper ran main returned") or done.stdout.startswith(
        "run finished main returned wrapper ran"), done.stdout


def test_close_process_group_returns_to_the_caller(free_port, monkeypatch):
    """A library function never ends the interpreter: code after a recipe's main() runs (issue 27, item 3)."""
    import torch.distributed as dist

    import tokenswap.training.distributed as distributed
    from tokenswap.training import close_process_group

    monkeypatch.setattr(distributed, "_GLOO_RAN", False)  # this pytest process must not meet end_script() after it

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port}", rank=0, world_size=1)
    close_process_group()  # would end pytest itself if it exited
    assert not dist.is_initialized() and distributed._GLOO_RAN  # end_script() would then end the script


def test_close_process_group_and_end_script_are_no_ops_in_a_single_process(monkeypatch):
    import tokenswap.training.distributed as distributed
    from tokenswap.training import close_process_group, end_script

    monkeypatch.setattr(distributed, "_GLOO_RAN", False)

    close_process_group()  # no process group: returns, so a recipe's main() called in-process returns too
    end_script()  # no gloo group ran: the interpreter exits as usual
