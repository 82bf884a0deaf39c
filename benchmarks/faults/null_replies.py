"""Section ``null_replies`` of benchmarks/faults.py: a 200 with ``content: null`` (or none) for some requests:
``build-store`` (extract and judge stages) exits 1 with ``complete: false`` counting failed requests, the rerun asks
them again and equals an uninterrupted build; ``tokenswap eval`` records them as failed, never as the answer ``""``,
never scored, the rerun asks exactly those and equals an uninterrupted run; the bench builder records no such item,
the rerun equals an uninterrupted run.
"""

from __future__ import annotations

import json
from pathlib import Path

from ._common import (
    Tally,
    _build_reference,
    _eval_answer,
    _eval_reference,
    _eval_rerun_trials,
    _fault_bench,
    _store_rerun_trials,
)

OUTCOME = (
    "content null/missing: a failed request (build-store complete: false, eval not scored, bench item not "
    "recorded), asked again by the rerun, which equals an uninterrupted run"
)


def _null_body() -> bytes:
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": None}, "finish_reason": "stop"}]}).encode()


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

    from tests.support import LoadLLMServer
    from tokenswap.concepts import LexiconExtractor
    from tokenswap.eval.bench_builder import BenchBuilder, BenchRequestsFailed
    from tokenswap.eval.mc import MCItem
    from tokenswap.inference import OpenAIChatModel
    from tokenswap.store.image_store import ImageStore, StoreWriter

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
