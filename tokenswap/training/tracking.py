"""W&B run set-up: one run per arm and replicate, named ``{pair}-{arm}-s{seed}`` in group ``{pair}``, so paired runs
compare and the replicates of one arm stay apart."""

from __future__ import annotations

import struct
import sys
import time
from pathlib import Path

from tokenswap.ranks import rank_and_world
from tokenswap.training.config import RunConfig, WandbConfig


def run_name(run: RunConfig) -> str:
    """``{pair}-{arm}-s{seed}``: the replicates of one arm are runs of their own in W&B and in the Trainer."""
    return f"{run.pair}-{run.arm}-s{run.seed}"


def init_wandb(cfg: WandbConfig, run: RunConfig, stage: str, config: dict, report_to: list[str]) -> None:
    """Start the W&B run of one arm on rank 0: name ``{pair}-{arm}-s{seed}``, group ``{pair}``, tag ``seed:{seed}``.

    The Trainer's W&B callback then logs into this run instead of opening its own. ``config`` comes masked
    (:func:`tokenswap.config.config_to_dict`); W&B also records the command line (``sys.argv[1:]``, the run's
    "Command" and ``args`` in its metadata) when the run starts, so ``wandb.init`` sees it with its secrets masked
    (a ``train.hub_token=...`` override, URL credentials: :func:`tokenswap.redaction.redacted_argv`).
    """
    if "wandb" not in report_to or rank_and_world()[0] != 0:
        return
    import wandb

    from tokenswap.redaction import mask_secrets, redacted_argv

    with redacted_argv():
        wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            name=run_name(run),
            group=run.pair,
            job_type=stage,
            tags=[stage, run.arm, run.image_source, f"seed:{run.seed}", *cfg.tags],
            config=mask_secrets({"arm": run.arm, "image_source": run.image_source, "stage": stage, "pair": run.pair,
                                 **config}),
            mode=cfg.mode,
            dir=run.output_dir,
        )


def same_keys_in_wandb(trainer) -> None:
    """Log to W&B under the names ``log_history.json``, ``tokenswap compare`` and the docs use (``gap/abs``, ``loss``),
    not the Trainer's ``train/gap/abs``: one name per metric wherever it is read. A no-op without W&B."""
    from transformers.integrations import WandbCallback

    summary = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "total_flos")

    class SameKeysWandbCallback(WandbCallback):
        def on_log(self, args, state, control, model=None, logs=None, **kwargs):
            if self._wandb is None:
                return
            if not self._initialized:
                self.setup(args, state, model)
            if state.is_world_process_zero:
                for k, v in logs.items():
                    if k in summary:
                        self._wandb.run.summary[k] = v
                # train/global_step: the step axis the parent's setup declares for every key
                self._wandb.log({**{k: v for k, v in logs.items() if k not in summary},
                                 "train/global_step": state.global_step})

    callbacks = trainer.callback_handler.callbacks
    for i, cb in enumerate(callbacks):
        if type(cb) is WandbCallback:  # replaced in place: callbacks that add keys before it still run first
            callbacks[i] = SameKeysWandbCallback()


def finish_wandb(timeout: float = 60.0) -> None:
    """Close the W&B run opened by :func:`init_wandb`; an offline run's file is complete when this returns.

    ``wandb.finish()`` can return before W&B's service process has written an offline run's records (seen on a
    loaded machine: a run file holding no record yet, read back as a run without name or history), so this waits
    up to ``timeout`` seconds for the file's closing ``exit`` record.
    """
    wandb = sys.modules.get("wandb")
    if wandb is None or wandb.run is None:
        return
    settings = wandb.run.settings
    offline_file = settings.sync_file if settings.mode in ("offline", "dryrun") else None
    wandb.finish()
    if offline_file is None:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if any(r.WhichOneof("record_type") == "exit" for r in wandb_records(offline_file)):
                return
        except Exception:  # noqa: BLE001 - a file still being written: a cut header or record, not an error yet
            pass
        time.sleep(0.2)
    print(f"warning: W&B has not finished writing {offline_file} after {timeout:g} s; it may be incomplete",
          file=sys.stderr)


def wandb_records(path: str):
    """Yield the protobuf records of a ``.wandb`` file (LevelDB log framing, 32 KiB blocks): read only to know when
    W&B has written an offline run's closing record (:func:`finish_wandb`); runs are compared from their folders."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file (bad magic {data[:4]!r})")
    block, pos, pending = 32768, 7, b""
    while pos + 7 <= len(data):
        room = block - pos % block
        if room < 7:  # the writer pads the tail of a block that cannot hold a header
            pos += room
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            break
        payload = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 1:  # FULL
            chunk = payload
        elif kind == 2:  # FIRST
            pending = payload
            continue
        elif kind == 3:  # MIDDLE
            pending += payload
            continue
        else:  # LAST
            chunk, pending = pending + payload, b""
        record = pb.Record()
        record.ParseFromString(chunk)
        yield record
