"""What every section of benchmarks/faults.py shares: the checkout under test, its subprocess environment,
the tally of trials, and the helpers more than one section uses."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The checkout this package sits in is the code it checks: an installed tokenswap (a wheel, another checkout's
# editable install) must answer neither in this process nor in the subprocesses it starts.
if sys.path[:1] != [str(REPO)]:
    sys.path.insert(0, str(REPO))

import tokenswap  # noqa: E402

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


STORE_ARGS = ["data.max_samples=150", "samples_per_shard=10", "concept_batch_size=4", "progress=false"]


def store_cmd(out: Path, *extra: str) -> list[str]:
    return [PY, "-m", "tokenswap.cli", "build-store", "--config", "store_embedded.yaml", f"output_dir={out}",
            *STORE_ARGS, *extra]


def _magpie(i: int) -> bytes:
    return json.dumps({"uuid": f"u{i}", "conversations": [{"from": "human", "value": f"a cat number {i}"},
                                                         {"from": "gpt", "value": "ok"}]}).encode() + b"\n"


def llm_build_files(out: Path) -> dict[str, bytes]:
    """Candidate chunks, store shards, dataset shards and the plan: what must not depend on completion order."""
    files = {}
    for p in sorted(out.rglob("*")):
        rel = p.relative_to(out).as_posix()
        if p.is_file() and not rel.startswith(("state/cache/", ".build-lock")) and "/done-" not in rel \
                and rel != "report.json":
            files[rel] = p.read_bytes()
    return files


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


def _two_rank_cmd(out: Path, model: Path, store: Path, port: int, *extra: str) -> list[str]:
    return [PY, "-m", "accelerate.commands.launch", "--config_file", str(REPO / "configs/accelerate/cpu_2proc.yaml"),
            "--main_process_port", str(port), *train_cmd(out, model, store, *extra, steps=6)[1:]]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


def _switchable(respond_bad, hit) -> tuple[dict, Callable]:
    """A ``respond`` hook answering ``respond_bad()`` to requests ``hit`` picks while ``state["on"]``."""
    state = {"on": True}

    def respond(payload, headers):
        return (200, respond_bad()) if state["on"] and hit(payload) else None

    return state, respond


def _store_rerun_trials(t: Tally, section: str, what: str, work: Path, bad: Callable[[], bytes], ref: Path,
                        stage: str) -> None:
    """build-store with bad replies to the requests about "garden" in one stage, then the same command again."""
    from tests.support import LoadLLMServer, concept_reply

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
    from tests.support import LoadLLMServer

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
    from tests.support import LoadLLMServer

    out = work / name
    with LoadLLMServer(answer) as server:
        proc = run(_eval_cmd(server.base_url, bench, out, *extra), 600)
    if proc.returncode != 0:
        raise RuntimeError(f"reference eval failed: {proc.stderr[-1000:]}")
    return json.loads((out / "gap.json").read_text())


def _build_reference(work: Path, name: str) -> Path:
    from tests.support import LoadLLMServer, concept_reply

    out = work / name
    with LoadLLMServer(concept_reply) as server:
        proc = run(_small_build_cmd(out, server.base_url), 600)
    if proc.returncode != 0:
        raise RuntimeError(f"reference build failed: {proc.stderr[-1000:]}")
    return out


class contextlib_quiet:  # noqa: N801 - silences the progress bars of the tiny model/store builders
    def __enter__(self):
        self._out = sys.stderr
        sys.stderr = io.StringIO()

    def __exit__(self, *exc):
        sys.stderr = self._out
        return False
