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
- ``llm``: a misbehaving HTTP server on 127.0.0.1 (``tokenswap.testing.ScriptedLLMServer``, the tests'
  own): redirect to another host, slow drip, huge replies, garbage/non-UTF-8/cut bodies, null reply,
  429 with Retry-After, 500 storm, no server.
- ``concurrency``: ``tokenswap build-store`` with the LLM extractor and the validity judge at ``llm.concurrency=16``
  against ``tokenswap.testing.LoadLLMServer`` answering in a random order: SIGKILLed at random moments and
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
  the fix, the password nowhere; a tiny offline W&B training run launched with ``train.hub_token=...`` and a
  ``user:pass@`` URL in ``train.hub_model_id``: neither in the ``.wandb`` file, ``debug.log``, any
  ``training_args.bin`` nor any other file, and the run resumes from its checkpoint.
- ``null_replies``: a 200 with ``content: null`` (or none) for some requests: ``build-store`` (extract and judge
  stages) exits 1 with ``complete: false`` counting failed requests, the rerun asks them again and equals an
  uninterrupted build; ``tokenswap eval`` records them as failed, never as the answer ``""``, never scored, the rerun
  asks exactly those and equals an uninterrupted run; the bench builder records no such item, the rerun equals an
  uninterrupted run.
- ``bad_replies``: bodies of 100,000-deep nesting, a 4,400-digit integer, lone surrogates, logprobs of +1000 or NaN:
  retried by the client then failed requests (never a crash), in ``tokenswap eval`` (generate and loglik: nothing
  non-finite written, the rerun fills in) and ``build-store``; each kind of poisoned response-cache entry skipped with
  one warning naming the file and asked again; lines no run writes in ``records.jsonl`` skipped on resume.

The script checks the checkout it sits in (it puts that first on ``sys.path`` and on the subprocesses'
``PYTHONPATH``), not whatever ``tokenswap`` is installed.

Bounded in time: every subprocess has a timeout, and a section past ``--budget-s`` stops.
The last line of the output is exactly ``faults: N tried, H handled, L lost``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The checkout this script sits in is the code it checks: an installed tokenswap (a wheel, another checkout's
# editable install) must answer neither in this process nor in the subprocesses it starts.
sys.path.insert(0, str(REPO))

import tokenswap  # noqa: E402
from tokenswap.testing import ScriptedLLMServer, llm_answer, llm_reply  # noqa: E402

if Path(tokenswap.__file__).resolve().parent != REPO / "tokenswap":
    raise SystemExit(f"faults.py checks {REPO / 'tokenswap'} but imported {tokenswap.__file__}")

PY = sys.executable
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "WANDB_MODE": "offline",
    "PYTHONWARNINGS": "ignore",
}


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Hostile files and the tiny CLIP are the tests' own helpers, not copies.
hostile = _load("ts_hostile", REPO / "tests/tokenswap/store/hostile.py")


# ============================================================================ bookkeeping


@dataclass
class Trial:
    section: str
    what: str
    handled: bool
    detail: str = ""


@dataclass
class Tally:
    trials: list[Trial] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, section: str, what: str, handled: bool, detail: str = "") -> None:
        self.trials.append(Trial(section, what, bool(handled), detail))
        mark = "ok  " if handled else "LOST"
        print(f"  [{mark}] {section}: {what}" + (f"  ({detail})" if detail and not handled else ""), flush=True)

    def note(self, section: str, text: str) -> None:
        """Something the totals alone would hide (fewer faults landed than asked); repeated above the closing line."""
        self.notes.append(f"{section}: {text}")
        print(f"  note: {section}: {text}", flush=True)


OUTCOMES = {
    "store": "kill: resumes to the uninterrupted build's rows, no stale lock; concurrent: one builds, the other exits 1 "
    "naming folder + PID; changed sources/settings: exit 2 showing the difference, folder untouched; typo/negative "
    "limit: exit 2, nothing written",
    "store_images": "build completes; each file rejected by name in report.json (`images_rejected`), never stored",
    "native_images": "native: sample dropped and counted (`samples_dropped_bad_native_image`), batch goes on; store "
    "image: the concept stays text (`concepts_text_corrupt_image`)",
    "shard_rewrite": "no concept shown another's picture: each is its own (pixels equal to the intact store's) or "
    "text, counted (`concepts_text_hash_mismatch`) and warned once naming the shard; a truncation is no SIGBUS",
    "data": "skip_malformed: skipped and counted (`rows_malformed_skipped`); otherwise exit 2 / ValueError naming file "
    "and line or record; edited LLaVA file re-read",
    "malformed": "skip_malformed: every malformed row (lone surrogates, wrong field types, unknown role, null, "
    "truncated, non-UTF-8) skipped and counted, every good row kept; otherwise exit 2 naming file and line",
    "llm": "refused (redirect, oversize) or retried with backoff/Retry-After and recovered; deadline per attempt holds; "
    "errors name the URL; null reply retried, never returned or cached",
    "concurrency": "kill at concurrency 16: resumes byte-identical to concurrency 1; 429s: slowed, same bytes; dropped/"
    "stalled requests: exit 1 naming them, report complete: false, the rerun fills them in byte-identical",
    "training": "resume from the newest complete checkpoint; losses, sample_ids and swap_stats equal an uninterrupted run",
    "workers": "dataloader_num_workers=2, also stopped and resumed: losses, sample_ids, swap_stats and the checkpoints' "
    "collator state equal a run with 0 workers",
    "same_folder": "the second run on a folder exits 1 naming the holder (PID, host, since) and writes nothing; a killed "
    "holder releases it; the first run ends equal to an uninterrupted one",
    "state_window": "a checkpoint killed after trainer_state.json, before tokenswap's record: skipped on resume (said); "
    "losses, sample_ids and swap_stats equal an uninterrupted run",
    "sigterm": "a complete checkpoint at the next step end (every rank the same step), exit 143; the resume equals an "
    "uninterrupted run",
    "resume_settings": "changed run.arm / swap_prob / data.seed / max_length / pack_budget / batch size / lr: exit 2 naming "
    "each (was/now), folder untouched; max_steps and workers may change",
    "secrets": "the API key (raw, JSON-escaped, URL-encoded, plus form, cut, in a reply) in no report, marker, cache, record, "
    "summary or stderr; user:password@ base URLs: exit 2; hub token + URL credentials in no W&B file or training_args.bin",
    "null_replies": "content null/missing: a failed request (build-store complete: false, eval not scored, bench item not "
    "recorded), asked again by the rerun, which equals an uninterrupted run",
    "bad_replies": "100,000-deep nesting, 4,400-digit integers, lone surrogates, +1000/NaN logprobs: failed requests, "
    "nothing non-finite written, the rerun fills in; poisoned cache/record lines skipped (one warning) and asked again",
}


def run(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(cmd, 124, e.stdout or "", f"timed out after {timeout}s")


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.name.startswith((".build-lock-", ".train-lock-")):  # a lock names its last holder
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def files_in(root: Path) -> int:
    return sum(1 for p in root.rglob("*") if p.is_file()) if root.exists() else 0


# ============================================================================ store builds


STORE_ARGS = ["data.max_samples=150", "samples_per_shard=10", "concept_batch_size=4", "progress=false"]


def store_cmd(out: Path, *extra: str) -> list[str]:
    return [PY, "-m", "tokenswap.cli", "build-store", "--config", "store_embedded.yaml", f"output_dir={out}",
            *STORE_ARGS, *extra]


def store_rows(out: Path) -> list[tuple]:
    from tokenswap.store import ImageStore

    ds = ImageStore(out / "store").to_dataset()
    return sorted(zip(ds["key"], ds["source"], ds["image_id"]))


def dataset_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "dataset").glob("*.jsonl"))}


def same_build(out: Path, ref: Path) -> str:
    """'' when ``out`` holds the same store rows and byte-identical dataset shards as ``ref``."""
    if not (out / "report.json").exists():
        return "no report.json"
    rows = store_rows(out)
    if len(rows) != len(set(rows)):
        return f"{len(rows) - len(set(rows))} duplicate store rows"
    if rows != store_rows(ref):
        return f"store rows differ ({len(rows)} vs {len(store_rows(ref))})"
    if dataset_bytes(out) != dataset_bytes(ref):
        return "dataset shards differ"
    return ""


def section_store(t: Tally, work: Path, rng: random.Random, n_kills: int) -> None:
    ref = work / "store-ref"
    proc = run(store_cmd(ref), 300)
    if proc.returncode != 0:
        raise RuntimeError(f"reference store build failed: {proc.stderr[-2000:]}")

    # SIGKILLs at random moments; every restart must start (no stale lock) and the end must match.
    out = work / "store-killed"
    kills: list[str] = []
    refused = ""
    for _ in range(n_kills * 3):
        if len(kills) >= n_kills:
            break
        before = files_in(out)
        err_path = work / "store-killed.err"
        with open(err_path, "w") as err:
            p = subprocess.Popen(store_cmd(out), cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=err)
        target = before + rng.randint(1, 6)
        deadline = time.monotonic() + 120
        while p.poll() is None and files_in(out) < target and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.15))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            kills.append(f"after {files_in(out) - before} new files")
        p.wait()
        if "being built by another process" in err_path.read_text():
            refused = err_path.read_text()[-300:]
        if (out / "report.json").exists():
            break
    final = run(store_cmd(out), 300)
    problem = refused or (final.stderr[-300:] if final.returncode else "") or same_build(out, ref)
    for k in kills:
        t.add("store", f"SIGKILL of a store build {k}, resumed", not problem, problem)
    if len(kills) < n_kills:
        t.note("store", f"only {len(kills)} of {n_kills} store-build kills landed before the build finished")

    # Two builds on one folder at (nearly) the same time.
    for trial, delay in enumerate([0.0, 0.0, 0.5, 1.5]):
        out = work / f"store-concurrent-{trial}"
        a = subprocess.Popen(store_cmd(out), cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        b = subprocess.Popen(store_cmd(out), cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        results = [(q.wait(timeout=300), q.stderr.read()) for q in (a, b)]
        codes = sorted(code for code, _ in results)
        refusal = next((err for code, err in results if code == 1), "")
        problem = ""
        if codes == [0, 0]:
            problem = "" if delay > 0 else "both exited 0 although started together"
        elif codes != [0, 1]:
            problem = f"exit codes {codes}: {results[0][1][-200:]} {results[1][1][-200:]}"
        elif str(out) not in refusal or "pid " not in refusal:
            problem = f"refusal does not name folder and holder: {refusal[-200:]}"
        problem = problem or same_build(out, ref)
        t.add("store", f"two builds on one folder, {delay:g}s apart", not problem, problem)

    # Resuming with other plan settings is refused with the difference, and the folder is untouched.
    for override, expect in [
        (["sources=[rendered_text]", "extractor.vocabulary=[cat]"], "sources: was"),
        (["openmoji.size=64"], "source_settings.openmoji.size: was 112, now 64"),
        (["samples_per_shard=7"], "samples_per_shard: was 10, now 7"),
    ]:
        before = tree_digest(ref)
        proc = run(store_cmd(ref, *override), 120)
        ok = proc.returncode == 2 and expect in proc.stderr and tree_digest(ref) == before
        t.add("store", f"resume with {' '.join(override)}", ok, f"rc={proc.returncode} {proc.stderr[-200:]}")

    # A typo in data.path writes nothing, so the corrected command just runs.
    out = work / "store-typo"
    proc = run(store_cmd(out, f"data.path={work / 'magpie.jsonll'}"), 120)
    typo_ok = proc.returncode == 2 and "does not exist" in proc.stderr and not (out / "state").exists()
    fixed = run(store_cmd(out, "data.max_samples=20"), 300)
    t.add("store", "typo in data.path, then the corrected command", typo_ok and fixed.returncode == 0,
          f"rc={proc.returncode}/{fixed.returncode} {proc.stderr[-200:]} {fixed.stderr[-200:]}")
    out = work / "store-negative"
    proc = run(store_cmd(out, "data.max_samples=-1"), 120)
    t.add("store", "data.max_samples=-1", proc.returncode == 2 and not (out / "state").exists(),
          f"rc={proc.returncode} {proc.stderr[-200:]}")


# ============================================================================ hostile images in a store build


def section_store_images(t: Tally, work: Path) -> None:
    conftest = _load("ts_store_conftest", REPO / "tests/tokenswap/store/conftest.py")
    clip = conftest.build_tiny_clip(work / "tiny-clip")
    corpus = work / "corpus"
    bad = hostile.hostile_files(corpus)
    (corpus / "empty.png").write_bytes(b"")
    (corpus / "notes.png").write_text("this is not an image\n")
    bad += [corpus / "empty.png", corpus / "notes.png"]
    from PIL import Image

    for i, colour in enumerate(["red", "green", "blue", "yellow"]):
        Image.new("RGB", (40, 30), colour).save(corpus / f"ok{i}.png")
    data = work / "corpus-magpie.jsonl"
    rows = ["a cat and a dog", "an apple", "the dog runs", "a red apple and a cat"]
    data.write_text("".join(
        json.dumps({"uuid": f"s{i}", "conversations": [{"from": "human", "value": r}, {"from": "gpt", "value": "ok"}]})
        + "\n" for i, r in enumerate(rows)))
    out = work / "store-hostile"
    proc = run([PY, "-m", "tokenswap.cli", "build-store", f"output_dir={out}", f"data.path={data}",
                "sources=[retrieval]", "extractor.vocabulary=[cat,dog,apple]", f"retrieval.clip_path={clip}",
                f"retrieval.corpus={corpus}", "retrieval.top_k=9", "retrieval.min_score=-1", "progress=false"], 300)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    named = " ".join(r["what"] for r in report.get("rejected_images", []))
    stored = set()
    if (out / "store" / "store.json").exists():
        from tokenswap.store import ImageStore

        stored = {im.meta.get("item") for im in ImageStore(out / "store")}
    for path in bad:
        ok = proc.returncode == 0 and path.name in named and path.name not in stored
        t.add("store_images", f"{path.name} in a retrieval corpus", ok, f"rc={proc.returncode} {proc.stderr[-300:]}")


# ============================================================================ hostile images through the collator


def section_native_images(t: Tally, work: Path, model: Path) -> None:
    from PIL import Image
    from transformers import AutoProcessor

    from tokenswap.collator import TokenSwapCollator
    from tokenswap.images import BadImageError
    from tokenswap.store import ImageStore, StoreWriter

    processor = AutoProcessor.from_pretrained(model)
    root = work / "native"
    root.mkdir(exist_ok=True)
    Image.new("RGB", (64, 48), "green").save(root / "good.png")
    bad = hostile.hostile_files(root)
    (root / "empty.png").write_bytes(b"")
    Image.new("RGB", (8, 8), "red").save(work / "outside.png")
    cases = [(p.name, p.name) for p in bad] + [("empty.png", "empty.png"), ("../outside.png", "a ../ path"),
                                               (str(work / "outside.png"), "an absolute path outside image_root")]
    collator = TokenSwapCollator(processor, None, image_root=str(root), max_length=512)

    def sample(sid: str, image: str) -> dict:
        return {"id": sid, "messages": [{"role": "user", "content": "<image>\nWhat is this?"},
                                        {"role": "assistant", "content": "A picture."}],
                "concepts": [], "images": [image]}

    for image, label in cases:
        before = collator.stats["samples_dropped_bad_native_image"]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                batch = collator([sample("good", "good.png"), sample("bad", image)])
            dropped = collator.stats["samples_dropped_bad_native_image"] - before
            ok = dropped == 1 and batch["input_ids"].shape[0] == 1
            detail = f"dropped={dropped}, rows={batch['input_ids'].shape[0]}"
        except Exception as e:  # noqa: BLE001 - any exception here is the fault we look for
            ok, detail = False, f"{type(e).__name__}: {e}"
        t.add("native_images", f"native image: {label} in a batch with a good sample", ok, detail)

    # Store images: StoreWriter refuses hostile bytes; one planted in a shard anyway (an old or
    # tampered store) leaves its swapped concept as text.
    for kind, make in [("bomb", hostile.bomb_png), ("sliver", hostile.sliver_png), ("truncated", hostile.truncated_jpeg)]:
        data = make(work / f"planted-{kind}.{'jpg' if kind == 'truncated' else 'png'}").read_bytes()
        store_root = work / f"store-{kind}"
        if kind != "truncated":  # a truncated file has a good header; StoreWriter reads headers only
            try:
                with StoreWriter(store_root / "refused") as w:
                    w.add("cat", data, source="test")
                t.add("native_images", f"StoreWriter.add of {kind} bytes", False, "accepted")
            except BadImageError as e:
                t.add("native_images", f"StoreWriter.add of {kind} bytes", "cat" in str(e), str(e))
        _plant(store_root, "cat", data)
        collator = TokenSwapCollator(processor, ImageStore(store_root), max_length=512)
        text = "Draw a cat please"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                collator([{"id": "s", "messages": [{"role": "user", "content": text},
                                                   {"role": "assistant", "content": "ok"}],
                           "concepts": [{"message": 0, "start": 7, "end": 10, "key": "cat"}], "images": []}])
            ok = collator.stats["concepts_text_corrupt_image"] == 1 and collator.stats["concepts_swapped"] == 0
            detail = dict(collator.stats)
        except Exception as e:  # noqa: BLE001
            ok, detail = False, f"{type(e).__name__}: {e}"
        t.add("native_images", f"store image of a swapped concept: {kind}", ok, str(detail))


def _plant(root: Path, concept: str, data: bytes) -> None:
    """Write a store shard holding ``data`` as-is, bypassing StoreWriter's checks."""
    import pyarrow as pa

    from tokenswap.files import atomic_write
    from tokenswap.store import StoreWriter
    from tokenswap.store.image_store import SCHEMA, image_id_of

    StoreWriter(root).close()  # store.json
    row = {"key": concept, "concept": concept, "image_id": image_id_of(data), "image": data, "source": "planted",
           "score": 1.0, "width": 0, "height": 0, "meta": "{}"}
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, SCHEMA) as writer:
        writer.write_table(pa.Table.from_pylist([row], schema=SCHEMA))
    atomic_write(root / "shards" / "part-r000-000000.arrow", sink.getvalue().to_pybytes())


# ============================================================================ shards changed under a reader


REWRITE_CONCEPTS = ["cat", "dog", "apple", "tree", "car", "boat", "house", "bird"]


def _noisy_store(root: Path, order: list[str]) -> Path:
    """One shard of 8 concepts, each a distinct ~12 kB picture (noise on its own colour); the shard's path."""
    from PIL import Image

    from tokenswap.store import StoreWriter

    colours = ["red", "blue", "green", "yellow", "purple", "orange", "black", "white"]
    with StoreWriter(root) as w:
        for concept in order:
            colour = colours[REWRITE_CONCEPTS.index(concept)]
            noise = Image.frombytes("RGB", (64, 64), random.Random(concept).randbytes(64 * 64 * 3))
            w.add(concept, Image.blend(Image.new("RGB", (64, 64), colour), noise, 0.5), source="faults")
    (shard,) = (root / "shards").glob("*.arrow")
    return shard


def _concept_sample(concept: str) -> dict:
    text = f"Draw a {concept} please"
    return {"id": concept, "messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}],
            "concepts": [{"message": 0, "start": 7, "end": 7 + len(concept), "key": concept}], "images": []}


def section_shard_rewrite(t: Tally, work: Path, model: Path) -> None:
    from transformers import AutoProcessor

    from tokenswap.collator import TokenSwapCollator
    from tokenswap.store import ImageStore

    processor = AutoProcessor.from_pretrained(model)

    def pictures(collator) -> tuple[dict, list[str]]:
        """Per concept: its pixels, or None when it stayed text; and the warnings the batch raised."""
        got = {}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for c in REWRITE_CONCEPTS:
                batch = collator([_concept_sample(c)])
                got[c] = batch["pixel_values"].clone() if "pixel_values" in batch else None
        return got, [str(w.message) for w in caught if "content hash" in str(w.message)]

    def judge(what: str, got: dict, ref: dict, warned: list[str], collator, expect_text: set[str], shard) -> None:
        wrong = [c for c, px in got.items() if px is not None and not (px.shape == ref[c].shape and (px == ref[c]).all())]
        text = {c for c, px in got.items() if px is None}
        counted = collator.stats["concepts_text_hash_mismatch"]
        ok = (not wrong and text == expect_text and counted == len(expect_text)
              and (len(warned) == 1 and str(shard) in warned[0] if expect_text else not warned))
        t.add("shard_rewrite", what, ok, f"wrong picture for {wrong}, text {sorted(text)} (expected "
              f"{sorted(expect_text)}), counted {counted}, warnings {warned[:1]}")

    def fresh(name: str, order=REWRITE_CONCEPTS):
        """A store whose every picture was read once (hashed, and then trusted while the file stays unchanged),
        and a collator with an empty pixel cache, so what it shows next comes from the file as it is then."""
        shard = _noisy_store(work / name, order)
        store = ImageStore(work / name)
        pictures(TokenSwapCollator(processor, store, max_length=512, dummy_image=False))
        return shard, store, TokenSwapCollator(processor, store, max_length=512, dummy_image=False)

    shard, _, collator = fresh("rewrite-ref")
    ref, _ = pictures(collator)
    if any(px is None for px in ref.values()):
        t.add("shard_rewrite", "intact store shows every concept's picture", False, str(collator.stats))
        return

    # cp over the live shard: a rebuild that put the concepts in another order (same inode, other bytes).
    shard, _, collator = fresh("rewrite-cp")
    other = _noisy_store(work / "rewrite-cp-rebuilt", REWRITE_CONCEPTS[::-1])
    shutil.copyfile(other, shard)
    got, warned = pictures(collator)
    judge("cp of a rebuilt shard over the live one", got, ref, warned, collator, set(REWRITE_CONCEPTS), shard)

    # rsync --inplace / a bad disk: 4 bytes inside one picture changed, the rest of the file as it was.
    shard, store, collator = fresh("rewrite-inplace")
    data = shard.read_bytes()
    at = data.index(store.get("apple")[0].load_bytes()) + 6000
    with open(shard, "r+b") as f:
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in data[at : at + 4]))
    got, warned = pictures(collator)
    judge("4 bytes of one picture rewritten in place", got, ref, warned, collator, {"apple"}, shard)

    # Replaced by rename, as StoreWriter and a rebuild write: the open reader keeps the file it indexed.
    shard, _, collator = fresh("rewrite-rename")
    other = _noisy_store(work / "rewrite-rename-rebuilt", REWRITE_CONCEPTS[::-1])
    os.replace(other, shard)
    got, warned = pictures(collator)
    judge("a rebuilt shard renamed over the live one", got, ref, warned, collator, set(), shard)

    # Truncated in place, in a child: a memory-mapped read past the new end is SIGBUS (rc -7), no message.
    shard = _noisy_store(work / "rewrite-truncate", REWRITE_CONCEPTS)
    half = shard.stat().st_size // 2
    code = f"""
import os, warnings
from tokenswap.store import ImageStore
store = ImageStore({str(work / "rewrite-truncate")!r})
before = {{c: store.get(c)[0].image_id for c in {REWRITE_CONCEPTS!r}}}
os.truncate({str(shard)!r}, {half})
served = refused = 0
for c in before:
    try:
        store.get(c)[0].load(); served += 1
    except Exception as e:
        refused += 1; message = str(e)
print(served, refused)
print(message)
"""
    proc = run([PY, "-c", code], 120)
    lines = proc.stdout.splitlines()
    ok = (proc.returncode == 0 and len(lines) >= 2 and sum(map(int, lines[0].split())) == 8
          and int(lines[0].split()[1]) >= 4 and str(shard) in lines[1] and "truncated in place" in lines[1])
    t.add("shard_rewrite", "a shard truncated in place under a reader (child process)", ok,
          f"rc {proc.returncode}, {proc.stdout[-300:]!r} {proc.stderr[-300:]!r}")


# ============================================================================ malformed data


def _magpie(i: int) -> bytes:
    return json.dumps({"uuid": f"u{i}", "conversations": [{"from": "human", "value": f"a cat number {i}"},
                                                         {"from": "gpt", "value": "ok"}]}).encode() + b"\n"


def section_data(t: Tally, work: Path) -> None:
    from tokenswap.data.llava import load_llava
    from tokenswap.data.schema import load_samples

    bad_lines = {
        "truncated line": _magpie(100)[:30] + b"\n",
        "non-UTF-8 line": b'{"uuid": "x", "conversations": "\xff\xfe"}\n',
        "list-shaped line": b"[1, 2, 3]\n",
        "number line": b"42\n",
        "row with empty conversations": b'{"uuid": "u9", "conversations": []}\n',
    }
    path = work / "magpie-malformed.jsonl"
    path.write_bytes(b"".join(_magpie(i) + line for i, line in enumerate(bad_lines.values())) + _magpie(99))
    out = work / "store-malformed"
    proc = run(store_cmd(out, f"data.path={path}", "data.skip_malformed=true", "data.max_samples=null"), 300)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    ok = proc.returncode == 0 and report.get("rows_malformed_skipped") == len(bad_lines)
    for what in bad_lines:
        t.add("data", f"Magpie {what}, skip_malformed=true", ok,
              f"rc={proc.returncode} skipped={report.get('rows_malformed_skipped')} {proc.stderr[-200:]}")
    strict = run(store_cmd(work / "store-malformed-strict", f"data.path={path}", "data.max_samples=null"), 300)
    t.add("data", "Magpie truncated line, skip_malformed=false", strict.returncode == 2 and f"{path.name}:2" in strict.stderr,
          f"rc={strict.returncode} {strict.stderr[-200:]}")

    def expect_error(what: str, fn: Callable, *needles: str) -> None:
        try:
            fn()
            ok, detail = False, "no error"
        except (ValueError, KeyError, FileNotFoundError) as e:
            ok, detail = all(n in str(e) for n in needles), str(e)[:200]
        except Exception as e:  # noqa: BLE001
            ok, detail = False, f"{type(e).__name__}: {e}"
        t.add("data", what, ok, detail)

    good = {"id": "s0", "messages": [{"role": "user", "content": "a cat"}, {"role": "assistant", "content": "ok"}],
            "concepts": [{"message": 0, "start": 2, "end": 5, "key": "cat"}], "images": []}
    swap = work / "swap-bad-span.jsonl"
    swap.write_text(json.dumps(good) + "\n" + json.dumps({**good, "id": "s1", "concepts": [
        {"message": 0, "start": 2, "end": 50, "key": "cat"}]}) + "\n")
    expect_error("swap dataset span out of range", lambda: load_samples(str(swap)), f"{swap.name}:2", "s1", "out of range")
    torn = work / "swap-torn.jsonl"
    torn.write_text(json.dumps(good) + "\n" + json.dumps(good)[:40] + "\n")
    expect_error("swap dataset torn last line", lambda: load_samples(str(torn)), f"{torn.name}:2", "not valid JSON")
    empty = work / "llava-empty.json"
    empty.write_text("")
    expect_error("empty LLaVA file", lambda: load_llava(empty), "llava-empty.json", "empty")
    odd = work / "llava-odd.json"
    odd.write_text('[{"id": "a", "conversations": [{"from": "human", "value": "hi"}]}, "oops"]')
    expect_error("LLaVA record that is not an object", lambda: load_llava(odd), "record 1")
    edited = work / "llava-edited.json"
    rec = {"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "ok"}]}
    edited.write_text(json.dumps([rec]))
    first = len(load_llava(edited))
    time.sleep(0.01)
    edited.write_text(json.dumps([rec, {**rec, "id": "b"}]))
    second = len(load_llava(edited))
    t.add("data", "LLaVA file edited in place after caching", (first, second) == (1, 2), f"rows {first} then {second}")


# ============================================================================ misbehaving LLM server


def _drip(h) -> None:
    body = llm_answer("slow")
    h.send_response(200)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    for byte in body:
        h.wfile.write(bytes([byte]))
        h.wfile.flush()
        time.sleep(0.1)


def _flood(h) -> None:
    h.send_response(200)
    h.send_header("Connection", "close")
    h.end_headers()
    for _ in range(400):  # 25 MB without Content-Length
        h.wfile.write(b"x" * 65536)


def section_llm(t: Tally, work: Path) -> None:
    from tokenswap.inference import LLMRequestError, OpenAIChatModel

    server, other = ScriptedLLMServer(), ScriptedLLMServer()
    msg = [{"role": "user", "content": "hi"}]
    os.environ["TS_FAULTS_KEY"] = "sk-faults-secret"

    def client(**kw) -> OpenAIChatModel:
        kw.setdefault("max_backoff", 0.1)
        return OpenAIChatModel(server.base_url, "m", api_key_env="TS_FAULTS_KEY", **kw)

    def check(what: str, script: list[Callable], fn: Callable[[], tuple[bool, str]]) -> None:
        server.script = list(script)
        try:
            ok, detail = fn()
        except Exception as e:  # noqa: BLE001
            ok, detail = False, f"{type(e).__name__}: {e}"
        t.add("llm", what, ok, detail)

    def raises(model: OpenAIChatModel, *needles: str, within: float = 30.0) -> tuple[bool, str]:
        t0 = time.monotonic()
        try:
            model.chat(msg)
            return False, "no error"
        except LLMRequestError as e:
            dt = time.monotonic() - t0
            return all(n in str(e) for n in needles) and dt < within and "sk-faults" not in str(e), f"{dt:.1f}s {e}"

    def recovers(model: OpenAIChatModel, answer: str = "fine", min_s: float = 0.0) -> tuple[bool, str]:
        t0 = time.monotonic()
        got = model.chat(msg)
        dt = time.monotonic() - t0
        return got == answer and dt >= min_s, f"{got!r} after {dt:.1f}s"

    check("302 redirect to another host", [llm_reply(b"", 302, {"Location": f"{other.base_url}/chat/completions"})],
          lambda: (raises(client(), "HTTP 302")[0] and not other.headers, f"other host hits={len(other.headers)}"))
    check("server drips one byte per 0.1 s (timeout=1 s, 1 retry)", [_drip, _drip],
          lambda: raises(client(timeout=1.0, max_retries=1), "deadline", server.base_url, within=4.0))
    check("reply announcing 300 MB", [llm_reply(b"", length=300 << 20)],
          lambda: raises(client(max_response_bytes=1 << 20), "max_response_bytes"))
    check("reply streaming 25 MB without Content-Length", [_flood],
          lambda: raises(client(max_response_bytes=1 << 20), "max_response_bytes"))
    for what, bad in [("garbage JSON", llm_reply(b"<html>oops</html>")),
                      ("non-UTF-8 body", llm_reply(b"\xff\xfe" + llm_answer("x"))),
                      ("body cut short", llm_reply(llm_answer("fine")[:15], length=len(llm_answer("fine")))),
                      ("HTTP 500", llm_reply(b"boom", 500))]:
        check(f"{what}, then a good reply", [bad, llm_reply(llm_answer("fine"))],
              lambda: recovers(client(max_retries=2)))
    check("429 with Retry-After: 1",
          [llm_reply(b"slow down", 429, {"Retry-After": "1"}), llm_reply(llm_answer("fine"))],
          lambda: recovers(client(max_retries=1, max_backoff=5), min_s=1.0))
    check("500 on every attempt", [llm_reply(b"boom", 500)] * 3,
          lambda: raises(client(max_retries=2), "failed after 3 attempts", server.base_url))

    def null_not_cached() -> tuple[bool, str]:
        cache = work / "llm-cache.jsonl"
        model = client(cache_path=cache)
        first = model.chat(msg)  # the null reply is a failed attempt: retried, never returned as ""
        second = model.chat(msg)
        # Not the attempt count: a pooled connection the server closed is retried, and that is no cache hit.
        served = model.stats.as_dict()
        return (first, second, served["cached"], served["replies"]) == ("real", "real", 1, 1), \
            f"{first!r}, {second!r}, {served}"

    check("null reply", [llm_reply(llm_answer(None)), llm_reply(llm_answer("real"))], null_not_cached)
    check("no server listening", [], lambda: raises(
        OpenAIChatModel("http://127.0.0.1:9/v1", "m", max_retries=1, max_backoff=0.05, timeout=2), "127.0.0.1:9"))
    server.close()
    other.close()


# ============================================================================ many requests in flight


def llm_build_cmd(out: Path, base_url: str, concurrency: int, *extra: str) -> list[str]:
    return [PY, "-m", "tokenswap.cli", "build-store", "--config", "store_generate.yaml", f"output_dir={out}",
            "data.path=fixture", "data.max_samples=96", "sources=[rendered_text]", "extractor.kind=llm",
            "extractor.llm.model=m", f"extractor.llm.base_url={base_url}", f"extractor.llm.concurrency={concurrency}",
            "judge.llm.model=v", f"judge.llm.base_url={base_url}", f"judge.llm.concurrency={concurrency}",
            "samples_per_shard=8", "concept_batch_size=8", "progress=false", *extra]


def llm_build_files(out: Path) -> dict[str, bytes]:
    """Candidate chunks, store shards, dataset shards and the plan: what must not depend on completion order."""
    files = {}
    for p in sorted(out.rglob("*")):
        rel = p.relative_to(out).as_posix()
        if p.is_file() and not rel.startswith(("state/cache/", ".build-lock")) and "/done-" not in rel \
                and rel != "report.json":
            files[rel] = p.read_bytes()
    return files


LLM_COUNTS = ("samples_read", "samples_kept", "concepts_found", "concepts_with_images", "store_images", "spans")


def same_llm_build(out: Path, ref: Path) -> str:
    """'' when ``out`` is complete and byte-identical to ``ref`` (files and report counts)."""
    if not (out / "report.json").exists():
        return "no report.json"
    report, want = json.loads((out / "report.json").read_text()), json.loads((ref / "report.json").read_text())
    if not report.get("complete"):
        return f"report.json says complete={report.get('complete')}"
    a, b = llm_build_files(out), llm_build_files(ref)
    if a.keys() != b.keys():
        return f"files differ: {sorted(a.keys() ^ b.keys())[:4]}"
    differ = [k for k in a if a[k] != b[k]]
    if differ:
        return f"{len(differ)} files differ, e.g. {differ[:3]}"
    counts = {k: report[k] for k in LLM_COUNTS}
    return "" if counts == {k: want[k] for k in LLM_COUNTS} else f"counts {counts} vs {[want[k] for k in LLM_COUNTS]}"


def _until(reached: Callable[[], bool], p: subprocess.Popen, progress: Callable[[], object],
           stall_s: float = 600) -> str:
    """Wait until ``reached()`` or ``p`` ended (''), polling; a process whose ``progress()`` stayed the same for
    ``stall_s`` seconds is hung (said). The only clock here detects a hang: it never decides where a fault lands."""
    seen, since = progress(), time.monotonic()
    while p.poll() is None and not reached():
        now = progress()
        if now != seen:
            seen, since = now, time.monotonic()
        elif time.monotonic() - since > stall_s:
            return f"no progress for {stall_s:g}s (hung)"
        time.sleep(0.002)
    return ""


def section_concurrency(t: Tally, work: Path, rng: random.Random, n_kills: int) -> None:
    from tokenswap.testing import LoadLLMServer, concept_reply

    delays = random.Random(1)
    server = LoadLLMServer(concept_reply, latency=lambda payload: delays.uniform(0.0, 0.04))
    try:
        ref = work / "llm-ref"
        proc = run(llm_build_cmd(ref, server.base_url, 1), 1800)
        if proc.returncode != 0:
            raise RuntimeError(f"reference build at concurrency 1 failed: {proc.stderr[-2000:]}")

        # SIGKILLs at random points of a build's own progress (the r-th reply the server sent it, or the k-th new file
        # it wrote), each followed by the same command. No wait in seconds decides where a kill lands: a loaded
        # machine reaches the same points later, not other ones, and a hung build is the only thing a clock ends.
        out = work / "llm-killed"
        kills: list[str] = []
        for attempt in range(n_kills * 3):
            if len(kills) >= n_kills:
                break
            files0, replies0 = files_in(out), len(server.requests)
            if attempt % 2 == 0:
                n = rng.randint(1, 24)
                reached = lambda n=n, r=replies0: len(server.requests) - r >= n  # noqa: E731
            else:
                n = rng.randint(1, 4)
                reached = lambda n=n, f=files0: files_in(out) - f >= n  # noqa: E731
            p = subprocess.Popen(llm_build_cmd(out, server.base_url, 16), cwd=REPO, env=ENV,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            hung = _until(reached, p, progress=lambda: (len(server.requests), files_in(out)))
            running = p.poll() is None
            killed = running and not hung
            if running:
                p.send_signal(signal.SIGKILL)
                if hung:
                    t.add("concurrency", "a build at concurrency 16", False, hung)
                else:
                    kills.append(f"after {len(server.requests) - replies0} replies and {files_in(out) - files0} new "
                                 f"files, {server.in_flight} requests in flight")
            p.wait()
            if killed:  # what the dead writer left half-written: the restart must remove it
                stray = sum(1 for q in out.rglob("*.tmp") if not q.is_relative_to(out / "state" / "cache"))
                kills[-1] += f", {stray} temporary file(s) left"
            if (out / "report.json").exists():
                break
        final = run(llm_build_cmd(out, server.base_url, 16), 1800)
        problem = (final.stderr[-300:] if final.returncode else "") or same_llm_build(out, ref)
        for k in kills:
            t.add("concurrency", f"SIGKILL at concurrency 16 {k}, resumed", not problem, problem)
        if len(kills) < n_kills:
            t.note("concurrency", f"only {len(kills)} of {n_kills} kills landed before the build finished")

        # A rate-limited API: 4 at once, 429 + Retry-After beyond. Slowed down, same bytes.
        server.rate_limit, server.retry_after, server.rejected = 4, 0.3, 0
        out = work / "llm-429"
        # Retries enough for any load: a busy machine serves each slot slower, so more requests meet a full server.
        proc = run(llm_build_cmd(out, server.base_url, 16, "extractor.llm.max_retries=1000",
                                 "judge.llm.max_retries=1000"), 1800)
        rejected = server.rejected
        server.rate_limit = None
        problem = (proc.stderr[-300:] if proc.returncode else "") or same_llm_build(out, ref)
        if not problem and rejected == 0:
            problem = "the server refused nothing: the trial tried no 429"
        t.add("concurrency", f"rate-limited server (4 at once, {rejected} answers 429 + Retry-After)", not problem,
              problem)

        # Requests that fail for good: counted and named, never "no concepts"; the rerun fills them in.
        def dropping(payload):
            if "apple" in json.dumps(payload).lower():
                raise ConnectionError("scripted drop")
            return concept_reply(payload)

        def stalling(payload):
            # Held 12x past the client's 5 s deadline; a loaded machine answers the others well within it.
            return 60.0 if "apple" in json.dumps(payload).lower() else delays.uniform(0.0, 0.04)

        for what, reply, latency in [("drops the connection", dropping, server.latency),
                                     ("stalls past the deadline", concept_reply, stalling)]:
            out = work / f"llm-fail-{what.split()[0]}"
            server.reply, normal = reply, server.latency
            server.latency = latency
            cmd = llm_build_cmd(out, server.base_url, 16, "extractor.llm.max_retries=1", "extractor.llm.timeout=5",
                                "judge.llm.max_retries=1", "judge.llm.timeout=5")
            first = run(cmd, 1800)
            server.reply, server.latency = concept_reply, normal
            report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
            failed = report.get("failed_requests", 0)
            problem = ""
            if first.returncode != 1 or "failed for good" not in first.stderr:
                problem = f"first run rc={first.returncode} {first.stderr[-300:]}"
            elif report.get("complete") is not False or not failed:
                problem = f"report.json: complete={report.get('complete')} failed_requests={failed}"
            else:
                second = run(cmd, 1800)
                problem = (second.stderr[-300:] if second.returncode else "") or same_llm_build(out, ref)
            t.add("concurrency", f"server {what} for some rows ({failed} failed): exit 1, rerun fills them in",
                  not problem, problem)
    finally:
        server.close()


# ============================================================================ training kills


def _file_state(path: Path) -> tuple[int, int] | None:
    """(size, mtime) of a file, None while it does not exist."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns


TRAIN_STEPS = 16  # save_steps=2: room for the 3 mid-save and 3 random kills before the run ends


def train_cmd(out: Path, model: Path, store: Path, *extra: str, steps: int = TRAIN_STEPS) -> list[str]:
    return [PY, "recipes/post_train.py", "--config", "tiny/post_tokenswap.yaml", f"run.output_dir={out}",
            f"model.name_or_path={model}", f"image_store={store}", f"train.max_steps={steps}", "train.save_steps=2",
            "gap_eval.bench=null", *extra]


def run_logs(out: Path) -> dict:
    history = json.loads((out / "log_history.json").read_text())
    return {
        "losses": [(h["step"], h["loss"]) for h in history if "loss" in h],
        "sample_ids": (out / "sample_ids.rank0.txt").read_text().splitlines(),
        "swap_stats": json.loads((out / "swap_stats.json").read_text()),
    }


CACHE_COUNTERS = {"image_decodes"}


def compare_logs(out: Path, ref: dict) -> str:
    try:
        got = run_logs(out)
    except (OSError, ValueError, KeyError) as e:
        return f"logs unreadable: {e}"
    problems = []
    if [s for s, _ in got["losses"]] != [s for s, _ in ref["losses"]] or any(
        abs(a - b) > 1e-5 * max(1.0, abs(b)) for (_, a), (_, b) in zip(got["losses"], ref["losses"])
    ):
        problems.append(f"losses {got['losses']} vs {ref['losses']}")
    if got["sample_ids"] != ref["sample_ids"]:
        problems.append(f"sample_ids {len(got['sample_ids'])} lines vs {len(ref['sample_ids'])}")
    # image_decodes counts work of the pixel cache, which a restarted process starts cold.
    a, b = ({k: v for k, v in d["swap_stats"].items() if k not in CACHE_COUNTERS} for d in (got, ref))
    if a != b:
        problems.append(f"swap_stats differ: {sorted((k, a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k))}")
    return "; ".join(problems)


def section_training(t: Tally, work: Path, rng: random.Random, model: Path, store: Path, n_kills: int) -> None:
    from tokenswap.training import COMPLETE_MARKER

    ref_out = work / "train-ref"
    proc = run(train_cmd(ref_out, model, store), 600)
    if proc.returncode != 0:
        raise RuntimeError(f"reference training run failed: {proc.stderr[-2000:]}")
    ref = run_logs(ref_out)
    # Seconds per optimizer step of the reference run, so a "random moment" lands within the next few steps:
    # on an idle machine the tiny run trains 16 steps in under a second, and the earlier fixed 0-3 s delay let
    # it finish before the kill (fewer kills tried than asked for).
    history = json.loads((ref_out / "log_history.json").read_text())
    step_s = max(h["train_runtime"] for h in history if "train_runtime" in h) / TRAIN_STEPS

    out = work / "train-killed"
    # Half the kills (rounded up) must land mid-save: while a new checkpoint folder is still partial.
    want = {"save": (n_kills + 1) // 2, "random": n_kills // 2}
    landed = {"save": 0, "random": 0}
    kills: list[str] = []
    problem = ""
    finished = False
    for attempt in range(3 * n_kills):
        if landed["save"] >= want["save"] and landed["random"] >= want["random"]:
            break
        resume = ["train.resume_from_checkpoint=latest"] if any(out.glob("checkpoint-*")) else []
        seen = {p.name for p in out.glob("*checkpoint-*")} if out.exists() else set()
        log = work / f"train-attempt-{attempt}.log"
        with open(log, "w") as f:
            p = subprocess.Popen(train_cmd(out, model, store, *resume), cwd=REPO, env=ENV, stdout=f, stderr=f)
        kind = "save" if landed["save"] < want["save"] and (
            landed["random"] >= want["random"] or landed["save"] <= landed["random"]) else "random"
        deadline = time.monotonic() + 300
        if kind == "save":  # kill the moment a new checkpoint folder appears: mid-save
            while p.poll() is None and time.monotonic() < deadline:
                if any(d.name not in seen for d in (out.glob("*checkpoint-*") if out.exists() else [])):
                    time.sleep(rng.uniform(0.0, 0.005))
                    break
                time.sleep(0.002)
        else:  # a random moment within the next few steps, once this attempt has started training
            ids = out / "sample_ids.rank0.txt"
            # The first batch trained writes the id log, or a resumed run rewinds it first: either changes it.
            start = _file_state(ids)
            while p.poll() is None and time.monotonic() < deadline and _file_state(ids) == start:
                time.sleep(0.005)
            time.sleep(rng.uniform(0.5, 3.0) * step_s)
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()
            # What the kill hit is read from the folder it froze, not guessed before the signal.
            new = sorted(d for d in (out.glob("*checkpoint-*") if out.exists() else []) if d.name not in seen)
            partial = [d.name for d in new if not (d / COMPLETE_MARKER).exists()]
            if kind == "save" and partial:
                landed["save"] += 1
                kills.append(f"during the save of {partial[0]} (partial at the kill)")
            elif kind == "save":
                landed["random"] += 1  # a kill all the same, but not mid-save
                kills.append(f"just after {new[0].name} was complete (not counted as mid-save)")
            else:
                landed["random"] += 1
                where = f", {partial[0]} partial" if partial else ""
                kills.append(f"at a random moment in training{where}")
            continue
        p.wait()
        finished = True
        if p.returncode != 0:
            problem = f"attempt {attempt} failed (rc={p.returncode}): {log.read_text()[-400:]}"
        break  # finished (or failed) before the kill
    if not problem and not (finished and (out / "log_history.json").exists()):
        resume = ["train.resume_from_checkpoint=latest"] if any(out.glob("checkpoint-*")) else []
        final = run(train_cmd(out, model, store, *resume), 600)
        problem = f"final resume failed: {final.stderr[-400:]}" if final.returncode else ""
    problem = problem or compare_logs(out, ref)
    for k in kills:
        t.add("training", f"SIGKILL {k}, resumed with resume_from_checkpoint=latest", not problem, problem)
    if not kills:
        t.add("training", "SIGKILL of training", False, problem or "the run finished before any kill")
    # Fewer faults tried than asked: say so rather than report a smaller total quietly.
    if len(kills) < n_kills:
        t.note("training", f"only {len(kills)} of {n_kills} training kills landed before the run finished")
    if landed["save"] < want["save"]:
        t.note("training", f"only {landed['save']} of {want['save']} mid-save kills hit a partial checkpoint")
    # A scheduler that relaunches a job which had already finished: the same command must change nothing.
    if not problem:
        again = run(train_cmd(out, model, store, "train.resume_from_checkpoint=latest"), 600)
        problem = f"rc={again.returncode}: {again.stderr[-300:]}" if again.returncode else compare_logs(out, ref)
        t.add("training", "relaunch of the finished run with resume_from_checkpoint=latest", not problem, problem)


# ============================================================================ dataloader workers


def _collator_state(out: Path, step: int) -> dict | None:
    """The collator state checkpoint-``step`` resumes from, without the pixel-cache counters."""
    try:
        state = json.loads((out / f"checkpoint-{step}" / "tokenswap_state.rank0.json").read_text())["collator"]
    except (OSError, ValueError, KeyError) as e:
        return {"unreadable": str(e)}
    if state is None:
        return None
    return {"log_bytes": state.get("log_bytes"),
            "stats": {k: v for k, v in state.get("stats", {}).items() if k not in CACHE_COUNTERS}}


def section_workers(t: Tally, work: Path, model: Path, store: Path) -> None:
    """Collation in 2 data-loader worker processes: the bookkeeping must equal a run with 0 workers."""
    steps = ["train.max_steps=4", "train.save_steps=2"]
    runs = {}
    for name, workers in (("workers-0", 0), ("workers-2", 2)):
        out = runs[name] = work / name
        proc = run(train_cmd(out, model, store, *steps, f"train.dataloader_num_workers={workers}"), 600)
        if proc.returncode != 0:
            raise RuntimeError(f"{name} run failed (rc={proc.returncode}): {proc.stderr[-1000:]}")
    # Stopped after checkpoint-2 (the workers had collated batches ahead of it), then resumed, with 2 workers.
    out = runs["workers-2, stopped at checkpoint-2 and resumed"] = work / "workers-2-resumed"
    for extra in (["train.max_steps=2"], ["train.resume_from_checkpoint=latest"]):
        proc = run(train_cmd(out, model, store, *steps, "train.dataloader_num_workers=2", *extra), 600)
        if proc.returncode != 0:
            raise RuntimeError(f"resumed workers run failed (rc={proc.returncode}): {proc.stderr[-1000:]}")
    ref_out = runs.pop("workers-0")
    ref = run_logs(ref_out)
    for name, out in runs.items():
        try:
            got = run_logs(out)
        except (OSError, ValueError, KeyError) as e:
            t.add("workers", f"dataloader_num_workers=2 ({name}): run logs", False, f"unreadable: {e}")
            continue
        close = [s for s, _ in got["losses"]] == [s for s, _ in ref["losses"]] and all(
            abs(a - b) <= 1e-5 * max(1.0, abs(b)) for (_, a), (_, b) in zip(got["losses"], ref["losses"]))
        t.add("workers", f"{name}: losses equal to 0 workers", close, f"{got['losses']} vs {ref['losses']}")
        t.add("workers", f"{name}: sample_ids.rank0.txt equal to 0 workers", got["sample_ids"] == ref["sample_ids"],
              f"{len(got['sample_ids'])} lines vs {len(ref['sample_ids'])}")
        a, b = ({k: v for k, v in d["swap_stats"].items() if k not in CACHE_COUNTERS} for d in (got, ref))
        t.add("workers", f"{name}: swap_stats.json equal to 0 workers", a == b,
              f"{len(a)} keys vs {len(b)}; differ: {sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))[:6]}")
        states = [(_collator_state(out, s), _collator_state(ref_out, s)) for s in (2, 4)]
        t.add("workers", f"{name}: checkpoint collator state equal to 0 workers", all(x == y for x, y in states),
              f"checkpoint-2: {states[0][0]} vs {states[0][1]}"[:300])


# ============================================================================ one folder, the save window, SIGTERM, changed settings

PAUSE_ENV = "TOKENSWAP_FAULT_SAVE_PAUSE_S"  # tokenswap.training.checkpoint.FAULT_PAUSE_ENV
PAUSE_LINE = "has trainer_state.json, no tokenswap state yet"


def _train_reference(work: Path, model: Path, store: Path) -> dict:
    """The uninterrupted 16-step run the training sections compare with (built once per workdir)."""
    ref_out = work / "train-ref"
    if not (ref_out / "log_history.json").exists():
        proc = run(train_cmd(ref_out, model, store), 600)
        if proc.returncode != 0:
            raise RuntimeError(f"reference training run failed: {proc.stderr[-2000:]}")
    return run_logs(ref_out)


def _start(cmd: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen(cmd, cwd=REPO, env={**ENV, **(env or {})}, stdout=f, stderr=subprocess.STDOUT)


def _wait_text(p: subprocess.Popen, log: Path, text: str, timeout: float = 300) -> bool:
    """Wait until ``text`` is in ``log`` (True), or the process ended or the time ran out (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return True
        if p.poll() is not None:
            return text in log.read_text(errors="replace")
        time.sleep(0.05)
    return False


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.kill()
    p.wait()


def _resume_to_end(out: Path, model: Path, store: Path, ref: dict) -> str:
    """'' when resuming ``out`` with ``latest`` finishes and equals the reference run."""
    proc = run(train_cmd(out, model, store, "train.resume_from_checkpoint=latest"), 600)
    if proc.returncode != 0:
        return f"resume rc={proc.returncode}: {proc.stderr[-400:]}"
    return compare_logs(out, ref)


def section_same_folder(t: Tally, work: Path, model: Path, store: Path) -> None:
    """Two training runs on one run.output_dir: the second exits 1 naming the holder; nothing of the first is lost."""
    ref = _train_reference(work, model, store)
    for name, extra in (("the same config", []), ("another arm (run.arm=text)", ["run.arm=text"])):
        out = work / f"concurrent-{len(extra)}"
        log = work / f"concurrent-{len(extra)}-first.log"
        first = _start(train_cmd(out, model, store), log, {PAUSE_ENV: "120@4"})  # held mid-run at checkpoint-4
        problem = ""
        try:
            if not _wait_text(first, log, PAUSE_LINE):
                problem = f"the first run never reached checkpoint-4: {log.read_text()[-300:]}"
            else:
                ids = (out / "sample_ids.rank0.txt").read_bytes()
                second = run(train_cmd(out, model, store, *extra), 300)
                named = f"(pid {first.pid} on host " in second.stderr and str(out) in second.stderr
                if second.returncode != 1 or not named:
                    problem = f"second run rc={second.returncode}, holder named: {named}: {second.stderr[-300:]}"
                elif (out / "sample_ids.rank0.txt").read_bytes() != ids:
                    problem = "the refused run wrote into the first run's sample_ids.rank0.txt"
                elif json.loads((out / "tokenswap_config.json").read_text())["run"]["arm"] != "tokenswap":
                    problem = "the refused run rewrote tokenswap_config.json"
        finally:
            _stop(first)  # SIGKILL: the lock must not outlive it
        problem = problem or _resume_to_end(out, model, store, ref)
        t.add("same_folder", f"second run with {name} while the first trains: exit 1 naming the holder; the first "
              "(killed, resumed) ends equal to an uninterrupted run", not problem, problem)
    # A 2-rank launch refused: rank 0 holds the answer, every rank must exit (none left waiting at a collective).
    out = work / "concurrent-2rank"
    log = work / "concurrent-2rank-first.log"
    first = _start(train_cmd(out, model, store), log, {PAUSE_ENV: "300@2"})
    problem = ""
    try:
        if not _wait_text(first, log, PAUSE_LINE):
            problem = f"the first run never reached checkpoint-2: {log.read_text()[-300:]}"
        else:
            t0 = time.monotonic()
            second = run(_two_rank_cmd(out, model, store, _free_port()), 300)
            named = f"(pid {first.pid} on host " in second.stderr
            if second.returncode in (0, 124) or not named:
                problem = f"2-rank launch rc={second.returncode}, holder named: {named}: {second.stderr[-300:]}"
            elif time.monotonic() - t0 > 120:
                problem = f"the refused ranks took {time.monotonic() - t0:.0f}s to exit"
    finally:
        _stop(first)
    problem = problem or _resume_to_end(out, model, store, ref)
    t.add("same_folder", "a 2-rank launch on a busy folder: every rank exits (rc 1) naming the holder, none hangs",
          not problem, problem)
    # Both launched at the same moment: whichever locks first trains, the other is refused.
    out = work / "concurrent-race"
    logs = [work / f"concurrent-race-{i}.log" for i in range(2)]
    procs = [_start(train_cmd(out, model, store), logs[i], {PAUSE_ENV: "8@2"}) for i in range(2)]
    for p in procs:
        p.wait(timeout=600)
    codes = sorted(p.returncode for p in procs)
    refused = [i for i, p in enumerate(procs) if p.returncode == 1]
    problem = "" if codes == [0, 1] else f"exit codes {codes}: {[x.read_text()[-300:] for x in logs]}"
    if not problem:
        holder = procs[1 - refused[0]].pid
        if f"(pid {holder} on host " not in logs[refused[0]].read_text():
            problem = f"the refused run does not name pid {holder}: {logs[refused[0]].read_text()[-300:]}"
    problem = problem or compare_logs(out, ref)
    t.add("same_folder", "two identical runs launched together: one trains (equal to an uninterrupted run), the "
          "other exits 1 naming it", not problem, problem)


def section_state_window(t: Tally, work: Path, model: Path, store: Path) -> None:
    """SIGKILL after the Trainer wrote checkpoint-N (trainer_state.json included), before tokenswap's record."""
    from tokenswap.training import COMPLETE_MARKER

    ref = _train_reference(work, model, store)
    out = work / "state-window"
    kills = []
    problem = ""
    for step in (2, 6, 10):
        resume = ["train.resume_from_checkpoint=latest"] if out.exists() else []
        log = work / f"state-window-{step}.log"
        p = _start(train_cmd(out, model, store, *resume), log, {PAUSE_ENV: f"120@{step}"})
        hit = _wait_text(p, log, f"checkpoint-{step} {PAUSE_LINE}")
        _stop(p)
        cut = out / f"checkpoint-{step}"
        in_window = (hit and (cut / "trainer_state.json").is_file() and not (cut / COMPLETE_MARKER).exists()
                     and not (cut / "tokenswap_state.rank0.json").exists())
        kills.append((step, in_window, log))
        if resume and f"checkpoint-{step - 4} is incomplete (no {COMPLETE_MARKER}" not in log.read_text():
            problem = problem or f"the resume before the kill at {step} did not say it skipped checkpoint-{step - 4}"
    final = run(train_cmd(out, model, store, "train.resume_from_checkpoint=latest"), 600)
    if final.returncode != 0:
        problem = problem or f"final resume rc={final.returncode}: {final.stderr[-400:]}"
    else:
        if f"checkpoint-10 is incomplete (no {COMPLETE_MARKER}" not in final.stdout:
            problem = problem or "the final resume did not say it skipped checkpoint-10"
        problem = "; ".join(filter(None, [problem, compare_logs(out, ref)]))  # what a silent resume lost, too
    for step, in_window, log in kills:
        why = problem if in_window else f"the kill missed the window: {log.read_text()[-300:]}"
        t.add("state_window", f"SIGKILL after checkpoint-{step}/trainer_state.json, before tokenswap's state: "
              "skipped on resume (said), the run ends equal to an uninterrupted one", in_window and not problem, why)


def _pid_with(tag: str, rank: int) -> int | None:
    """The process whose environment holds ``FAULTS_TAG=tag`` and ``RANK=rank`` (a launcher's worker)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"FAULTS_TAG={tag}".encode() in env and f"RANK={rank}".encode() in env:
            return int(d.name)
    return None


def _two_rank_cmd(out: Path, model: Path, store: Path, port: int, *extra: str) -> list[str]:
    return [PY, "-m", "accelerate.commands.launch", "--config_file", str(REPO / "configs/accelerate/cpu_2proc.yaml"),
            "--main_process_port", str(port), *train_cmd(out, model, store, *extra, steps=6)[1:]]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def section_sigterm(t: Tally, work: Path, rng: random.Random, model: Path, store: Path) -> None:
    """SIGTERM (a scheduler's preemption notice): a complete checkpoint at the next step end, exit 143, exact resume."""
    from tokenswap.training import COMPLETE_MARKER, PREEMPTED_EXIT

    ref = _train_reference(work, model, store)
    history = json.loads((work / "train-ref" / "log_history.json").read_text())
    step_s = max(h["train_runtime"] for h in history if "train_runtime" in h) / TRAIN_STEPS
    # 1. during a save (held open 2 s): the run stops at the end of the next step
    out = work / "sigterm-save"
    log = work / "sigterm-save.log"
    p = _start(train_cmd(out, model, store), log, {PAUSE_ENV: "2@4"})
    problem = "" if _wait_text(p, log, f"checkpoint-4 {PAUSE_LINE}") else f"never reached checkpoint-4: {log.read_text()[-300:]}"
    if not problem:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=300)
        if p.returncode != PREEMPTED_EXIT or not (out / "checkpoint-5" / COMPLETE_MARKER).is_file():
            problem = f"rc={p.returncode} (want {PREEMPTED_EXIT}), checkpoint-5 complete: " \
                      f"{(out / 'checkpoint-5' / COMPLETE_MARKER).is_file()}: {log.read_text()[-300:]}"
    _stop(p)
    problem = problem or _resume_to_end(out, model, store, ref)
    t.add("sigterm", "SIGTERM during the save of checkpoint-4: checkpoint-5 complete, exit 143, resume equals an "
          "uninterrupted run", not problem, problem)
    # 2. at random moments in training, twice in one run
    out = work / "sigterm-random"
    stops = []
    problem = ""
    for attempt in range(2):
        resume = ["train.resume_from_checkpoint=latest"] if out.exists() else []
        log = work / f"sigterm-random-{attempt}.log"
        ids = out / "sample_ids.rank0.txt"
        # A random step of this attempt (counted in the id log, one line per trained batch), then a random moment
        # within it: timing from the reference run instead misses a run that trains 16 steps in half a second.
        lines = (ids.read_bytes().count(b"\n") if ids.exists() else 0) + rng.randint(1, 6)
        p = _start(train_cmd(out, model, store, *resume), log)
        deadline = time.monotonic() + 300
        while p.poll() is None and time.monotonic() < deadline and (
                not ids.exists() or ids.read_bytes().count(b"\n") < lines):
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, 1.0) * min(step_s, 0.05))
        if p.poll() is not None:
            t.note("sigterm", f"random SIGTERM {attempt}: the run finished before the signal")
            continue
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=300)
        text = log.read_text()
        stopped = [ln for ln in text.splitlines() if "stopped by SIGTERM after step" in ln]
        if p.returncode != PREEMPTED_EXIT or not stopped:
            problem = problem or f"rc={p.returncode} (want {PREEMPTED_EXIT}): {text[-300:]}"
        else:
            step = int(stopped[0].split("after step ")[1].split(":")[0])
            if not (out / f"checkpoint-{step}" / COMPLETE_MARKER).is_file():
                problem = problem or f"checkpoint-{step} is not complete after the SIGTERM stop"
            stops.append(step)
    problem = problem or _resume_to_end(out, model, store, ref)
    for step in stops:
        t.add("sigterm", f"SIGTERM at a random moment (stopped after step {step}): exit 143, resume equals an "
              "uninterrupted run", not problem, problem)
    if not stops:
        t.add("sigterm", "SIGTERM at a random moment", False, problem or "every run finished before the signal")
    # 3. two ranks, the signal reaches rank 1 only: both stop after the same step, one complete checkpoint
    ref2_out = work / "sigterm-2rank-ref"
    proc = run(_two_rank_cmd(ref2_out, model, store, _free_port()), 900)
    if proc.returncode != 0:
        t.add("sigterm", "2 ranks: reference run", False, f"rc={proc.returncode}: {proc.stderr[-400:]}")
        return
    ref2 = run_logs(ref2_out)
    ref2_rank1 = (ref2_out / "sample_ids.rank1.txt").read_text()
    out = work / "sigterm-2rank"
    log = work / "sigterm-2rank.log"
    tag = f"sigterm-{os.getpid()}"
    p = _start(_two_rank_cmd(out, model, store, _free_port()), log, {PAUSE_ENV: "4@2", "FAULTS_TAG": tag})
    problem = ""
    if not _wait_text(p, log, f"checkpoint-2 {PAUSE_LINE}"):
        problem = f"never reached checkpoint-2: {log.read_text()[-300:]}"
    else:
        pid = _pid_with(tag, 1)
        if pid is None:
            problem = "rank 1's process not found"
        else:
            os.kill(pid, signal.SIGTERM)
            p.wait(timeout=300)
            states = sorted(x.name for x in (out / "checkpoint-3").glob("tokenswap_state.rank*.json"))
            if p.returncode == 0 or not (out / "checkpoint-3" / COMPLETE_MARKER).is_file() or len(states) != 2:
                problem = f"launcher rc={p.returncode}, checkpoint-3 marker/states: {states}: {log.read_text()[-400:]}"
            elif (out / "checkpoint-4").exists():
                problem = "a rank went on past the stop step"
    _stop(p)
    if not problem:
        again = run(_two_rank_cmd(out, model, store, _free_port(), "train.resume_from_checkpoint=latest"), 900)
        if again.returncode != 0:
            problem = f"2-rank resume rc={again.returncode}: {again.stderr[-400:]}"
        else:
            problem = compare_logs(out, ref2)
            if not problem and (out / "sample_ids.rank1.txt").read_text() != ref2_rank1:
                problem = "rank 1's sample_ids differ from the uninterrupted 2-rank run"
    t.add("sigterm", "2 ranks, SIGTERM to rank 1 only: both stop after step 3 with one complete checkpoint; the "
          "2-rank resume equals an uninterrupted 2-rank run", not problem, problem)
    # 4. SIGTERM to the launcher (what a scheduler signals): torch elastic forwards it to every rank and SIGKILLs
    # them 30 s later, so the step end and the save must fit in that.
    out = work / "sigterm-launcher"
    log = work / "sigterm-launcher.log"
    p = _start(_two_rank_cmd(out, model, store, _free_port()), log, {PAUSE_ENV: "4@2"})
    problem = ""
    if not _wait_text(p, log, f"checkpoint-2 {PAUSE_LINE}"):
        problem = f"never reached checkpoint-2: {log.read_text()[-300:]}"
    else:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=300)
        done = sorted(int(d.name.split("-")[1]) for d in out.glob("checkpoint-*") if (d / COMPLETE_MARKER).is_file())
        if p.returncode == 0 or done[-1:] != [3] or len(list((out / "checkpoint-3").glob("tokenswap_state.rank*"))) != 2:
            problem = f"launcher rc={p.returncode}, complete checkpoints {done}: {log.read_text()[-400:]}"
    _stop(p)
    if not problem:
        again = run(_two_rank_cmd(out, model, store, _free_port(), "train.resume_from_checkpoint=latest"), 900)
        problem = (f"2-rank resume rc={again.returncode}: {again.stderr[-400:]}" if again.returncode
                   else compare_logs(out, ref2))
        if not problem and (out / "sample_ids.rank1.txt").read_text() != ref2_rank1:
            problem = "rank 1's sample_ids differ from the uninterrupted 2-rank run"
    t.add("sigterm", "2 ranks, SIGTERM to the launcher: both ranks save checkpoint-3 and stop; the 2-rank resume "
          "equals an uninterrupted 2-rank run", not problem, problem)


CHANGED_SETTINGS = {
    "run.arm=text": "run.arm: was 'tokenswap', now 'text'",
    "collator.swap_prob=0.5": "collator.swap_prob: was 1.0, now 0.5",
    "data.seed=1": "data.seed: was 0, now 1",
    "collator.max_length=256": "collator.max_length: was 512, now 256",
    "collator.pack_budget=8192": "collator.pack_budget: was 16384, now 8192",
    "train.per_device_train_batch_size=2": "train.per_device_train_batch_size: was 4, now 2",
    "train.learning_rate=0.01": "train.learning_rate: was 0.001, now 0.01",
}


def section_resume_settings(t: Tally, work: Path, model: Path, store: Path) -> None:
    """A resume with settings that change the sample stream or bookkeeping: exit 2 naming each, folder untouched."""
    ref = _train_reference(work, model, store)
    out = work / "resume-settings"
    proc = run(train_cmd(out, model, store, steps=4), 600)
    if proc.returncode != 0:
        raise RuntimeError(f"first part failed: {proc.stderr[-1000:]}")
    before = tree_digest(out)
    for override, difference in CHANGED_SETTINGS.items():
        proc = run(train_cmd(out, model, store, "train.resume_from_checkpoint=latest", override), 300)
        ok = proc.returncode == 2 and difference in proc.stderr and tree_digest(out) == before
        t.add("resume_settings", f"resume with {override}: exit 2 naming it (was/now), folder untouched", ok,
              f"rc={proc.returncode}, folder unchanged: {tree_digest(out) == before}: {proc.stderr[-300:]}")
    # what may change does: the run extended to 16 steps, other logging, 2 workers
    proc = run(train_cmd(out, model, store, "train.resume_from_checkpoint=latest", "train.logging_steps=1",
                         "train.dataloader_num_workers=2"), 600)
    problem = f"rc={proc.returncode}: {proc.stderr[-300:]}" if proc.returncode else compare_logs(out, ref)
    t.add("resume_settings", "resume with max_steps 4 -> 16 and 2 dataloader workers (allowed): equals an "
          "uninterrupted run", not problem, problem)


# ============================================================================ malformed rows in a store build


MALFORMED_ROWS = {
    # json.loads turns the escape into a lone surrogate, which no UTF-8 file can hold.
    "lone low surrogate (\\udcff) in a human turn": b'{"uuid": "bad-1", "conversations": [{"from": "human", '
    b'"value": "a cat \\udcff here"}, {"from": "gpt", "value": "ok"}]}\n',
    "lone high surrogate (\\ud800) in a gpt turn": b'{"uuid": "bad-2", "conversations": [{"from": "human", '
    b'"value": "a cat"}, {"from": "gpt", "value": "\\ud800"}]}\n',
    "lone surrogate in the uuid": b'{"uuid": "bad-\\udcff", "conversations": [{"from": "human", "value": "a cat"}, '
    b'{"from": "gpt", "value": "ok"}]}\n',
    "conversations given as an object": b'{"uuid": "bad-4", "conversations": {"from": "human", "value": "a cat"}}\n',
    "unknown role": b'{"uuid": "bad-5", "conversations": [{"from": "robot", "value": "a cat"}]}\n',
    "turn value that is a number": b'{"uuid": "bad-6", "conversations": [{"from": "human", "value": 7}]}\n',
    "no uuid": b'{"conversations": [{"from": "human", "value": "a cat"}, {"from": "gpt", "value": "ok"}]}\n',
    "no human turn": b'{"uuid": "bad-8", "conversations": [{"from": "gpt", "value": "a cat"}]}\n',
    "null line": b"null\n",
    "truncated line": b'{"uuid": "bad-10", "conversations": [{"from": "hu\n',
    "non-UTF-8 bytes": b'{"uuid": "bad-11", "conversations": [{"from": "human", "value": "a cat \xff\xfe"}]}\n',
}


def section_malformed(t: Tally, work: Path) -> None:
    """Malformed Magpie rows in ``tokenswap build-store`` with ``data.skip_malformed=true``: skipped and counted."""
    path = work / "magpie-hostile.jsonl"
    path.write_bytes(b"".join(_magpie(i) + line for i, line in enumerate(MALFORMED_ROWS.values())) + _magpie(99))
    good = {f"u{i}" for i in range(len(MALFORMED_ROWS))} | {"u99"}
    out = work / "store-hostile-rows"
    proc = run(store_cmd(out, f"data.path={path}", "data.skip_malformed=true", "data.max_samples=null"), 300)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    kept = set()
    for shard in sorted((out / "dataset").glob("*.jsonl")):
        kept |= {json.loads(line)["id"] for line in shard.read_text(encoding="utf-8").splitlines() if line.strip()}
    skipped = report.get("rows_malformed_skipped")
    ok = proc.returncode == 0 and skipped == len(MALFORMED_ROWS) and kept == good
    detail = f"rc={proc.returncode} skipped={skipped} of {len(MALFORMED_ROWS)}, kept {len(kept)} of {len(good)} good rows"
    for what in MALFORMED_ROWS:
        t.add("malformed", f"Magpie row: {what}, skip_malformed=true", ok, f"{detail} {proc.stderr[-200:]}")

    # Without skip_malformed the first bad row stops the build, named by file and line, and no message claims
    # what is not true (an earlier build said "nothing was written" next to the state/plan.json it had written).
    out = work / "store-hostile-rows-strict"
    strict = run(store_cmd(out, f"data.path={path}", "data.max_samples=null"), 300)
    named = strict.returncode == 2 and f"{path.name}:2" in strict.stderr
    false_claim = "nothing was written" in strict.stderr and any(p.is_file() for p in out.rglob("*"))
    t.add("malformed", "Magpie lone surrogate, skip_malformed=false: exit 2 naming file and line, no false claim",
          named and not false_claim, f"rc={strict.returncode} {strict.stderr[-300:]}")


# ============================================================================ secrets, null replies, bad replies

FAULT_KEY = 'sk-faults/Te+st"key\\0a1b2c3d4e5f6g7h8'  # its JSON, percent and plus forms all differ from the raw one
FAULT_KEY_ENV = "TS_FAULTS_SINK_KEY"
SECRET_FORMS = ("raw", "JSON-escaped", "percent-encoded", "plus form", "cut by the client", "cut by the build",
                "repeated in the model's reply")


def _key_forms(secret: str) -> dict[str, str]:
    """What of a secret must be in no file or output: each encoded form, and cuts of 12 characters of each."""
    import urllib.parse

    full = {"raw": secret, "json": json.dumps(secret)[1:-1], "percent": urllib.parse.quote(secret, safe=""),
            "plus": urllib.parse.quote_plus(secret)}
    return full | {f"{k} prefix": v[:12] for k, v in full.items()} | {f"{k} suffix": v[-12:] for k, v in full.items()}


def _leaks(secret: str, root: Path, *texts: str) -> list[str]:
    forms = _key_forms(secret)
    found = [f"{p.relative_to(root)} ({n})" for p in sorted(root.rglob("*")) if p.is_file()
             for n, f in forms.items() if f.encode() in p.read_bytes()]
    return found + [f"output ({n})" for text in texts for n, f in forms.items() if f in text]


def _echo_body(form: str, auth: str) -> bytes:
    """An error body quoting the Authorization header, as servers and proxies do."""
    import urllib.parse

    if form == "raw":
        return f"invalid header Authorization: {auth}".encode()
    if form == "JSON-escaped":
        return json.dumps({"error": {"message": f"bad Authorization {auth}"}}).encode()
    if form == "percent-encoded":
        return f"rejected /v1/chat/completions?authorization={urllib.parse.quote(auth, safe='')}".encode()
    if form == "plus form":
        return f"rejected /v1/chat/completions?authorization={urllib.parse.quote_plus(auth)}".encode()
    if form == "cut by the client":  # the client keeps an error body's first 500 bytes
        return ("x" * (500 - len("Bearer ") - 17) + auth).encode()
    return ("x" * 390 + auth + "x" * 100).encode()  # the build keeps the first 500 characters of the message


def _sink_server(form: str, reply):
    """A loopback server answering every third request with a 500 that quotes the header in ``form``."""
    from tokenswap.testing import LoadLLMServer

    count = {"n": 0}

    def respond(payload, headers):
        count["n"] += 1
        if form == "repeated in the model's reply" or count["n"] % 3:
            return None
        return 500, _echo_body(form, headers["authorization"])

    return LoadLLMServer(reply, respond=respond)


def _fault_bench(root: Path) -> Path:
    """Four multiple-choice pairs, each interleaved item with one picture: a bench for `tokenswap eval`."""
    from PIL import Image

    from tokenswap.data.tokenswap_bench import write_tokenswap_bench
    from tokenswap.eval.mc import MCItem

    pairs = []
    for i, (word, color) in enumerate([("apple", "red"), ("banana", "yellow"), ("circle", "blue"), ("leaf", "green")]):
        question = f"Which colour is the {word}?"
        choices = ["red", "yellow", "blue", "green"]
        text = MCItem(f"f{i}", "colours", question, choices, i)
        image = MCItem(f"f{i}", "colours", question.replace(word, "<image 1>"), choices, i,
                       {1: Image.new("RGB", (40, 40), color)})
        pairs.append((text, image))
    with contextlib_quiet():
        write_tokenswap_bench(pairs, root)
    return root


def _eval_cmd(base_url: str, bench: Path, out: Path, *extra: str) -> list[str]:
    return [PY, "-m", "tokenswap.cli", "eval", "--backend", "openai", "--base-url", base_url, "--model", "some-vlm",
            "--bench", str(bench), "--out", str(out), "--max-retries", "1", "--max-error-share", "1",
            "--concurrency", "4", *extra]


def _small_build_cmd(out: Path, base_url: str, *extra: str) -> list[str]:
    return [PY, "-m", "tokenswap.cli", "build-store", "--config", "store_generate.yaml", f"output_dir={out}",
            "data.path=fixture", "data.max_samples=24", "sources=[rendered_text]", "extractor.kind=llm",
            "extractor.llm.model=m", f"extractor.llm.base_url={base_url}", "judge.llm.model=v",
            f"judge.llm.base_url={base_url}", "extractor.llm.concurrency=4", "judge.llm.concurrency=4",
            "samples_per_shard=4", "concept_batch_size=4", "progress=false", *extra]


def _small_build_state(out: Path) -> dict:
    """Candidate chunks, dataset shards and the plan byte for byte, the store row by row (store shards are numbered
    in commit order, so a judge batch the rerun commits gets the next number)."""
    from tokenswap.store import ImageStore

    files = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
             if p.is_file() and p.relative_to(out).as_posix().startswith(("dataset/", "state/candidates/part-"))}
    store = ImageStore(out / "store")
    files["store rows"] = sorted((k, im.image_id, im.source, json.dumps(im.meta, sort_keys=True))
                                 for k in store.keys() for im in store.get(k))
    return files


def section_secrets(t: Tally, work: Path, model: Path | None, store: Path | None) -> None:
    """The API key (every encoded and cut form) in no sink; credentials refused in base URLs; W&B and pickles."""
    from tokenswap.testing import concept_reply

    env = {**ENV, FAULT_KEY_ENV: FAULT_KEY}
    bench = _fault_bench(work / "secrets-bench")
    for form in SECRET_FORMS:
        echoed = form == "repeated in the model's reply"

        def reply(payload, echoed=echoed):
            return concept_reply(payload) + (f"\n(you sent {FAULT_KEY})" if echoed else "")

        out = work / f"secrets-build-{SECRET_FORMS.index(form)}"
        with _sink_server(form, reply) as server:
            cmd = _small_build_cmd(out, server.base_url, f"extractor.llm.api_key_env={FAULT_KEY_ENV}",
                                   "extractor.llm.max_retries=0", "judge=null")
            proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
        leaks = _leaks(FAULT_KEY, out, proc.stdout, proc.stderr)
        want = (0, True) if echoed else (1, False)
        ok = (proc.returncode, report.get("complete")) == want and not leaks
        t.add("secrets", f"build-store, key {form}: not in report.json, failed markers, cache, stderr", ok,
              f"rc={proc.returncode} complete={report.get('complete')} leaks={leaks[:4]} {proc.stderr[-200:]}")

        out = work / f"secrets-eval-{SECRET_FORMS.index(form)}"
        with _sink_server(form, lambda payload: f"The answer is A. Your key: {FAULT_KEY}") as server:
            proc = subprocess.run(_eval_cmd(server.base_url, bench, out, "--api-key-env", FAULT_KEY_ENV,
                                            "--max-retries", "0"),
                                  cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        leaks = _leaks(FAULT_KEY, out, proc.stdout, proc.stderr)
        t.add("secrets", f"tokenswap eval, key {form}: not in records.jsonl, gap.json, gap.md, stderr",
              proc.returncode == 0 and (out / "gap.json").exists() and not leaks,
              f"rc={proc.returncode} leaks={leaks[:4]} {proc.stderr[-200:]}")

    # user:password@ in a base URL: a config error naming the key and the fix, the password nowhere, nothing written.
    password = "hunter2-Pa55word"
    refused = [("build-store", "extractor.llm.base_url"), ("build-store", "judge.llm.base_url"),
               ("build-bench", "judge.base_url"), ("build-bench", "proxy.base_url"),
               ("build-bench", "captioner.base_url")]
    for command, key in refused:
        out = work / f"secrets-url-{command}-{key.split('.')[0]}"
        section = key.rsplit(".", 1)[0]
        if command == "build-store":
            cmd = _small_build_cmd(out, "http://127.0.0.1:9/v1", f"{key}=https://alice:{password}@h.example/v1")
        else:
            cmd = [PY, "-m", "tokenswap.cli", "build-bench", f"out_dir={out}", "store=/nonexistent",
                   f"{section}.model=m", f"{key}=https://alice:{password}@h.example/v1"]
        proc = run(cmd, 120)
        ok = (proc.returncode == 2 and f"{section}: `base_url` must carry no user, password or query" in proc.stderr
              and "environment variable" in proc.stderr and password not in proc.stderr + proc.stdout
              and not out.exists())
        t.add("secrets", f"{command} {key}=https://user:password@...: exit 2 naming the key and the fix", ok,
              f"rc={proc.returncode} {proc.stderr[-300:]}")

    # A real offline W&B run of a tiny recipe, launched with a hub token and a user:pass@ URL in a Trainer field.
    if model is None:
        from tokenswap.testing import build_tiny_qwen2vl, build_tiny_store

        with contextlib_quiet():
            model = build_tiny_qwen2vl(work / "tiny-qwen2vl")
            store = build_tiny_store(work / "tiny-store").root
    token, url_password = "hf_FaultsHubToken0123456789", "Url-Pa55word-4242"
    out = work / "secrets-train"
    secrets = ("train.report_to=[wandb]", "wandb.mode=offline", f"train.hub_token={token}",
               f"train.hub_model_id=https://alice:{url_password}@hub.example.com/org/m")
    first = run(train_cmd(out, model, store, *secrets, steps=2), 600)
    resumed = run(train_cmd(out, model, store, *secrets, "train.resume_from_checkpoint=latest", steps=4), 600)
    said = first.stdout + first.stderr + resumed.stdout + resumed.stderr
    files = {"the .wandb run file": list(out.glob("wandb/offline-run-*/run-*.wandb")),
             "W&B's debug.log": list(out.glob("wandb/offline-run-*/logs/debug*.log")),
             "checkpoint-*/training_args.bin and the final one": list(out.glob("**/training_args.bin")),
             "every other file of the run": [p for p in out.rglob("*") if p.is_file()]}
    for what, paths in files.items():
        found = [f"{p.relative_to(out)}" for p in paths for s in (token, url_password, token[:12], url_password[:10])
                 if s.encode() in p.read_bytes()]
        t.add("secrets", f"train.hub_token and user:pass@ URL on the command line: not in {what}",
              first.returncode == 0 and bool(paths) and not found, f"rc={first.returncode} files={len(paths)} "
              f"found={found[:3]} {first.stderr[-200:]}")
    t.add("secrets", "the run resumes from its checkpoint (nothing reads training_args.bin back), its output clean",
          resumed.returncode == 0 and (out / "checkpoint-4").is_dir() and token not in said and url_password not in said,
          f"rc={resumed.returncode} {resumed.stderr[-300:]}")


def _null_body() -> bytes:
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": None}, "finish_reason": "stop"}]}).encode()


def _switchable(respond_bad, hit) -> tuple[dict, Callable]:
    """A ``respond`` hook answering ``respond_bad()`` to requests ``hit`` picks while ``state["on"]``."""
    state = {"on": True}

    def respond(payload, headers):
        return (200, respond_bad()) if state["on"] and hit(payload) else None

    return state, respond


def _store_rerun_trials(t: Tally, section: str, what: str, work: Path, bad: Callable[[], bytes], ref: Path,
                        stage: str) -> None:
    """build-store with bad replies to the requests about "garden" in one stage, then the same command again."""
    from tokenswap.testing import LoadLLMServer, concept_reply

    def hit(payload) -> bool:
        system = payload["messages"][0]["role"] == "system"
        return (system if stage == "extract" else not system) and "garden" in json.dumps(payload).lower()

    state, respond = _switchable(bad, hit)
    out = work / f"{section}-build-{stage}-{what.split()[0]}"
    with LoadLLMServer(concept_reply, respond=respond) as server:
        first = run(_small_build_cmd(out, server.base_url, "extractor.llm.max_retries=1", "judge.llm.max_retries=1"),
                    600)
        report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
        failed_texts = sum(m.get("llm_extraction", {}).get("failed_texts", 0) for m in report.get("ranks", {}).get(
            "extract", []))
        ok = (first.returncode == 1 and report.get("complete") is False and report.get("failed_requests", 0) > 0
              and failed_texts == 0 and "Traceback" not in first.stderr)
        t.add(section, f"build-store {stage} stage, {what}: not complete (exit 1, complete: false, counted as failed "
              "requests, not as texts without concepts)", ok,
              f"rc={first.returncode} complete={report.get('complete')} failed={report.get('failed_requests')} "
              f"failed_texts={failed_texts} {first.stderr[-300:]}")
        state["on"] = False
        before = len(server.requests)
        second = run(_small_build_cmd(out, server.base_url), 600)
        asked = sum(hit(p) for p in server.requests[before:])
    t.add(section, f"build-store {stage} stage, {what}: the rerun asks them again", second.returncode == 0 and asked > 0,
          f"rc={second.returncode} asked again={asked} {second.stderr[-200:]}")
    same = second.returncode == 0 and _small_build_state(out) == _small_build_state(ref)
    t.add(section, f"build-store {stage} stage, {what}: the rerun equals an uninterrupted build", same,
          "store rows, candidate chunks or dataset shards differ")


def _eval_rerun_trials(t: Tally, section: str, what: str, work: Path, bad: Callable[[], bytes], bench: Path,
                       ref: dict, answer: Callable, *extra: str) -> None:
    """`tokenswap eval` with bad replies about "circle", then the same command against the recovered server."""
    from tokenswap.testing import LoadLLMServer

    def hit(payload) -> bool:
        return "circle" in json.dumps(payload)

    state, respond = _switchable(bad, hit)
    out = work / f"{section}-eval-{'-'.join(''.join(c for c in what if c.isalnum() or c == ' ').split())}"
    with LoadLLMServer(answer, respond=respond) as server:
        first = run(_eval_cmd(server.base_url, bench, out, *extra), 600)
        records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()] \
            if (out / "records.jsonl").exists() else []
        gap = json.loads((out / "gap.json").read_text()) if (out / "gap.json").exists() else {}
        failed = [r for r in records if "error" in r]
        text = (out / "records.jsonl").read_text() if records else ""
        scored = {i["id"] for i in gap.get("items", [])}
        ok = (first.returncode == 0 and failed and all(r.get("pred") is None and r.get("response") is None
                                                         for r in failed)
              and gap.get("n_failed") == len(failed) and not {r["id"] for r in failed} & scored
              and "NaN" not in text and "Infinity" not in text and "Traceback" not in first.stderr)
        t.add(section, f"tokenswap eval, {what}: a failed request, never scored (no answer \"\", no NaN written)", ok,
              f"rc={first.returncode} failed={len(failed)} n_failed={gap.get('n_failed')} {first.stderr[-300:]}")
        state["on"] = False
        before = len(server.requests)
        second = run(_eval_cmd(server.base_url, bench, out, *extra), 600)
        asked = server.requests[before:]
    t.add(section, f"tokenswap eval, {what}: the rerun asks exactly those again",
          second.returncode == 0 and len(asked) == len(failed) and all(hit(p) for p in asked),
          f"rc={second.returncode} asked {len(asked)} for {len(failed)} failed")
    gap = json.loads((out / "gap.json").read_text()) if (out / "gap.json").exists() else {}
    keys = ("items", "acc_text", "acc_interleaved", "gap")
    t.add(section, f"tokenswap eval, {what}: the rerun equals an uninterrupted run",
          gap.get("n_failed") == 0 and {k: gap.get(k) for k in keys} == {k: ref.get(k) for k in keys},
          f"n_failed={gap.get('n_failed')}")


def _eval_answer(payload) -> str:
    return "The answer is B." if "banana" in json.dumps(payload) else "The answer is A."


def _eval_reference(work: Path, bench: Path, answer: Callable, name: str, *extra: str) -> dict:
    from tokenswap.testing import LoadLLMServer

    out = work / name
    with LoadLLMServer(answer) as server:
        proc = run(_eval_cmd(server.base_url, bench, out, *extra), 600)
    if proc.returncode != 0:
        raise RuntimeError(f"reference eval failed: {proc.stderr[-1000:]}")
    return json.loads((out / "gap.json").read_text())


def _build_reference(work: Path, name: str) -> Path:
    from tokenswap.testing import LoadLLMServer, concept_reply

    out = work / name
    with LoadLLMServer(concept_reply) as server:
        proc = run(_small_build_cmd(out, server.base_url), 600)
    if proc.returncode != 0:
        raise RuntimeError(f"reference build failed: {proc.stderr[-1000:]}")
    return out


def section_null_replies(t: Tally, work: Path) -> None:
    """A 200 with content null: a failed request in build-store (both stages), eval and the bench builder."""
    ref = _build_reference(work, "null-build-ref")
    for stage in ("extract", "judge"):
        _store_rerun_trials(t, "null_replies", "content null", work, _null_body, ref, stage)
    bench = _fault_bench(work / "null-bench")
    ref_eval = _eval_reference(work, bench, _eval_answer, "null-eval-ref")
    _eval_rerun_trials(t, "null_replies", "content null", work, _null_body, bench, ref_eval, _eval_answer)
    _eval_rerun_trials(t, "null_replies", "content missing", work,
                       lambda: b'{"choices": [{"message": {"role": "assistant"}, "finish_reason": "stop"}]}', bench,
                       ref_eval, _eval_answer)
    _bench_builder_null_trials(t, work)


def _bench_builder_null_trials(t: Tally, work: Path) -> None:
    from PIL import Image

    from tokenswap.concepts import LexiconExtractor
    from tokenswap.eval.bench_builder import BenchBuilder, BenchRequestsFailed
    from tokenswap.eval.mc import MCItem
    from tokenswap.inference import OpenAIChatModel
    from tokenswap.store.image_store import ImageStore, StoreWriter
    from tokenswap.testing import LoadLLMServer

    root = work / "null-bench-store"
    if not (root / "store.json").exists():
        with StoreWriter(root) as w:
            for concept, color in {"horse": "red", "moon": "white", "sun": "yellow"}.items():
                w.add(concept, Image.new("RGB", (32, 32), color), source="test")
    store = ImageStore(root)
    items = [MCItem(k, "astronomy", q, ["w", "x", "y", "z"], 1) for k, q in
             {"k0": "[k0] Does a horse run?", "k1": "[k1] Is the moon bright?", "k2": "[k2] Is the sun hot?"}.items()]
    broken = {"on": False}

    def reply(payload):
        text = json.dumps(payload)
        if broken["on"] and "sun" in text:
            return None
        return json.dumps({"valid": "moon" not in text}) if payload["model"] == "judge" else "The answer is B."

    def builder(out: Path, base_url: str) -> BenchBuilder:
        def chat(name: str) -> OpenAIChatModel:
            return OpenAIChatModel(base_url, name, max_retries=1, max_backoff=0.05, concurrency=2,
                                   cache_path=out / "cache" / f"{name}.jsonl")

        return BenchBuilder(extractor=LexiconExtractor(store.keys()), store=store, judge=chat("judge"),
                            proxy=chat("proxy"), captioner=None, out_dir=out, filters=("validity",), concurrency=2)

    def files(out: Path) -> dict[str, bytes]:
        return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
                if p.is_file() and p.name != "requests.json" and "cache" not in p.relative_to(out).parts}

    out, ref = work / "null-bench-built", work / "null-bench-built-ref"
    with LoadLLMServer(reply) as server:
        builder(ref, server.base_url).run(items)
        broken["on"] = True
        try:
            builder(out, server.base_url).run(items)
            problem = "the run raised no BenchRequestsFailed"
        except BenchRequestsFailed:
            problem = ""
        recorded = {json.loads(line)["id"] for line in (out / "results.jsonl").read_text().splitlines()}
        problem = problem or ("" if recorded == {"k0", "k1"} else f"recorded {sorted(recorded)}")
        t.add("null_replies", "bench builder, the judge's content null: the item is not recorded (neither kept nor "
              "dropped), the run says it failed", not problem, problem)
        broken["on"] = False
        before = len(server.requests)
        builder(out, server.base_url).run(items)
        asked = server.requests[before:]
    t.add("null_replies", "bench builder, the judge's content null: the rerun asks it again",
          bool(asked) and all("sun" in json.dumps(p) for p in asked), f"asked {len(asked)}")
    t.add("null_replies", "bench builder, the judge's content null: the rerun equals an uninterrupted run",
          files(out) == files(ref), "results, dropped.jsonl or the written bench differ")


DEEP_JSON = b"[" * 100_000 + b"]" * 100_000
HUGE_INT_BODY = (b'{"choices": [{"message": {"content": "A"}}], "usage": {"prompt_tokens": ' + b"9" * 4400 + b"}}")


def _logprob_body(logprob: bytes) -> bytes:
    return (b'{"choices": [{"message": {"content": "A"}, "logprobs": {"content": [{"token": "A", "logprob": -0.1, '
            b'"top_logprobs": [{"token": "A", "logprob": ' + logprob + b'}, {"token": "B", "logprob": -2.0}]}]}}]}')


def _cache_poison(keys: list[str], good: dict) -> dict[str, str]:
    """One line per kind of poisoned response-cache entry, each for its own question's key."""
    return {
        "valid JSON that is no entry (a list)": json.dumps([keys[0], "answer"]),
        "a null answer": json.dumps({"key": keys[1], "response": None}),
        "an answer of the wrong type": json.dumps({"key": keys[2], "response": 42}),
        "a key that does not match its content (copied)": json.dumps({**good, "key": keys[3]}),
        "an edited answer": json.dumps({**good, "key": keys[4], "response": "edited"}),
        "a NaN logprob": '{"key": "' + keys[5] + '", "response": "A", "top_logprobs": [["A", NaN]]}',
        "a 4,400-digit integer": '{"key": "' + keys[6] + '", "response": "A", "n": ' + "9" * 4400 + "}",
        "100,000-deep nesting": '{"key": "' + keys[7] + '", "response": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "an absurd size (1,000 logprob pairs)": json.dumps({"key": keys[8], "response": "A",
                                                             "top_logprobs": [["t", -1.0]] * 1000}),
    }


def section_bad_replies(t: Tally, work: Path) -> None:
    """Bodies Python's JSON parser cannot take, logprobs that overflow or are NaN, poisoned cache and record lines."""
    import warnings as _warnings

    from tokenswap.inference import LLMRequestError, OpenAIChatModel, ResponseCache, cache_key
    from tokenswap.testing import LoadLLMServer

    msg = [{"role": "user", "content": "hi"}]
    good_top = b'{"choices": [{"message": {"content": "A"}, "logprobs": {"content": [{"token": "A", "logprob": -0.1, ' \
               b'"top_logprobs": [{"token": "A", "logprob": -0.1}]}]}}]}'
    bodies = {"100,000-deep nesting": (DEEP_JSON, None), "a 4,400-digit integer": (HUGE_INT_BODY, None),
              "lone surrogates in the content": (b'{"choices": [{"message": {"content": "\\udcff A"}}]}', None),
              "logprob +1000": (_logprob_body(b"1000.0"), 5), "logprob NaN": (_logprob_body(b"NaN"), 5)}
    for what, (bad, top) in bodies.items():
        server = ScriptedLLMServer()
        try:
            model = OpenAIChatModel(server.base_url, "m", max_retries=1, max_backoff=0.05)
            fine = llm_reply(good_top if top else llm_answer("fine"))
            server.script = [llm_reply(bad), fine]
            got = model.request(msg, top_logprobs=top)
            recovered = got.text in ("fine", "A") and model.num_requests == 2
            server.script = [llm_reply(bad)] * 2
            try:
                model.request([{"role": "user", "content": "again"}], top_logprobs=top)
                detail = "no error"
            except LLMRequestError as e:
                detail = "" if "failed after 2 attempts" in str(e) else str(e)[:200]
            except Exception as e:  # noqa: BLE001 - what the trial is about: anything else kills a run
                detail = f"{type(e).__name__}: {str(e)[:200]}"
        finally:
            server.close()
        t.add("bad_replies", f"client, {what}: retried, then a failed request (LLMRequestError, no crash)",
              recovered and not detail, f"recovered={recovered} {detail}")

    bench = _fault_bench(work / "bad-bench")
    ref_eval = _eval_reference(work, bench, _eval_answer, "bad-eval-ref")
    for what, bad in (("100,000-deep nesting", DEEP_JSON), ("a 4,400-digit integer", HUGE_INT_BODY)):
        _eval_rerun_trials(t, "bad_replies", what, work, lambda bad=bad: bad, bench, ref_eval, _eval_answer)

    def loglik_answer(payload):  # not used: every loglik answer comes from `respond`
        return "A"

    good_lp = _logprob_body(b"-0.1")
    for what, value in (("logprob +1000 (loglik)", b"1000.0"), ("logprob NaN (loglik)", b"NaN")):
        out = work / f"bad-loglik-{value.decode()}"
        broken = {"on": True}

        def respond(payload, headers, value=value, broken=broken):
            return 200, _logprob_body(value) if broken["on"] and "circle" in json.dumps(payload) else good_lp

        with LoadLLMServer(loglik_answer, respond=respond) as server:
            first = run(_eval_cmd(server.base_url, bench, out, "--scorer", "loglik"), 600)
            text = (out / "records.jsonl").read_text() if (out / "records.jsonl").exists() else ""
            gap_text = (out / "gap.json").read_text() if (out / "gap.json").exists() else ""
            failed = [r for r in map(json.loads, text.splitlines()) if "error" in r]
            ok = (first.returncode == 0 and failed and "NaN" not in text + gap_text and "Infinity" not in text + gap_text
                  and all("letter_probs" not in r for r in failed))
            t.add("bad_replies", f"tokenswap eval, {what}: a failed request, nothing non-finite written", ok,
                  f"rc={first.returncode} failed={len(failed)} {first.stderr[-300:]}")
            broken["on"] = False
            second = run(_eval_cmd(server.base_url, bench, out, "--scorer", "loglik"), 600)
        gap = json.loads((out / "gap.json").read_text()) if (out / "gap.json").exists() else {}
        t.add("bad_replies", f"tokenswap eval, {what}: the rerun fills it in", second.returncode == 0
              and gap.get("n_failed") == 0, f"rc={second.returncode} n_failed={gap.get('n_failed')}")

    ref = _build_reference(work, "bad-build-ref")
    _store_rerun_trials(t, "bad_replies", "100,000-deep nesting", work, lambda: DEEP_JSON, ref, "extract")

    # Poisoned response-cache entries: skipped with one warning naming the file, asked again, never an answer.
    questions = [f"q{i}" for i in range(10)]
    keys = [cache_key("m", [{"role": "user", "content": q}], temperature=0.0, max_tokens=512) for q in questions]
    for n, (what, line) in enumerate(_cache_poison(keys[1:], {}).items()):
        path = work / f"bad-cache-{n}.jsonl"
        path.unlink(missing_ok=True)
        seed = ResponseCache(path)
        seed.put(keys[0], "cached answer")
        seed.close()
        good = json.loads(path.read_text())
        line = _cache_poison(keys[1:], good)[what]
        with open(path, "a") as f:
            f.write(line + "\n")
        with LoadLLMServer(lambda payload: "fresh answer") as server:
            with _warnings.catch_warnings(record=True) as caught:
                _warnings.simplefilter("always")
                model = OpenAIChatModel(server.base_url, "m", cache_path=path, max_retries=0)
            asked = questions[: n + 2]
            answers = [model.chat([{"role": "user", "content": q}]) for q in asked]
            model.close()
            requests = len(server.requests)
        said = [str(w.message) for w in caught]
        poisoned_q = n + 1
        ok = (len(said) == 1 and str(path) in said[0] and answers[0] == "cached answer"
              and answers[poisoned_q] == "fresh answer" and requests == len(asked) - 1)
        t.add("bad_replies", f"response cache, {what}: skipped with one warning naming the file, asked again", ok,
              f"warnings={said[:1]} answers={answers} requests={requests}")

    # Lines no run writes in records.jsonl: the reader skips them, the eval resumes to the same result.
    out = work / "bad-records"
    with LoadLLMServer(_eval_answer) as server:
        first = run(_eval_cmd(server.base_url, bench, out), 600)
        with open(out / "records.jsonl", "a") as f:
            f.write("[" * 100_000 + "]" * 100_000 + "\n" + '{"key": "text|f0", "n": ' + "9" * 4400 + "}\n"
                    + '{"key": ["a list"]}\n' + '"a string"\n')
        second = run(_eval_cmd(server.base_url, bench, out), 600)
    gap = json.loads((out / "gap.json").read_text()) if (out / "gap.json").exists() else {}
    t.add("bad_replies", "records.jsonl with 100,000-deep nesting, a 4,400-digit integer, a list key: the eval "
          "resumes to the same result", first.returncode == 0 and second.returncode == 0
          and gap.get("items") == ref_eval.get("items"), f"rc={first.returncode},{second.returncode} "
          f"{second.stderr[-300:]}")


# ============================================================================ runs that end


OUTCOMES["runs_end"] = (
    "persistent workers: the run ends (exit 0) with no worker left; the job's SIGTERM before the first batch: exit 143 "
    "after saving step 1, no traceback, no orphan, exact resume; SIGKILL with workers: the folder's lock free at the "
    "first try; dead writers' temporaries removed when a run or build restarts (live ones kept), a failed write none"
)
WORKER_HOLD_ENV = "TOKENSWAP_FAULT_WORKER_HOLD_S"  # tokenswap.training.workers.FAULT_WORKER_HOLD_ENV
WORKER_HOLD_LINE = "waits for a SIGTERM before its first batch"


def _start_job(cmd: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """A run in its own process group, as a scheduler's job: ``os.killpg`` reaches it and all its workers."""
    with open(log, "w") as f:
        return subprocess.Popen(cmd, cwd=REPO, env={**ENV, **(env or {})}, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _group_left(pgid: int) -> list[int]:
    """Processes still in group ``pgid``, zombies included (an unreaped worker is still there)."""
    left = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    left.append(int(entry))
            except ProcessLookupError:
                continue
    return left


def _end_job(p: subprocess.Popen, hang_s: float = 600) -> str:
    """Wait for the job's main process ('' once it exited), or kill the group and say it hung."""
    try:
        p.wait(timeout=hang_s)
        return ""
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        return f"still running {hang_s:g}s later (hung)"


def _holds(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open, by inode (the lock was opened under its tagged temporary's name)."""
    try:
        want = os.stat(path)
        fds = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return False
    for fd in fds:
        with contextlib.suppress(FileNotFoundError):
            there = os.stat(f"/proc/{pid}/fd/{fd}")
            if (there.st_dev, there.st_ino) == (want.st_dev, want.st_ino):
                return True
    return False


def _children(pid: int) -> list[int]:
    kids = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            kids += [int(k) for k in f.read().split()]
    return kids


_PAUSED_WRITER = ("import os, signal, sys\n"
                  "from tokenswap.files import atomic_write\n"
                  "os.fsync = lambda fd: signal.pause()  # holds the write between its temporary and the rename\n"
                  "atomic_write(sys.argv[1], b'{}')\n")


def _writer_at(path: Path) -> tuple[subprocess.Popen, Path]:
    """A process in the middle of ``atomic_write(path)`` (its temporary written, not yet renamed), and the temporary."""
    before = set(path.parent.glob(f"{path.name}.*.tmp"))
    p = subprocess.Popen([PY, "-c", _PAUSED_WRITER, str(path)], cwd=REPO, env=ENV, stderr=subprocess.DEVNULL)
    while p.poll() is None:
        new = set(path.parent.glob(f"{path.name}.*.tmp")) - before
        if new:
            return p, new.pop()
        time.sleep(0.005)
    raise RuntimeError(f"the paused writer of {path} exited {p.returncode} before writing its temporary")


def _dead_and_live_temporaries(dead_of: Path, live_of: Path) -> tuple[Path, Path, subprocess.Popen]:
    """A temporary of a writer SIGKILLed mid-write beside ``dead_of``, and a live writer's beside ``live_of``."""
    killed, dead = _writer_at(dead_of)
    killed.kill()
    killed.wait()
    live_writer, live = _writer_at(live_of)
    return dead, live, live_writer


def section_runs_end(t: Tally, work: Path, model: Path, store: Path) -> None:
    """Runs end, with their workers, and free their folder; what dead writers left is removed at the restart."""
    from tokenswap.files import FolderLock, atomic_write

    ref = _train_reference(work, model, store)
    workers = "train.dataloader_num_workers=2"

    # A finished run with persistent workers: "done", then the process ends with its workers (it used to live on,
    # holding the folder, waiting for workers that ignore SIGTERM).
    out, log = work / "end-persistent", work / "end-persistent.log"
    p = _start_job(train_cmd(out, model, store, workers, "train.dataloader_persistent_workers=true", steps=4), log)
    problem = _end_job(p)
    done_at = log.stat().st_mtime
    left = _group_left(p.pid)
    said = log.read_text(errors="replace")
    if not problem and (p.returncode != 0 or f"done: {out}" not in said):
        problem = f"rc={p.returncode}: {said[-300:]}"
    problem = problem or (f"{len(left)} worker(s) left after the run ended: {left}" if left else "")
    t.add("runs_end", "a finished run with train.dataloader_persistent_workers=true ends with its workers (exit 0, "
          f"{max(0.0, time.time() - done_at):.1f}s after its last line, no process of its group left)", not problem,
          problem)

    # The whole job SIGTERMed as the workers start: each worker holds its first batch until the signal is pending.
    out, log = work / "end-sigterm-start", work / "end-sigterm-start.log"
    p = _start_job(train_cmd(out, model, store, workers), log, {WORKER_HOLD_ENV: "300"})
    problem = "" if _wait_text(p, log, WORKER_HOLD_LINE) else f"no worker started: {log.read_text()[-300:]}"
    if not problem:
        os.killpg(p.pid, signal.SIGTERM)
    problem = problem or _end_job(p)
    said = log.read_text(errors="replace")
    left = _group_left(p.pid)
    if not problem:
        if p.returncode != 143 or "Traceback" in said:
            problem = f"rc={p.returncode}: {said[-400:]}"
        elif left:
            problem = f"{len(left)} orphan(s) left: {left}"
        elif not (out / "checkpoint-1" / "tokenswap_complete.json").is_file():
            problem = "no complete checkpoint-1"
    problem = problem or _resume_to_end(out, model, store, ref)
    t.add("runs_end", "SIGTERM to the job's process group before the first batch: step 1 saved, exit 143, no "
          "traceback, no orphan; the resume equals an uninterrupted run", not problem, problem)

    # SIGKILL of a run whose workers are serving batches: the next run gets the folder at its first try.
    out, log = work / "end-sigkill", work / "end-sigkill.log"
    p = _start_job(train_cmd(out, model, store, workers), log, {PAUSE_ENV: "300@2"})
    problem, orphans = "", []
    try:
        if not _wait_text(p, log, PAUSE_LINE):
            problem = f"the run never reached checkpoint-2: {log.read_text()[-300:]}"
        else:
            kids = _children(p.pid)
            holding = [k for k in kids if _holds(k, out / ".train-lock-r000")]
            if not _holds(p.pid, out / ".train-lock-r000"):
                problem = "the run does not hold its folder's lock file: the check below would see nothing"
            p.kill()
            p.wait()
            try:
                FolderLock(out, 0, prefix=".train-lock").acquire().release()
            except RuntimeError as e:
                problem = f"the lock was still held right after the SIGKILL: {e}"
            orphans = [k for k in kids if os.path.exists(f"/proc/{k}")]
            if len(kids) < 2:
                problem = problem or f"{len(kids)} worker(s) found, expected 2"
            elif holding:
                problem = problem or f"worker(s) {holding} hold a descriptor of the lock file"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    problem = problem or _resume_to_end(out, model, store, ref)
    t.add("runs_end", f"SIGKILL of a run with 2 workers: the lock is free at the first try ({len(orphans)} orphaned "
          "worker(s) still alive then), the resume equals an uninterrupted run", not problem, problem)

    # Dead writers' temporaries: a writer SIGKILLed between its temporary and the rename, and a live one. The
    # restarted run (its folder) and the restarted build (its folder) remove the dead one and keep the live one.
    out = work / "end-sigkill"  # complete now (resumed to the end)
    older, newest = sorted(out.glob("checkpoint-*"), key=lambda c: int(c.name.split("-")[1]))[-2:]
    dead, live, writer = _dead_and_live_temporaries(older / "tokenswap_state.rank0.json",
                                                    newest / "tokenswap_state.rank0.json")
    try:
        proc = run(train_cmd(out, model, store, "train.resume_from_checkpoint=latest"), 1800)
        problem = f"rc={proc.returncode}: {proc.stderr[-300:]}" if proc.returncode else ""
        problem = problem or ("the dead writer's temporary is still there" if dead.exists() else "")
        problem = problem or ("the live writer's temporary was removed" if not live.exists() else "")
        problem = problem or compare_logs(out, ref)
    finally:
        writer.kill()
        writer.wait()
    t.add("runs_end", "a training run restarted over a SIGKILLed writer's temporary removes it (a live writer's is "
          "kept) and ends equal to an uninterrupted run", not problem, problem)

    build = work / "end-build"
    proc = run(store_cmd(build, "data.max_samples=20"), 1800)
    problem = f"build rc={proc.returncode}: {proc.stderr[-300:]}" if proc.returncode else ""
    if not problem:
        before = llm_build_files(build)
        dead, live, writer = _dead_and_live_temporaries(build / "state" / "plan.json", build / "report.json")
        try:
            proc = run(store_cmd(build, "data.max_samples=20"), 1800)
            problem = f"rerun rc={proc.returncode}: {proc.stderr[-300:]}" if proc.returncode else ""
            problem = problem or ("the dead writer's temporary is still there" if dead.exists() else "")
            problem = problem or ("the live writer's temporary was removed" if not live.exists() else "")
            after = {k: v for k, v in llm_build_files(build).items() if not k.endswith(".tmp")}
            problem = problem or ("" if after == before else f"files changed: {sorted(set(after) ^ set(before))[:4]}")
        finally:
            writer.kill()
            writer.wait()
    t.add("runs_end", "a store build restarted over a SIGKILLed writer's temporary removes it (a live writer's is "
          "kept), the build unchanged", not problem, problem)

    # A write that fails (a full disk) leaves no temporary: a real ENOSPC on a small tmpfs.
    disk = work / "end-full-disk"
    disk.mkdir(exist_ok=True)
    mounted = os.geteuid() == 0 and shutil.which("mount") and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True).returncode == 0
    if not mounted:
        t.note("runs_end", "the full-disk write was not tried: it needs root and mount -t tmpfs")
        return
    try:
        try:
            atomic_write(disk / "big.json", b"x" * (1 << 20))
            problem = "a 1 MiB write into 256 KiB succeeded"
        except OSError as e:
            problem = "" if e.errno == 28 else f"{type(e).__name__}: {e}"
        left = [p.name for p in disk.iterdir()]
        problem = problem or (f"left behind: {left}" if left else "")
    finally:
        subprocess.run(["umount", str(disk)], check=False)
    t.add("runs_end", "atomic_write on a full disk: ENOSPC raised, no temporary left", not problem, problem)



# ============================================================================ main


SECTIONS = ("store", "store_images", "native_images", "shard_rewrite", "data", "malformed", "llm", "concurrency",
            "training", "workers", "same_folder", "state_window", "sigterm", "resume_settings",
            "secrets", "null_replies", "bad_replies", "runs_end")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    parser.add_argument("--store-kills", type=int, default=6)
    parser.add_argument("--train-kills", type=int, default=6)
    parser.add_argument("--concurrency-kills", type=int, default=4)
    parser.add_argument("--json", default=None, help="also write the trials here")
    args = parser.parse_args(argv)
    sections = [s for s in args.sections.split(",") if s]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tokenswap-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    tally = Tally()
    t0 = time.monotonic()
    model = store = None
    if {"native_images", "shard_rewrite", "training", "workers", "same_folder", "state_window", "sigterm",
            "resume_settings", "runs_end"} & set(sections):
        from tokenswap.testing import build_tiny_qwen2vl, build_tiny_store

        with contextlib_quiet():
            model = build_tiny_qwen2vl(work / "tiny-qwen2vl")
            store = build_tiny_store(work / "tiny-store").root
    runners = {
        "store": lambda: section_store(tally, work, rng, args.store_kills),
        "store_images": lambda: section_store_images(tally, work),
        "native_images": lambda: section_native_images(tally, work, model),
        "shard_rewrite": lambda: section_shard_rewrite(tally, work, model),
        "data": lambda: section_data(tally, work),
        "malformed": lambda: section_malformed(tally, work),
        "llm": lambda: section_llm(tally, work),
        "concurrency": lambda: section_concurrency(tally, work, rng, args.concurrency_kills),
        "training": lambda: section_training(tally, work, rng, model, store, args.train_kills),
        "workers": lambda: section_workers(tally, work, model, store),
        "same_folder": lambda: section_same_folder(tally, work, model, store),
        "state_window": lambda: section_state_window(tally, work, model, store),
        "sigterm": lambda: section_sigterm(tally, work, rng, model, store),
        "resume_settings": lambda: section_resume_settings(tally, work, model, store),
        "secrets": lambda: section_secrets(tally, work, model, store),
        "null_replies": lambda: section_null_replies(tally, work),
        "bad_replies": lambda: section_bad_replies(tally, work),
        "runs_end": lambda: section_runs_end(tally, work, model, store),
    }
    timings = {}
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
    print(f"total {total:.0f}s, workdir {work}")
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


class contextlib_quiet:  # noqa: N801 - silences the progress bars of the tiny model/store builders
    def __enter__(self):
        self._out = sys.stderr
        sys.stderr = io.StringIO()

    def __exit__(self, *exc):
        sys.stderr = self._out
        return False


if __name__ == "__main__":
    sys.exit(main())
