"""Checkpoints and exact resume: which checkpoint is complete, the collator state saved with it, and ``train``.

A checkpoint counts once every rank finished writing it (:data:`COMPLETE_MARKER`); the collator's bookkeeping
(swap statistics, sample-id log, swap epoch) travels with each batch from the worker that made it
(:class:`ResumableCollator`) and is saved and restored with the checkpoint (:class:`CheckpointCallback`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import torch
from transformers import TrainerCallback

from tokenswap.errors import PREEMPTED_EXIT, IncompleteRunError, InputError, PreemptedError, free_space
from tokenswap.files import atomic_write
from tokenswap.ranks import print0, rank_and_world
from tokenswap.training.distributed import any_rank
from tokenswap.training.run_folder import COMPLETE_MARKER, RUN_CONFIG
from tokenswap.training.workers import end_loader_workers, ignore_sigterm_in_worker, protect_forks

FAULT_PAUSE_ENV = "TOKENSWAP_FAULT_SAVE_PAUSE_S"
"""Fault injection (benchmarks/faults.py, tests): ``S`` or ``S@STEP``, seconds each save (or only the save of
step STEP) pauses after the Trainer wrote the checkpoint (``trainer_state.json`` included) and before tokenswap's
state and marker, so a kill lands in that window. Unset in real runs."""


def _atomic_json(path: str, data: dict) -> None:
    atomic_write(Path(path), json.dumps(data).encode())


_CHECKPOINT_NAME = re.compile(r"checkpoint-([0-9]+)")
"""What ``latest`` considers: folders named exactly ``checkpoint-<step>`` (not ``checkpoint-10-backup``)."""


def _checkpoint_missing(path: str) -> list[str]:
    """What ``path`` lacks to be a complete tokenswap checkpoint (empty when complete).

    Complete means tokenswap's own record is there: :data:`COMPLETE_MARKER` and every rank's
    ``tokenswap_state.rank{r}.json``, written after the Trainer finished the folder. A checkpoint without them was
    cut while saving (the Trainer's ``trainer_state.json`` comes before tokenswap's state), or was not written by
    a tokenswap run; resuming from it would restart the sample-id log and the swap statistics from nothing.
    """
    marker = os.path.join(path, COMPLETE_MARKER)
    if not os.path.exists(os.path.join(path, "trainer_state.json")):
        return ["trainer_state.json", COMPLETE_MARKER]
    if not os.path.exists(marker):
        return [COMPLETE_MARKER]
    try:
        with open(marker) as f:
            world = int(json.load(f)["world_size"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return [f"a readable {COMPLETE_MARKER} ({type(e).__name__}: {e})"]
    return [name for name in (f"tokenswap_state.rank{r}.json" for r in range(world))
            if not os.path.exists(os.path.join(path, name))]


def _checkpoint_complete(path: str) -> bool:
    return not _checkpoint_missing(path)


_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
            "adapter_model.safetensors", "adapter_model.bin")
"""The files a checkpoint's weights are in (full weights, sharded, legacy pickles, LoRA adapters)."""


def _weights_problem(path: str) -> str | None:
    """What is wrong with the weights of a complete checkpoint (None when they are there)."""
    names = set(os.listdir(path))
    found = [n for n in _WEIGHTS if n in names]
    if not found:
        return f"holds no model weights (none of {', '.join(_WEIGHTS)})"
    for index in (n for n in found if n.endswith(".index.json")):
        try:
            with open(os.path.join(path, index)) as f:
                shards = set(json.load(f)["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            return f"has an unreadable {index} ({type(e).__name__}: {e})"
        missing = sorted(shards - names)
        if missing:
            return f"lacks weight shards its {index} lists: {', '.join(missing[:3])}"
    return None


def resolve_checkpoint(output_dir: str, resume: str | None) -> str | None:
    """The checkpoint to resume from, checked: ``"latest"`` -> the newest *complete* ``checkpoint-N`` in
    ``output_dir`` (None if there is none yet); a path -> that path, if complete.

    A run killed while saving leaves a partial ``checkpoint-N`` (no tokenswap record): ``latest`` skips it, says
    what it lacks, and the resumed run writes that step's checkpoint again over it. An explicit path that is not
    complete is an ``InputError`` (exit 2) naming what is missing. The chosen checkpoint's files are then read back
    (:func:`verify_checkpoint`): a damaged or unsafe file is one naming it, before any weights load.
    """
    if resume is None:
        return None
    if resume != "latest":
        missing = _checkpoint_missing(resume)
        if missing:
            raise InputError(f"`resume_from_checkpoint` {resume} is not a complete tokenswap checkpoint: missing "
                             f"{', '.join(missing)} (tokenswap writes them after the Trainer finished the folder: "
                             "this one was cut while saving, or not written by a tokenswap run). Give a complete "
                             "checkpoint-N, or `latest` for the newest complete one in run.output_dir")
        problem = _weights_problem(resume)
        if problem:
            raise InputError(f"`resume_from_checkpoint` {resume} {problem}: they were deleted or moved after the "
                             "save. Restore them, or resume from another checkpoint-N (`latest`: the newest complete "
                             "one in run.output_dir)")
        verify_checkpoint(resume)
        return resume
    if not os.path.isdir(output_dir):
        return None
    steps = sorted(
        (int(m.group(1)), name)
        for name in os.listdir(output_dir)
        if (m := _CHECKPOINT_NAME.fullmatch(name)) and os.path.isdir(os.path.join(output_dir, name))
    )
    for _, name in reversed(steps):
        path = os.path.join(output_dir, name)
        missing = _checkpoint_missing(path)
        problem = None if missing else _weights_problem(path)
        if problem:
            print0(f"[tokenswap] {path} {problem}: skipped, resuming from an older checkpoint")
            continue
        if not missing:
            verify_checkpoint(path)
            return path
        print0(f"[tokenswap] {path} is incomplete (no {', '.join(missing)}: killed while saving?): skipped, resuming "
               "from an older checkpoint")
    return None


_JSON_SUFFIX = ".json"
_PICKLES = (".pt", ".pth", ".bin")
_NOT_LOADED = {"training_args.bin"}  # the Trainer never loads it on resume (it holds a TrainingArguments object)


def verify_checkpoint(path: str) -> None:
    """Read back every file a resume loads from ``path``; an ``InputError`` (exit 2) names the first damaged or
    unsafe one.

    JSON files must parse, safetensors headers must match their file sizes, and the Trainer's pickles
    (optimizer, scheduler, RNG state, scaler, ``pytorch_model.bin``) must load with torch's weights-only
    unpickler (memory-mapped: nothing is read twice). A pickle that asks to import code is not a safe checkpoint
    and is never loaded; the message does not suggest ``weights_only=False``, which would run it. DeepSpeed's
    ``global_step*`` folders are DeepSpeed's to read.
    """
    import pickle

    from safetensors import SafetensorError, safe_open
    from transformers.trainer_pt_utils import safe_globals

    older = "delete it and resume from an older checkpoint-N (or `latest` once it is gone)"
    for name in sorted(os.listdir(path)):
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            continue
        try:
            if name.endswith(_JSON_SUFFIX):
                with open(file, "rb") as f:
                    json.loads(f.read().decode("utf-8"))
            elif name.endswith(".safetensors"):
                with safe_open(file, framework="pt") as f:
                    f.keys()
            elif name.endswith(_PICKLES) and name not in _NOT_LOADED:
                with safe_globals():
                    try:
                        torch.load(file, map_location="cpu", weights_only=True, mmap=True)
                    except RuntimeError as e:
                        if "mmap" not in str(e):
                            raise
                        torch.load(file, map_location="cpu", weights_only=True)  # a legacy (non-zip) torch.save
        except pickle.UnpicklingError as e:
            # torch's message opens with advice to retry with weights_only=False, which would run the payload:
            # only the reason is kept.
            reason = _unpickling_reason(str(e))
            imports = re.search(r"GLOBAL ([\w.]+)", reason)
            if imports:
                raise InputError(f"{file} is not a safe checkpoint file: it asks to import {imports.group(1)}, which "
                                 "a checkpoint of tensors never does, and it was not loaded. The Trainer did not "
                                 "write it as is (tampered or replaced): do not load it in any other way; "
                                 f"{older}") from None
            raise InputError(f"{file} is damaged (not a readable torch file: {reason}); the checkpoint cannot be "
                             f"resumed: {older}") from None
        except (OSError, ValueError, RuntimeError, SafetensorError, EOFError) as e:
            detail = " ".join(str(e).split())[:300]
            raise InputError(f"{file} is damaged ({type(e).__name__}: {detail}); the checkpoint cannot be resumed: "
                             f"{older}") from None


def _unpickling_reason(message: str) -> str:
    """The reason in torch's weights-only refusal, without its advice paragraph or documentation link."""
    lines = [line.strip() for line in message.splitlines()[1:] if line.strip()]
    lines = [line.split("WeightsUnpickler error:")[-1].strip() for line in lines
             if not line.startswith("Check the documentation")]
    return " ".join(line for line in lines if line)[:300] or "refused by the weights-only unpickler"


def _weights_only(checkpoint: str) -> bool:
    """True for a checkpoint saved with ``save_only_model`` (no optimizer state of the Trainer or DeepSpeed)."""
    names = os.listdir(checkpoint)
    return "optimizer.pt" not in names and not any(n.startswith("global_step") for n in names)


def train(trainer, resume: str | None) -> None:
    """``trainer.train(resume_from_checkpoint=resume)``, except from a checkpoint that already reached ``max_steps``.

    transformers 5.24 checks ``max_steps`` only after a step, so resuming from the final checkpoint (a run killed
    after its last save, relaunched) would train one step past the end. That checkpoint's weights and state are
    loaded instead, and the recipe goes on to save as if the run had just finished.

    A run stopped by SIGTERM (:class:`CheckpointCallback`) has saved a complete checkpoint at the step it stopped;
    it raises :class:`~tokenswap.errors.PreemptedError` here (exit :data:`PREEMPTED_EXIT` through the recipe's
    entry) instead of going on to save as if it had finished. A checkpoint save that fails (disk full) is an
    ``IncompleteRunError`` (exit 1) naming the folder, the file and the disk, and so is a run whose steps had nothing
    to learn (:class:`~tokenswap.training.callbacks.NoTargetsError`). The data-loader workers are ended before this
    returns or raises (:func:`~tokenswap.training.workers.end_loader_workers`).
    """
    if resume is not None and _weights_only(resume):
        print0(f"[tokenswap] warning: {resume} holds the weights only (saved with train.save_only_model: true; no "
               "optimizer.pt, scheduler.pt, rng_state.pth): this resume starts a fresh optimizer, restarts the "
               "learning-rate schedule and reseeds, so it will not equal an uninterrupted run. For exact resumes "
               "set train.save_only_model: false")
    _guard_saves(trainer)
    with _renamed_key_warnings_dropped(trainer, resume):
        if resume is not None and trainer.args.max_steps > 0:
            from transformers import TrainerState

            state = TrainerState.load_from_json(os.path.join(resume, "trainer_state.json"))
            if state.global_step >= trainer.args.max_steps:
                print0(f"[tokenswap] {resume} is at step {state.global_step} >= max_steps: nothing left to train")
                _restore_rotation(trainer)
                _load_final_weights(trainer, resume)
                trainer.state = state
                return
        try:
            trainer.train(resume_from_checkpoint=resume)  # a NoTargetsError goes to the entry: one line, exit 1
        except _save_errors() as e:
            folder = _checkpoint_being_saved(trainer)
            if folder is None:
                raise
            file, cause, disk, fix = _save_failure(e, folder, trainer.args.output_dir, recursive=True)
            raise IncompleteRunError(
                f"saving {folder} failed while writing {file}: {cause} ({disk}). The partial checkpoint has no "
                f"tokenswap record and is skipped on resume: {fix}, then relaunch with "
                "train.resume_from_checkpoint=latest") from None
        finally:
            # The workers end with the training, however it ended: a persistent-workers loader (kept by the
            # Trainer) or a traceback would keep them, which ignore SIGTERM, until an exit that waits for them
            # for ever (tokenswap.training.workers).
            protect_forks(False)
            end_loader_workers()
            _restore_rotation(trainer)
    stopped = [cb.stopped_at for cb in trainer.callback_handler.callbacks
               if isinstance(cb, CheckpointCallback) and cb.stopped_at is not None]
    if stopped:
        folder = os.path.join(trainer.args.output_dir, f"checkpoint-{stopped[0]}")
        notice = (f"[tokenswap] stopped by SIGTERM after step {stopped[0]}: {folder} is complete; relaunch the same "
                  f"command with train.resume_from_checkpoint=latest to continue (exit {PREEMPTED_EXIT})")
        print0(notice)
        raise PreemptedError(notice)


def _errno_of(e: BaseException) -> int | None:
    while e is not None:
        if isinstance(e, OSError) and e.errno:
            return e.errno
        # safetensors' Rust writer: "I/O error: No space left on device (os error 28)"
        if m := re.search(r"\(os error (\d+)\)", str(e)):
            return int(m.group(1))
        e = e.__cause__ or e.__context__
    return None


def _save_failure(e: BaseException, folder: str, output_dir: str, recursive: bool) -> tuple[str, str, str, str]:
    """``(file, cause, disk, fix)`` of a failed save into ``folder``: the file written last (the exception's, else
    the newest in ``folder``), the errno (found by a 1 MiB probe write where the exception carries none), the disk's
    free space, and what to do."""
    code = _errno_of(e)
    if code is None:
        probe = os.path.join(folder if os.path.isdir(folder) else output_dir, ".write-probe")
        try:
            with open(probe, "wb") as f:
                f.write(b"\0" * (1 << 20))
                f.flush()
                os.fsync(f.fileno())
        except OSError as probe_error:
            code = probe_error.errno
        finally:
            with contextlib.suppress(OSError):
                os.remove(probe)
    file = getattr(e, "filename", None) or _file_in_traceback(e, folder)
    if file is None and os.path.isdir(folder):
        if recursive:
            files = [os.path.join(r, n) for r, _, names in os.walk(folder) for n in names]
        else:
            files = [os.path.join(folder, n) for n in os.listdir(folder) if os.path.isfile(os.path.join(folder, n))]
        file = max(files, key=os.path.getmtime, default=None)
    cause = f"[Errno {code}] {os.strerror(code)}" if code else f"{type(e).__name__}: {' '.join(str(e).split())}"
    fix = ("free space on that disk (or point run.output_dir at a larger one, or lower train.save_total_limit)"
           if code in (errno.ENOSPC, errno.EDQUOT) else "fix the cause")
    return file or "its files", cause, free_space(output_dir), fix


def _file_in_traceback(e: BaseException, folder: str) -> str | None:
    """The file under ``folder`` the innermost failing writer was writing, from its frame's arguments.

    safetensors removes the part it wrote and its error names no file ("Error while serializing: I/O error: No
    space left on device"), torch's zip writer says "unexpected pos": the writer's own frame
    (``safetensors.torch.save_file(tensors, filename)``, ``torch.save(obj, f)``) still holds the path.
    """
    root = os.path.realpath(folder) + os.sep
    frames = []
    tb = e.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        for name in ("filename", "f", "file", "path"):
            value = frame.f_locals.get(name)
            if isinstance(value, (str, os.PathLike)) and os.path.realpath(value).startswith(root):
                return os.fspath(value)
    return None


def _save_errors() -> tuple[type[BaseException], ...]:
    # torch's zip writer raises RuntimeError ("unexpected pos"), safetensors its own SafetensorError (no errno).
    from safetensors import SafetensorError

    return OSError, RuntimeError, SafetensorError


def _checkpoint_callbacks(trainer) -> list[CheckpointCallback]:
    return [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, CheckpointCallback)]


def _guard_saves(trainer) -> None:
    """Rotate old checkpoints only once the new one is complete, and let :func:`train` name a failed save.

    The Trainer deletes checkpoints past ``save_total_limit`` at the end of its own save, before tokenswap's
    record marks the new one complete: a kill in between (``save_total_limit: 1``) would leave nothing to resume
    from. For the length of ``train`` the Trainer's limit is off (``args.save_total_limit`` None, restored by
    :func:`_restore_rotation`) and :class:`CheckpointCallback` rotates after its record instead. Only public
    surfaces are used: the arguments' field and the callback hooks.
    """
    callbacks = _checkpoint_callbacks(trainer)
    if not callbacks:
        return
    for cb in callbacks:
        cb.rotates = True
        cb.save_total_limit = trainer.args.save_total_limit
    trainer.args.save_total_limit = None


def _restore_rotation(trainer) -> None:
    callbacks = [cb for cb in _checkpoint_callbacks(trainer) if cb.rotates]
    if callbacks:
        trainer.args.save_total_limit = callbacks[0].save_total_limit


def _checkpoint_being_saved(trainer) -> str | None:
    """The ``checkpoint-N`` folder the Trainer was writing when training raised, else None.

    torch's zip writer reports a full disk as "unexpected pos 1164800 vs 1164692" and safetensors as a bare I/O
    error; neither names the file or the cause, so :func:`train` names them (:func:`_save_failure`). A save is in
    flight from the end of a step that decided to save (``control.should_save``, seen by
    :meth:`CheckpointCallback.on_step_end`) until ``on_save``, which the Trainer calls after the whole folder is
    written (its callback handler clears ``should_save`` then). The folder's path must exist too (the Trainer
    creates the folder first; a file in its place is what that creation hit), so an error of the logging between
    step and save is left as it was raised.
    """
    for cb in _checkpoint_callbacks(trainer):
        control = cb.control
        if control is not None and control.should_save and cb.step_ended == trainer.state.global_step:
            folder = os.path.join(trainer.args.output_dir, f"checkpoint-{trainer.state.global_step}")
            return folder if os.path.lexists(folder) else None
    return None


def _load_final_weights(trainer, resume: str) -> None:
    """Put the weights of ``resume`` (a checkpoint at ``max_steps``) into ``trainer.model`` for the final save.

    A full model was already loaded from ``resume`` by ``from_pretrained`` (:func:`load_model_and_processor` marks
    it); LoRA adapters load through peft's public ``load_adapter``. Anything else has no public loader in
    transformers (5.17 to 5.24 alike): ``Trainer._load_from_checkpoint``, where this release has it.
    """
    model = trainer.model
    if getattr(model, "tokenswap_weights_from", None) == os.path.realpath(resume):
        return
    if hasattr(model, "load_adapter") and hasattr(model, "active_adapter") and hasattr(model, "peft_config"):
        model.load_adapter(resume, adapter_name=model.active_adapter, is_trainable=True)
        return
    load = getattr(trainer, "_load_from_checkpoint", None)
    if load is None:
        raise IncompleteRunError(f"{resume} is at max_steps, and this transformers has no way to load its weights "
                                 "into the Trainer's model: nothing was trained, nothing saved")
    load(resume)


@contextlib.contextmanager
def saving_final(trainer):
    """Around a recipe's final save (``save_model``, the processor, the stats): a failed write is an
    ``IncompleteRunError`` (exit 1, one line) naming the folder, the file, the errno and the free space, as a failed
    checkpoint save is.

    The run's checkpoints are complete by then, so the same command with ``train.resume_from_checkpoint=latest``
    (after freeing space) continues from the newest one and saves again.
    """
    output_dir = trainer.args.output_dir
    try:
        yield
    except _save_errors() as e:
        file, cause, disk, fix = _save_failure(e, output_dir, output_dir, recursive=False)
        raise IncompleteRunError(
            f"saving the trained model into {output_dir} failed while writing {file}: {cause} ({disk}). The run's "
            f"checkpoints are complete: {fix}, then relaunch the same command with "
            "train.resume_from_checkpoint=latest (it continues from the newest checkpoint and saves again)") from None


class _DropMessages(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


@contextlib.contextmanager
def _renamed_key_warnings_dropped(trainer, resume: str | None):
    """Drop the Trainer's missing/unexpected-key warnings on resume when the weights already came from ``resume``.

    transformers 5.24's Trainer loads a checkpoint's state dict with ``strict=False`` without the key renaming
    ``from_pretrained`` applies (``model.layers.*`` on disk, ``model.language_model.layers.*`` in memory;
    transformers#43701), so for Qwen-VL models it loads nothing and lists every key twice, which reads as a
    broken checkpoint. :func:`load_model_and_processor` took the weights from the same folder with
    ``from_pretrained`` (it marks the model), so the warnings say nothing true; for a model it did not load
    from ``resume`` they are kept.
    """
    model = getattr(trainer, "model", None)
    loaded = getattr(model, "tokenswap_weights_from", None)
    if resume is None or loaded is None or loaded != os.path.realpath(resume):
        yield
        return
    restores = ("nothing else (a weights-only checkpoint)" if _weights_only(resume)
                else "optimizer, scheduler and RNG state")
    print0(f"[tokenswap] weights loaded from {resume} by from_pretrained; the Trainer restores {restores} (its own "
           "weight load does not rename Qwen-VL keys: transformers#43701, warnings dropped)")
    log = logging.getLogger("transformers.trainer")
    drop = _DropMessages(("There were missing keys in the checkpoint model loaded",
                          "There were unexpected keys in the checkpoint model loaded"))
    log.addFilter(drop)
    try:
        yield
    finally:
        log.removeFilter(drop)


BOOKKEEPING_KEY = "tokenswap_bookkeeping"
"""The batch key :class:`ResumableCollator` puts each batch's bookkeeping under (taken off before the model)."""


class ResumableCollator:
    """The recipes' collator: its bookkeeping travels with each batch and counts once the batch has trained.

    With ``dataloader_num_workers > 0`` the collator runs in worker processes, and with any number of workers
    the loader collates ahead of the optimizer (prefetch), so neither the collator's own ``stats`` nor a log it
    writes itself tell what trained. Each batch therefore carries, under :data:`BOOKKEEPING_KEY`, the stats it
    added and its sample-id lines. The hook :meth:`attach` puts on the model (:class:`CheckpointCallback` does
    at the start of training) takes that key off every batch in the main process before the forward, and for a
    training forward adds it to :attr:`stats` and appends the lines to ``log_ids_to``. :meth:`state` is what a
    checkpoint stores and :meth:`restore` rewinds to it on resume, so ``sample_ids.rank*.txt`` and the stats
    hold exactly the batches that trained, in order, whatever the worker count, and a resumed run's equal an
    uninterrupted run's.

    Args:
        collator: a :class:`~tokenswap.collator.TokenSwapCollator` whose own ``log_ids_to`` is unset.
        log_ids_to: this process's sample-id log: one line per trained batch (per packed row when packing).
    """

    def __init__(self, collator, log_ids_to: str | None = None):
        self.collator = collator
        self.log_ids_to = log_ids_to
        self.stats: Counter = Counter()
        self._owner_pid = os.getpid()

    def __call__(self, examples):
        if os.getpid() != self.__dict__.get("_owner_pid", os.getpid()) and "_sigterm_ignored" not in self.__dict__:
            # In a data-loader worker. SIGTERM is the trainer's: it finishes its step, saves and stops
            # (CheckpointCallback), and the run then ends its workers. Slurm signals every process of a job, and
            # a worker dying of it (torch's worker handler) fails the step the trainer is finishing. Forked workers
            # have had SIGTERM blocked since the fork (training.workers); from here on it is ignored.
            ignore_sigterm_in_worker()
            self._sigterm_ignored = True
        before = dict(self.collator.stats)
        out = self.collator(examples)
        # Keys first counted with 0 are kept: swap_stats.json lists them as a run without workers always did.
        added = {k: v - before.get(k, 0) for k, v in self.collator.stats.items() if v != before.get(k)}
        out[BOOKKEEPING_KEY] = {"stats": added, "ids": list(self.collator.last_ids)}
        return out

    def __getattr__(self, name):
        # Only called for names the wrapper lacks; "collator" itself missing means a half-built object (unpickling
        # in a spawned data-loader worker), which must not recurse.
        if name == "collator" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.collator, name)

    def attach(self, model: torch.nn.Module):
        """Take the bookkeeping off every batch before ``model`` runs; count it when ``model`` is training.

        Returns:
            the hook's handle (``handle.remove()`` detaches it).
        """
        return model.register_forward_pre_hook(self._take, with_kwargs=True)

    def _take(self, module, args, kwargs):
        if BOOKKEEPING_KEY not in kwargs:
            return None
        kwargs = dict(kwargs)
        bookkeeping = kwargs.pop(BOOKKEEPING_KEY)
        if module.training:  # an evaluation batch trained nothing
            self.stats.update(bookkeeping["stats"])
            if self.log_ids_to is not None and bookkeeping["ids"]:
                with open(self.log_ids_to, "a") as f:
                    f.write("".join(line + "\n" for line in bookkeeping["ids"]))
        return args, kwargs

    def state(self) -> dict:
        """The log size and stats after the batches trained so far (stored in each checkpoint)."""
        log = self.log_ids_to
        size = os.path.getsize(log) if log is not None and os.path.exists(log) else 0
        return {"log_bytes": size, "stats": dict(self.stats)}

    def restore(self, state: dict, source: str = "the checkpoint state", run_folder: str | None = None) -> None:
        """Rewind the sample-id log to ``state["log_bytes"]`` and the stats to ``state["stats"]``.

        A log shorter than the state records lost lines the checkpoint counted (a copied or truncated folder):
        extending it would pad the log with NUL bytes, so that is an error naming both files. A checkpoint of another
        run folder (``run_folder``, a resume into a new ``run.output_dir``) brings that folder's log up to the
        checkpoint: its first ``log_bytes`` bytes become this run's log.
        """
        log = self.log_ids_to
        want = int(state["log_bytes"])
        if log is not None and run_folder is not None and \
                os.path.realpath(run_folder) != os.path.realpath(os.path.dirname(os.path.abspath(log))):
            theirs = os.path.join(run_folder, os.path.basename(log))
            have = os.path.getsize(theirs) if os.path.exists(theirs) else None
            if want > (have or 0):
                raise InputError(f"{source} records {want} bytes of {theirs}, but that log "
                                 f"{'holds ' + str(have) + ' bytes' if have is not None else 'does not exist'}: the "
                                 "checkpoint's run folder lost the lines of batches that trained. Resume from the "
                                 "checkpoint where its run wrote it (with the log beside it), or start a new run")
            with open(theirs, "rb") as f:
                atomic_write(Path(log), f.read(want))
            print0(f"[tokenswap] resuming another folder's checkpoint: {log} starts as the first {want} bytes of {theirs}")
        if log is not None:
            have = os.path.getsize(log) if os.path.exists(log) else None
            if want > (have or 0):
                raise InputError(f"{source} records {want} bytes of {log}, but the log "
                                 f"{'holds ' + str(have) + ' bytes' if have is not None else 'does not exist'}: lines "
                                 "of batches that trained are gone (the folder was copied or the log truncated). "
                                 "Restore the log from where the run wrote it, or start the run again in a new "
                                 "run.output_dir")
            if have is not None:
                with open(log, "r+b") as f:
                    f.truncate(want)
        self.stats = Counter(state["stats"])


class CheckpointCallback(TrainerCallback):
    """Marks a checkpoint complete only after every rank saved it, with the collator state to resume exactly.

    Register on every rank. ``on_save`` runs after the Trainer wrote the whole ``checkpoint-N`` (weights,
    optimizer, scheduler, RNG, trainer_state); each rank writes ``tokenswap_state.rank{r}.json`` (micro-batches
    consumed, collator log size and stats), all ranks meet at a barrier, and rank 0 writes
    :data:`COMPLETE_MARKER` (after copying the run's ``tokenswap_config.json`` in, for the resume check).
    :func:`resolve_checkpoint` only resumes from marked checkpoints. With a collator, training starts by attaching
    it to the model (:meth:`ResumableCollator.attach`).

    SIGTERM (a scheduler's notice before preemption) sets a flag; at the end of the step in flight the flag is
    OR-ed over the ranks, and every rank saves a complete checkpoint of that step and stops, so :func:`train`
    exits with :data:`PREEMPTED_EXIT`. The grace period needed is one step plus one save.
    """

    def __init__(self, collator: ResumableCollator | None = None, consumed: int = 0):
        self.collator = collator
        self.consumed = consumed
        self._hook = None
        self._sigterm_at: float | None = None
        self._pid: int | None = None
        self._previous_handler = None
        self.stopped_at: int | None = None
        """The step a SIGTERM stopped the run at (its checkpoint saved), None while not stopped."""
        self.rotates = False
        """Delete checkpoints past :attr:`save_total_limit` once a new one is complete (set by :func:`train`)."""
        self.save_total_limit: int | None = None
        """The run's ``train.save_total_limit``, which the Trainer's own rotation does not see (:func:`train`)."""
        self.control = None
        self.step_ended: int | None = None
        """The Trainer's control and the last step ended: a save in flight is ``should_save`` at that step."""

    @classmethod
    def resuming(cls, collator: ResumableCollator | None, checkpoint: str | None) -> CheckpointCallback:
        """The callback for a run resuming from ``checkpoint`` (rewinds ``collator`` to that point)."""
        rank, _ = rank_and_world()
        consumed = 0
        if checkpoint is None and collator is not None:
            # A fresh run in a used output_dir: the log starts empty, not after an earlier run's lines.
            collator.restore({"log_bytes": 0, "stats": {}})
        path = os.path.join(checkpoint, f"tokenswap_state.rank{rank}.json") if checkpoint else None
        if path is not None and os.path.exists(path):
            with open(path) as f:
                saved = json.load(f)
            consumed = saved["consumed"]
            if collator is not None and saved.get("collator") is not None:
                collator.restore(saved["collator"], source=path, run_folder=os.path.dirname(os.path.abspath(checkpoint)))
        return cls(collator, consumed)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.collator is not None and self._hook is None:
            self._hook = self.collator.attach(model)
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread only
            self._pid = os.getpid()
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
            protect_forks(True)  # the data-loader workers forked from now on start with SIGTERM blocked

    def on_train_end(self, args, state, control, **kwargs):
        protect_forks(False)
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None

    def _on_sigterm(self, signum, frame):
        # Only a flag: the step in flight finishes, then every rank saves and stops together (on_step_end).
        # Forked data-loader workers inherit this handler: one signalled with its job (Slurm signals every process)
        # ignores it and goes on serving batches, so the trainer can still finish its step and save.
        if os.getpid() != self._pid:
            return
        if self._sigterm_at is None:
            self._sigterm_at = time.monotonic()
            os.write(2, b"[tokenswap] SIGTERM: saving a checkpoint at the end of this step, then exiting\n")

    def on_substep_end(self, args, state, control, **kwargs):
        self.consumed += 1

    def on_step_end(self, args, state, control, **kwargs):
        self.consumed += 1
        self.control = control
        self.step_ended = state.global_step
        # One flag OR-ed over the ranks each step: a SIGTERM that reached any rank stops all of them at this step,
        # so the checkpoint holds one step for every rank (each rank may get the signal at another moment).
        if any_rank(self._sigterm_at is not None, args):
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at = state.global_step

    def on_save(self, args, state, control, **kwargs):
        import torch.distributed as dist

        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        rank, _ = rank_and_world()
        seconds, _, at = (os.environ.get(FAULT_PAUSE_ENV) or "0").partition("@")
        pause = float(seconds) if not at or int(at) == state.global_step else 0.0
        if pause > 0:  # fault injection: hold the window between the Trainer's files and tokenswap's record open
            print(f"[tokenswap] {FAULT_PAUSE_ENV}: {folder} has trainer_state.json, no tokenswap state yet: pausing "
                  f"{pause:g}s", flush=True)
            time.sleep(pause)
        if os.path.isdir(folder):
            collator_state = self.collator.state() if self.collator is not None else None
            _atomic_json(
                os.path.join(folder, f"tokenswap_state.rank{rank}.json"),
                {"consumed": self.consumed, "collator": collator_state},
            )
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if world > 1:
            dist.barrier()  # every rank, folder or not: one that skipped it would leave the others waiting
        if rank == 0 and os.path.isdir(folder):
            # The settings this checkpoint was trained with, for the resume check (run_folder.check_resume_settings).
            run_config = os.path.join(args.output_dir, RUN_CONFIG)
            if os.path.isfile(run_config):
                with open(run_config, "rb") as f:
                    atomic_write(Path(folder) / RUN_CONFIG, f.read())
            _atomic_json(os.path.join(folder, COMPLETE_MARKER), {"world_size": world, "global_step": state.global_step})
            if self.rotates and args.should_save:
                from transformers.trainer_utils import rotate_checkpoints

                # Only now that this checkpoint is complete may older ones go (see train()).
                rotate_checkpoints(output_dir=args.output_dir, save_total_limit=self.save_total_limit,
                                   best_model_checkpoint=state.best_model_checkpoint, use_mtime=True)
