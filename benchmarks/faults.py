"""Fault injection on CPU with tiny models: does tokenswap survive what a multi-day run meets?

    python benchmarks/faults.py                      # all sections, ~3 min on 2 cores
    python benchmarks/faults.py --sections llm,data  # a subset
    python benchmarks/faults.py --workdir /tmp/f --keep

Every fault is one trial. A trial is *handled* when tokenswap does what it promises for that
fault (refuses clearly, skips and counts, retries, or resumes to the same result as an
uninterrupted run); otherwise it is *lost*, and the reason is printed. Sections:

- ``store``: store builds SIGKILLed at random moments then resumed (output equal to an
  uninterrupted build, the next start never refused by a stale lock); two builds started together
  on one folder (one builds, the other is refused naming the holder, nothing lost or duplicated);
  resumes with other sources/settings (refused with the difference, folder untouched); a typo in
  ``data.path`` (exit 2, nothing written, the fixed command runs); a negative limit.
- ``store_images``: hostile files in a retrieval corpus (decompression bomb, 1x4000 sliver,
  truncated JPEG, empty file, text named .png): the build completes and names each file.
- ``native_images``: hostile native images (and store images) through the real collator with the
  tiny processor: the sample is dropped and counted (native) or the concept stays text (store).
- ``shard_rewrite``: a store shard changed on disk under a live ``ImageStore`` and collator: copied over in place
  (``cp``), a few bytes rewritten in place (``rsync --inplace``, a bad disk), truncated in place (in a child
  process, where a memory-mapped read would die of SIGBUS), and replaced by rename (as ``StoreWriter`` writes).
  No concept may get another concept's picture: each is its own picture (pixels equal to the intact store's)
  or text, counted as ``concepts_text_hash_mismatch`` and warned once naming the shard.
- ``data``: malformed Magpie lines with ``skip_malformed`` (counted), and without (line named);
  bad spans and torn lines in a swap dataset; empty/edited/odd LLaVA files.
- ``malformed``: a Magpie JSONL file with lone surrogates (``"\\udcff"`` escapes), wrong field types, an unknown
  role, null, truncated and non-UTF-8 rows through ``tokenswap build-store`` with ``data.skip_malformed=true``
  (each skipped and counted, every good row kept) and without it (exit 2 naming file and line).
- ``llm``: a misbehaving HTTP server on 127.0.0.1 (``tests.support.ScriptedLLMServer``, the tests'
  own): redirect to another host, slow drip, huge replies, garbage/non-UTF-8/cut bodies, null reply,
  429 with Retry-After, 500 storm, no server.
- ``concurrency``: ``tokenswap build-store`` with the LLM extractor and the validity judge at ``llm.concurrency=16``
  against ``tests.support.LoadLLMServer`` answering in a random order: SIGKILLed at random moments and
  resumed, then a rate-limited server (429 + Retry-After), a server dropping or stalling some requests (the
  build exits 1 naming the failures, ``report.json`` says ``complete: false``, the same command after the
  server recovers fills them in). Every chunk, store shard and dataset shard must be byte-identical to a build
  at ``concurrency=1``.
- ``training``: ``recipes/post_train.py`` on the tiny config SIGKILLed at random moments and
  right as a checkpoint folder appears (mid-save), resumed with ``train.resume_from_checkpoint=latest``;
  the final losses, ``sample_ids.rank0.txt`` and ``swap_stats.json`` must equal an uninterrupted run.
  Each kill is handled only if the run it belongs to ends equal to the reference. A kill counts as mid-save
  only when the checkpoint it hit was left partial; fewer kills landed than asked are said in a note.
- ``workers``: the tiny post-training run with ``train.dataloader_num_workers=2`` (also stopped after its
  first checkpoint and resumed): losses, ``sample_ids.rank0.txt``, ``swap_stats.json`` and each checkpoint's
  collator state must equal the run with 0 workers.

- ``same_folder``: a second training run on a busy ``run.output_dir`` (same config, another arm) and two launched
  at once: the second exits 1 naming the holder and writes nothing; the first, SIGKILLed and resumed, ends equal
  to an uninterrupted run.
- ``state_window``: SIGKILLs held precisely between ``trainer_state.json`` and tokenswap's record
  (``TOKENSWAP_FAULT_SAVE_PAUSE_S``): the cut checkpoint is skipped (said) and the run ends equal to the reference.
- ``sigterm``: SIGTERM during a save, at random moments, and to rank 1 only of a 2-rank run: a complete checkpoint
  at the next step end on every rank, exit 143, an exact resume.
- ``runs_end``: a finished run with persistent data-loader workers ends with them; SIGTERM to the job's process
  group before the first batch (``TOKENSWAP_FAULT_WORKER_HOLD_S`` holds each worker there until the signal is
  pending) saves step 1 and exits 143 with no traceback and no orphan; a SIGKILL of a run with 2 workers leaves the
  folder's lock free at the first try; a SIGKILLed ``atomic_write``'s temporary is removed when the training run and
  the store build restart (a live writer's is kept); a write on a full tmpfs leaves none.
- ``resume_settings``: resumes with changed ``run.arm``, ``collator.swap_prob``, ``data.seed``,
  ``collator.max_length``, ``collator.pack_budget``, batch size, learning rate: exit 2 naming each difference, the
  folder untouched; a longer ``max_steps`` with 2 workers resumes exactly.
- ``secrets``: a loopback server whose 500 quotes the ``Authorization`` header (raw, JSON-escaped, percent-encoded,
  plus form, cut by the client, cut by the build) or whose reply repeats the key, through ``build-store`` and
  ``tokenswap eval --backend openai``: no form of the key in any file of the folder nor in stdout/stderr;
  ``user:password@`` in ``extractor.llm`` / ``judge.llm`` / the bench builder's base URLs: exit 2 naming the key and
  the fix, the password nowhere (on the command line: refused before the command runs); a tiny offline W&B training
  run whose YAML holds ``train.hub_token`` and a ``user:pass@`` URL in ``train.hub_model_id``: neither in the
  ``.wandb`` file, ``debug.log``, any ``training_args.bin`` nor any other file, and the run resumes from its
  checkpoint.
- ``launcher``: each recipe under ``accelerate launch`` (1 process; post-training also 2) with ``HF_TOKEN``,
  ``WANDB_API_KEY`` and ``OPENAI_API_KEY`` in the environment, ended by a config error: no secret past the launcher's
  traceback nor in any file; a hub token on the launched command line refused without its value.
- ``handlers``: transformers', datasets', huggingface_hub's, DeepSpeed's and accelerate's log handlers (made before
  the streams) log the hub token inside a recipe run and ``tokenswap eval``: masked on every line, restored after.
- ``closed_reader``: ``--help``, ``--version``, a recipe's printing imports under ``PYTHONUNBUFFERED=1``, DeepSpeed's
  logger inside the streams and an error line, each to a reader gone: a quiet 141 or the command's own status.
- ``null_replies``: a 200 with ``content: null`` (or none) for some requests: ``build-store`` (extract and judge
  stages) exits 1 with ``complete: false`` counting failed requests, the rerun asks them again and equals an
  uninterrupted build; ``tokenswap eval`` records them as failed, never as the answer ``""``, never scored, the rerun
  asks exactly those and equals an uninterrupted run; the bench builder records no such item, the rerun equals an
  uninterrupted run.
- ``bad_replies``: bodies of 100,000-deep nesting, a 4,400-digit integer, lone surrogates, logprobs of +1000 or NaN:
  retried by the client then failed requests (never a crash), in ``tokenswap eval`` (generate and loglik: nothing
  non-finite written, the rerun fills in) and ``build-store``; each kind of poisoned response-cache entry skipped with
  one warning naming the file and asked again; lines no run writes in ``records.jsonl`` skipped on resume.
- ``no_link``: the folder lock where ``link(2)`` is refused (EPERM, ENOTSUP, ENOSYS, EXDEV: ``os.link`` patched in
  the command's process; a real vfat mount too where one can be made): a build completes, a second build on a held
  folder exits 1 naming the holder, the released folder builds.
- ``sigint``: Ctrl-C at random moments in ``tokenswap eval`` and ``tokenswap build-store`` against a slow loopback
  server, and in ``recipes/post_train.py`` (inside a held save, or at a random moment after the first complete
  checkpoint): exit 130 with one line, no traceback; the rerun says it resumes (the recipe's line names
  ``train.resume_from_checkpoint=latest``) and equals an uninterrupted run.

The script checks the checkout it sits in (it puts that first on ``sys.path`` and on the subprocesses'
``PYTHONPATH``), not whatever ``tokenswap`` is installed. Each section is a module of ``benchmarks/faults/``
(shared helpers in ``benchmarks/faults/_common.py``); this file is the runner. ``--beside-load N`` runs N busy
processes beside the trials for the whole run (a loaded machine: the verdict must not depend on load).

Bounded in time: every subprocess has a timeout, and every wait for another process waits for a state of it (a
file, a line, a pid), never for a fixed time. The last line of the output is exactly
``faults: N tried, H handled, L lost``; the exit status is 0 when every trial was handled and at least one was tried.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The checkout this script sits in is the code it checks (benchmarks/faults/_common.py checks the import too).
sys.path.insert(0, str(REPO))
sys.path.insert(1, str(REPO / "benchmarks"))

from faults._common import Tally, contextlib_quiet  # noqa: E402

SECTIONS = ("store", "store_images", "native_images", "shard_rewrite", "data", "malformed", "llm", "concurrency",
            "training", "workers", "same_folder", "state_window", "sigterm", "resume_settings",
            "secrets", "null_replies", "bad_replies", "runs_end", "launcher", "handlers", "closed_reader", "no_link",
            "sigint")
MODULES = {name: importlib.import_module(f"faults.{name}") for name in SECTIONS}
OUTCOMES = {name: m.OUTCOME for name, m in MODULES.items()}

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}; SECTION:A+B runs only trials A and B of a section "
                        "that names its trials (runs_end: persistent, sigterm_start, sigkill, temporaries, full_disk)")
    parser.add_argument("--store-kills", type=int, default=6)
    parser.add_argument("--train-kills", type=int, default=6)
    parser.add_argument("--concurrency-kills", type=int, default=4)
    parser.add_argument("--json", default=None, help="also write the trials here")
    parser.add_argument("--beside-load", type=int, default=0, metavar="N",
                        help="run N busy processes (each a CPU's worth of work, never sleeping) beside the trials, "
                        "ended when the run ends: the verdict of a loaded machine (default 0)")
    args = parser.parse_args(argv)
    sections, picked = [], {}
    for spec in filter(None, args.sections.split(",")):
        name, _, trials = spec.partition(":")
        if name not in SECTIONS:
            parser.error(f"unknown section {name!r}; choose from {SECTIONS}")
        sections.append(name)
        if trials:
            known = getattr(MODULES[name], "TRIALS", ())
            wrong = [x for x in trials.split("+") if x not in known]
            if wrong:
                parser.error(f"section {name} has no trial {wrong[0]!r}; "
                             + (f"choose from {'+'.join(known)}" if known else "it runs whole"))
            picked[name] = tuple(trials.split("+"))
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tokenswap-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    tally = Tally()
    t0 = time.monotonic()
    model = tiny_store = None
    if {"native_images", "shard_rewrite", "training", "workers", "same_folder", "state_window", "sigterm",
            "resume_settings", "runs_end", "sigint"} & set(sections):
        from tokenswap.testing import build_tiny_qwen2vl, build_tiny_store

        with contextlib_quiet():
            model = build_tiny_qwen2vl(work / "tiny-qwen2vl")
            tiny_store = build_tiny_store(work / "tiny-store").root
    m = MODULES
    runners = {
        "store": lambda: m["store"].section_store(tally, work, rng, args.store_kills),
        "store_images": lambda: m["store_images"].section_store_images(tally, work),
        "native_images": lambda: m["native_images"].section_native_images(tally, work, model),
        "shard_rewrite": lambda: m["shard_rewrite"].section_shard_rewrite(tally, work, model),
        "data": lambda: m["data"].section_data(tally, work),
        "malformed": lambda: m["malformed"].section_malformed(tally, work),
        "llm": lambda: m["llm"].section_llm(tally, work),
        "concurrency": lambda: m["concurrency"].section_concurrency(tally, work, rng, args.concurrency_kills),
        "training": lambda: m["training"].section_training(tally, work, rng, model, tiny_store, args.train_kills),
        "workers": lambda: m["workers"].section_workers(tally, work, model, tiny_store),
        "same_folder": lambda: m["same_folder"].section_same_folder(tally, work, model, tiny_store),
        "state_window": lambda: m["state_window"].section_state_window(tally, work, model, tiny_store),
        "sigterm": lambda: m["sigterm"].section_sigterm(tally, work, rng, model, tiny_store),
        "resume_settings": lambda: m["resume_settings"].section_resume_settings(tally, work, model, tiny_store),
        "secrets": lambda: m["secrets"].section_secrets(tally, work, model, tiny_store),
        "null_replies": lambda: m["null_replies"].section_null_replies(tally, work),
        "bad_replies": lambda: m["bad_replies"].section_bad_replies(tally, work),
        "runs_end": lambda: m["runs_end"].section_runs_end(tally, work, model, tiny_store,
                                                       picked.get("runs_end", m["runs_end"].TRIALS)),
        "launcher": lambda: m["launcher"].section_launcher(tally, work),
        "handlers": lambda: m["handlers"].section_handlers(tally, work),
        "closed_reader": lambda: m["closed_reader"].section_closed_reader(tally, work),
        "no_link": lambda: m["no_link"].section_no_link(tally, work),
        "sigint": lambda: m["sigint"].section_sigint(tally, work, rng, model, tiny_store),
    }
    timings = {}
    with beside_load(args.beside_load):
        for name in sections:
            print(f"== {name}", flush=True)
            s0 = time.monotonic()
            try:
                runners[name]()
            except Exception as e:  # noqa: BLE001 - a harness failure is reported as a lost trial, not hidden
                tally.add(name, "section set-up", False, f"{type(e).__name__}: {str(e)[-400:]}")
            timings[name] = time.monotonic() - s0
    total = time.monotonic() - t0

    print("\n| section | tried | handled | lost | what happens | time |\n|---|---|---|---|---|---|")
    for name in sections:
        rows = [x for x in tally.trials if x.section == name]
        handled = sum(x.handled for x in rows)
        print(f"| {name} | {len(rows)} | {handled} | {len(rows) - handled} | {OUTCOMES[name]} | {timings[name]:.0f}s |")
    load = f", {args.beside_load} busy process(es) beside" if args.beside_load else ""
    print(f"total {total:.0f}s{load}, workdir {work}")
    if args.json:
        Path(args.json).write_text(json.dumps({"total_s": total, "timings_s": timings, "notes": tally.notes,
                                               "trials": [vars(x) for x in tally.trials]}, indent=2))
    if not args.keep and args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    tried = len(tally.trials)
    handled = sum(x.handled for x in tally.trials)
    for text in tally.notes:
        print(f"note: {text}")
    if tried == 0:
        print("no fault was tried: nothing was checked", flush=True)
    print(f"faults: {tried} tried, {handled} handled, {tried - handled} lost", flush=True)
    return 0 if handled == tried > 0 else 1


# A busy process ends when its parent does (a SIGKILLed run must not leave the machine loaded).
_BUSY = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    for _ in range(100_000):\n        pass\n"


@contextlib.contextmanager
def beside_load(n: int):
    """``n`` processes that never sleep, for the duration."""
    if n < 0:
        raise SystemExit(f"--beside-load must be 0 or more, not {n}")
    procs = [subprocess.Popen([sys.executable, "-c", _BUSY]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


if __name__ == "__main__":
    sys.exit(main())
