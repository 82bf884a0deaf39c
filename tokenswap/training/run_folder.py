"""One training run per output folder, and a resume that keeps the settings the run started with.

:func:`hold_output_dir` locks ``run.output_dir`` for the whole run (``tokenswap build-store``'s folder lock: a
kernel ``flock`` a killed holder drops at once); a second run on the folder is refused naming the holder (a
:class:`RunLockedError`, a ``BusyError``: exit 1). :func:`check_resume_settings` refuses, with an ``InputError``
(exit 2) naming every difference, a resume whose settings would change the sample stream or the bookkeeping of
the run it continues; :data:`RESUME_MAY_CHANGE` lists what may. The recipe's entry
(:func:`tokenswap.training.run_recipe`) prints the error and exits.
:func:`write_run_config` writes the resolved config (secrets masked) into the folder.
"""

from __future__ import annotations

import fnmatch
import json
import os
import sys
from pathlib import Path

from tokenswap.config import flatten_dict
from tokenswap.errors import BusyError, InputError
from tokenswap.files import FolderLock, FolderLockedError, atomic_write, remove_dead_temporaries
from tokenswap.ranks import rank_and_world
from tokenswap.training.distributed import max_over_ranks

RUN_CONFIG = "tokenswap_config.json"
"""The resolved config of a run, in its output folder and in each of its checkpoints."""

COMPLETE_MARKER = "tokenswap_complete.json"
"""Written into ``checkpoint-N`` last, after every rank finished saving it
(:class:`~tokenswap.training.checkpoint.CheckpointCallback`): the checkpoint is then complete. It lives here, beside
:data:`RUN_CONFIG`, because the resume check reads it too and ``checkpoint`` imports this module, not the reverse."""

LOCK_PREFIX = ".train-lock"
"""``<output_dir>/.train-lock-r000``: the lock file of :func:`hold_output_dir` (it names its last holder)."""


class RunLockedError(FolderLockedError):
    """Another training run holds the output folder."""


# Locks this process holds, by real folder path. A recipe's main() called again in the same process (tests, a
# notebook) is the same owner: the kernel would refuse a second flock on a new descriptor of the same file.
_HELD: dict[str, FolderLock] = {}


def hold_output_dir(output_dir: str, args=None) -> None:
    """Lock ``output_dir`` for this run until the process ends; a :class:`RunLockedError` (exit 1) naming the
    holder if another run has it, an ``InputError`` (exit 2) if the lock file cannot be made (a read-only disk, a
    folder or a symlink in its place).

    Two runs writing one folder interleave their sample-id logs, checkpoints and config (each would end with a
    mix of both), so the second is refused before it writes anything. Rank 0 holds the lock (the other ranks of a
    launch share its folder); its answer reaches every rank, so a refused launch raises on all of them together
    (rank 0 the refusal, the others one line pointing at it) instead of leaving ranks waiting at a collective. Call
    it after ``TrainingArguments`` exist (multi-process runs then have their process group). The lock lives in
    ``.train-lock-r000``; a killed holder releases it at once.
    """
    if args is not None:
        args.device  # noqa: B018 - sets up the process group of a multi-process run, which the answer travels on
    os.makedirs(output_dir, exist_ok=True)
    refused: Exception | None = None
    code = 0
    key = os.path.realpath(output_dir)
    rank, _ = rank_and_world()
    if rank == 0 and key not in _HELD:
        lock = FolderLock(Path(output_dir), 0, prefix=LOCK_PREFIX, doing="used by a training run",
                          error=RunLockedError, what="run")
        try:
            _HELD[key] = lock.acquire()
        except RunLockedError as e:
            refused, code = e, 1
        except InputError as e:  # the lock file cannot be one (a read-only disk, a folder or a symlink there)
            refused, code = e, 2
        else:
            # Nobody else writes this folder now: what a killed writer left half-written goes.
            remove_dead_temporaries(output_dir)
    code = max_over_ranks(code, args)
    if refused is not None:
        raise refused
    if code:  # another rank's refusal (rank 0 said why): this rank ends with the same exit status
        error = BusyError if code == 1 else InputError
        raise error(f"rank 0 could not take {output_dir} for this run (its error above says why)")


def write_run_config(output_dir: str, config: dict) -> None:
    """Write ``config`` (from :func:`tokenswap.config.config_to_dict`: secrets masked) as the run's
    :data:`RUN_CONFIG` (rank 0); each checkpoint gets a copy (:class:`~tokenswap.training.CheckpointCallback`)."""
    if rank_and_world()[0] == 0:
        atomic_write(Path(output_dir) / RUN_CONFIG, json.dumps(config, indent=2).encode())


RESUME_MAY_CHANGE: tuple[str, ...] = (
    "run.output_dir",  # an explicit checkpoint of another folder continues here
    "train.resume_from_checkpoint",
    "train.max_steps", "train.num_train_epochs",  # extend (or shorten) a run; the schedule follows the new length
    "train.logging_*", "train.log_*", "train.save_*", "train.report_to", "train.disable_tqdm",
    "train.include_num_input_tokens_seen", "train.include_tokens_per_second", "train.skip_memory_metrics",
    "train.push_to_hub", "train.hub_*",
    "train.dataloader_num_workers", "train.dataloader_prefetch_factor", "train.dataloader_persistent_workers",
    "train.dataloader_pin_memory",  # collation in workers gives the same batches and bookkeeping
    "train.ddp_timeout",
    "collator.cache_gb", "collator.prepared",  # the pixel cache and a prepared copy: identical pixels
    "gap_eval.*", "eval.*", "wandb.*", "throughput.*",  # what is measured and reported, not what trains
)
"""Config keys (``fnmatch`` patterns) a resume may change. Any other difference from the run's saved config
(``run.arm``, ``data.seed``, ``collator.swap_prob``, ``collator.max_length``, ``collator.pack_budget``, batch sizes,
learning rate, the model, the number of processes, ...) changes the sample stream or the bookkeeping of the run
being continued, and the resume is refused with each difference named."""


def _saved_config(checkpoint: str) -> tuple[str, dict] | None:
    """The config the run of ``checkpoint`` was started with: its own copy, else its run folder's."""
    for path in (Path(checkpoint) / RUN_CONFIG, Path(checkpoint).parent / RUN_CONFIG):
        if path.is_file():
            try:
                return str(path), json.loads(path.read_text())
            except ValueError as e:
                raise InputError(f"{path} is not valid JSON ({e}); it records the settings {checkpoint} was trained "
                                 "with: restore it, or resume from another checkpoint") from None
    return None


def resume_differences(saved: dict, now: dict) -> list[str]:
    """``key: was X, now Y`` for each setting outside :data:`RESUME_MAY_CHANGE` that differs."""
    old, new = flatten_dict(saved), flatten_dict(json.loads(json.dumps(now)))
    changed = [k for k in sorted(set(old) | set(new)) if old.get(k, "<absent>") != new.get(k, "<absent>")
               and not any(fnmatch.fnmatchcase(k, p) for p in RESUME_MAY_CHANGE)]
    return [f"{k}: was {old.get(k, '<absent>')!r}, now {new.get(k, '<absent>')!r}" for k in changed]


def check_resume_settings(config: dict, checkpoint: str | None) -> None:
    """An ``InputError`` (exit 2) naming every difference, when ``config`` would continue ``checkpoint`` with
    other settings.

    ``config`` is this launch's :func:`~tokenswap.config.config_to_dict`; the run's own is the checkpoint's copy of
    :data:`RUN_CONFIG` (or, for checkpoints written before copies, the one in its run folder). The number of
    processes is compared too (it splits the batches). A fresh run (``checkpoint`` None) is not checked.
    """
    if checkpoint is None:
        return
    problems = []
    found = _saved_config(checkpoint)
    if found is None:
        print(f"[tokenswap] warning: {checkpoint} has no {RUN_CONFIG} (nor its run folder): its settings cannot be "
              "compared with this launch's", file=sys.stderr, flush=True)
    else:
        where, saved = found
        problems += resume_differences(saved, config)
    try:
        world = json.loads((Path(checkpoint) / COMPLETE_MARKER).read_text()).get("world_size")
    except (OSError, ValueError, AttributeError):
        world = None
    _, now_world = rank_and_world()
    if world is not None and int(world) != now_world:
        problems.append(f"processes (WORLD_SIZE): was {world}, now {now_world}")
    if problems:
        what = where if found is not None else checkpoint
        raise InputError(f"{checkpoint} was trained with other settings ({'; '.join(problems)}); resuming would train "
                         f"the rest of the run on another sample stream while {RUN_CONFIG} claimed one (the run's "
                         f"settings: {what}). Resume with the original settings, or start a new run in another "
                         f"run.output_dir. A resume may change only: {', '.join(RESUME_MAY_CHANGE)}")
