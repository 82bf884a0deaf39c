"""Checkpoints and exact resume: which checkpoint is complete, the collator state saved with it, and ``train``.

A checkpoint counts once every rank finished writing it (:data:`COMPLETE_MARKER`); the collator's bookkeeping
(swap statistics, sample-id log, swap epoch) travels with each batch from the worker that made it
(:class:`ResumableCollator`) and is saved and restored with the checkpoint (:class:`CheckpointCallback`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections import Counter
from pathlib import Path

import torch
from transformers import TrainerCallback

from tokenswap.store.image_store import atomic_write
from tokenswap.training.callbacks import NoTargetsError
from tokenswap.training.distributed import print0

COMPLETE_MARKER = "tokenswap_complete.json"
"""Written into ``checkpoint-N`` after every rank finished saving it (see :class:`CheckpointCallback`)."""


def _atomic_json(path: str, data: dict) -> None:
    atomic_write(Path(path), json.dumps(data).encode())


def _checkpoint_complete(path: str) -> bool:
    """Saved to the end: our marker (and every rank's state file), or, for checkpoints written before markers
    existed, a readable trainer_state.json and model weights."""
    marker = os.path.join(path, COMPLETE_MARKER)
    try:
        if os.path.exists(marker):
            with open(marker) as f:
                world = int(json.load(f)["world_size"])
            return all(os.path.exists(os.path.join(path, f"tokenswap_state.rank{r}.json")) for r in range(world))
        with open(os.path.join(path, "trainer_state.json")) as f:
            json.load(f)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return any(
        os.path.exists(os.path.join(path, name))
        for name in ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors", "pytorch_model.bin")
    ) or any(name.startswith("global_step") for name in os.listdir(path))


def resolve_checkpoint(output_dir: str, resume: str | None) -> str | None:
    """``"latest"`` -> the newest *complete* ``checkpoint-N`` in ``output_dir`` (None if there is none yet).

    A run killed while saving leaves a partial ``checkpoint-N``; it is skipped (and said), and the resumed run
    writes that step's checkpoint again over it.
    """
    if resume != "latest":
        return resume
    if not os.path.isdir(output_dir):
        return None
    steps = sorted(
        (int(name.split("-")[1]), name)
        for name in os.listdir(output_dir)
        if name.startswith("checkpoint-") and name.split("-")[1].isdigit()
        and os.path.isdir(os.path.join(output_dir, name))
    )
    for _, name in reversed(steps):
        path = os.path.join(output_dir, name)
        if _checkpoint_complete(path):
            return path
        print0(f"[tokenswap] {path} is incomplete (killed while saving?): resuming from an older checkpoint")
    return None


def train(trainer, resume: str | None) -> None:
    """``trainer.train(resume_from_checkpoint=resume)``, except from a checkpoint that already reached ``max_steps``.

    transformers 5.24 checks ``max_steps`` only after a step, so resuming from the final checkpoint (a run killed
    after its last save, relaunched) would train one step past the end. That checkpoint's weights and state are
    loaded instead, and the recipe goes on to save as if the run had just finished.
    """
    with _renamed_key_warnings_dropped(trainer, resume):
        if resume is not None and trainer.args.max_steps > 0:
            from transformers import TrainerState

            state = TrainerState.load_from_json(os.path.join(resume, "trainer_state.json"))
            if state.global_step >= trainer.args.max_steps:
                print0(f"[tokenswap] {resume} is at step {state.global_step} >= max_steps: nothing left to train")
                trainer._load_from_checkpoint(resume)
                trainer.state = state
                return
        try:
            trainer.train(resume_from_checkpoint=resume)
        except NoTargetsError as e:  # the data's fault, said in one message: not a traceback from the Trainer
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(1) from None


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
    print0(f"[tokenswap] weights loaded from {resume} by from_pretrained; the Trainer restores optimizer, scheduler "
           "and RNG state (its own weight load does not rename Qwen-VL keys: transformers#43701, warnings dropped)")
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

    def __call__(self, examples):
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

    def restore(self, state: dict) -> None:
        log = self.log_ids_to
        if log is not None and os.path.exists(log):
            with open(log, "r+b") as f:
                f.truncate(state["log_bytes"])
        self.stats = Counter(state["stats"])


class CheckpointCallback(TrainerCallback):
    """Marks a checkpoint complete only after every rank saved it, with the collator state to resume exactly.

    Register on every rank. ``on_save`` runs after the Trainer wrote the whole ``checkpoint-N`` (weights,
    optimizer, scheduler, RNG, trainer_state); each rank writes ``tokenswap_state.rank{r}.json`` (micro-batches
    consumed, collator log size and stats), all ranks meet at a barrier, and rank 0 writes
    :data:`COMPLETE_MARKER`. :func:`resolve_checkpoint` only resumes from marked checkpoints. With a collator,
    training starts by attaching it to the model (:meth:`ResumableCollator.attach`).
    """

    def __init__(self, collator: ResumableCollator | None = None, consumed: int = 0):
        self.collator = collator
        self.consumed = consumed
        self._hook = None

    @classmethod
    def resuming(cls, collator: ResumableCollator | None, checkpoint: str | None) -> CheckpointCallback:
        """The callback for a run resuming from ``checkpoint`` (rewinds ``collator`` to that point)."""
        rank = int(os.environ.get("RANK", "0"))
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
                collator.restore(saved["collator"])
        return cls(collator, consumed)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.collator is not None and self._hook is None:
            self._hook = self.collator.attach(model)

    def on_substep_end(self, args, state, control, **kwargs):
        self.consumed += 1

    def on_step_end(self, args, state, control, **kwargs):
        self.consumed += 1

    def on_save(self, args, state, control, **kwargs):
        import torch.distributed as dist

        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        rank = int(os.environ.get("RANK", "0"))
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
            _atomic_json(os.path.join(folder, COMPLETE_MARKER), {"world_size": world, "global_step": state.global_step})
