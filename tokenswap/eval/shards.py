"""``tokenswap eval --backend hf`` under ``accelerate launch``: the one-process engine, its units shared by rank.

Every rank loads the model and asks its share of the plan's units (every ``world``-th unit, in the plan's order),
appending each record to its own ``records.part<rank>.jsonl``; rank 0 holds the folder lock, merges the parts into
``records.jsonl`` (the one writer of that file) and writes the results. The captions come first: the caption form's
items are asked in a second round, once every rank's captions are merged, so each rank sees all of them. A killed
launch leaves its parts behind; the next run, with any number of processes, merges them before it looks at what is
left to ask, so no answered unit is asked again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from tokenswap.errors import IncompleteRunError

__all__ = ["PART_GLOB", "Shards", "merge_parts"]

PART_GLOB = "records.part*.jsonl"


def merge_parts(out: Path, log) -> int:
    """Append the records of every rank's part file in ``out`` to ``log`` (``records.jsonl``) and remove the parts.

    A crash between the append and the removal only appends the same records again (the last record of a key wins).
    Returns the number of records merged.
    """
    from tokenswap.inference.runs import RecordLog

    merged = 0
    for part in sorted(out.glob(PART_GLOB)):
        for record in RecordLog(part, log.key_field).records.values():
            log.append(record)
            merged += 1
        part.unlink()
    return merged


class Shards:
    """This process's place in a launched evaluation, and the few collective steps the evaluation needs."""

    def __init__(self):
        import torch
        import torch.distributed as dist

        from tokenswap.ranks import local_rank, rank_and_world

        # The launcher's environment, not accelerate's state: a plain Accelerator() under a CPU launch reports
        # every process as rank 0 of 1 (while torch's process group exists).
        self.rank, self.world = rank_and_world()
        self.main = self.rank == 0
        if torch.cuda.is_available():  # the backend puts the model on "cuda": this rank's own GPU
            torch.cuda.set_device(local_rank() % torch.cuda.device_count())
        if not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")

    def _gather(self, value) -> list:
        import torch.distributed as dist

        values: list = [None] * self.world
        dist.all_gather_object(values, value)
        return values

    def together(self, step: Callable[[], object], main_only: bool = False):
        """Run ``step`` (on rank 0 only with ``main_only``) and stop every rank if it failed on any: the failing
        rank raises its own error, the others one line naming that rank."""
        error: BaseException | None = None
        result = None
        if self.main or not main_only:
            try:
                result = step()
            except Exception as e:  # noqa: BLE001 - re-raised below on this rank, named on the others
                error = e
        failed = [(rank, line) for rank, line in enumerate(self._gather(None if error is None else str(error)))
                  if line is not None]
        if error is not None:
            raise error
        if failed:
            rank, line = failed[0]
            raise IncompleteRunError(f"rank {rank} stopped ({line.splitlines()[0] if line else 'an error'}); "
                                     "what was answered is kept, the same command resumes")
        return result

    @contextlib.contextmanager
    def lock(self, take_lock: Callable[[], contextlib.AbstractContextManager]):
        """Rank 0 holds the folder lock for the whole run; the others fail with it when it is held elsewhere."""
        held = contextlib.ExitStack()
        with held:
            self.together(lambda: held.enter_context(take_lock()), main_only=True)
            yield

    def part(self, out: Path, main_log):
        """This rank's record log: writes go to its part file, reads see everything merged so far."""
        from tokenswap.inference.runs import RecordLog

        log = RecordLog(out / f"records.part{self.rank}.jsonl")
        log.records = {**main_log.records, **log.records}
        return log

    def owner(self, units) -> Callable:
        """Rank ``i % world`` asks the ``i``-th unit of the plan."""
        index = {u.key: i for i, u in enumerate(units)}
        return lambda unit: index[unit.key] % self.world == self.rank
