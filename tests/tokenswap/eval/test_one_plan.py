"""One planner for both evaluators: ``tokenswap eval --backend hf --forms all`` and the in-loop ``GapEvaluator`` ask
the same units, skip the same items with the same reasons and give the same decomposition, on a bench with items
whose tags lack concept names (the text and img rows do not align there) and pictures that several items show.

The model is the tiny one fine-tuned to answer "B" (conftest's ``always_b``), so both paths' answers are
deterministic and differ item by item only through each item's answer letter and each recognition item's order.
"""

from __future__ import annotations

import json

from test_forms import write_bench

from tokenswap.cli import main as tokenswap_main
from tokenswap.data.tokenswap_bench import load_tokenswap_bench_pairs
from tokenswap.eval.gap import GapEvaluator
from tokenswap.families import load_checkpoint

BROKEN = {1, 3}  # q1 (a car) and q3 (an apple and a house): their img rows say something else
IN_LOOP = ("both", "rendered", "recognition")  # every form but caption (it needs a generation pass first)


def _reasons(record: dict) -> dict:
    return {k: v for k, v in record.items() if k.startswith(("skipped_", "error_"))}


def test_the_cli_and_the_in_loop_evaluator_share_one_plan(always_b, tmp_path):
    root = tmp_path / "bench"
    write_bench(root, broken=BROKEN)
    out = tmp_path / "out"
    argv = ["eval", "--backend", "hf", "--model", str(always_b), "--bench", str(root), "--forms", "all", "--scorer",
            "loglik", "--batch-size", "4", "--out", str(out)]
    assert tokenswap_main(argv) == 0
    cli = json.loads((out / "gap.json").read_text())
    keys = {json.loads(line)["key"] for line in (out / "records.jsonl").read_text().splitlines()}

    model, processor = load_checkpoint(always_b)
    pairs = load_tokenswap_bench_pairs(root)
    evaluator = GapEvaluator(processor, pairs, scorer="loglik", batch_size=4, forms=IN_LOOP, progress=False)
    loop = evaluator.evaluate(model)

    # The same units: every request but the captions and the caption form (which only the CLI runs).
    asked = {k for k in keys if not k.startswith(("captioning|", "caption|"))}
    assert {u.key for u in evaluator.units} == asked
    # Forms are independent: the items without concept names are asked in text, interleaved and caption ...
    broken = {f"test/{i}" for i in BROKEN}
    for i in broken:
        assert {f"text|{i}", f"interleaved|{i}", f"caption|{i}"} <= keys and f"both|{i}" not in keys
    # ... and scored there, skipped (with the reason) in both, rendered and recognition, in both evaluators alike.
    assert cli["n"] == loop.overall.n == len(pairs) and cli["excluded"] == loop.excluded == []
    assert [r["id"] for r in cli["items"]] == [r["id"] for r in loop.items]
    for got, want in zip(cli["items"], loop.items):
        assert _reasons(got) == _reasons(want)
        assert bool(_reasons(got)) == (got["id"] in broken)
        for form in ("text", "interleaved", *IN_LOOP[:2]):
            assert got[f"correct_{form}"] == want[f"correct_{form}"], (got["id"], form)
        assert got["recognized"] == want["recognized"] and got["pictures"] == want["pictures"]
    q3 = next(r for r in loop.items if r["id"] == "test/3")
    assert q3["correct_both"] is None and q3["correct_text"] is not None
    assert q3["skipped_both"].startswith("not asked: <image 1>, <image 2> have no concept name")
    assert q3["recognized"] is None
    counts = {f: c for f, c in cli["form_counts"].items() if f != "caption"}
    assert counts == loop.form_counts
    assert counts["both"] == {"n": len(pairs) - 2, "failed": 0, "skipped": 2}
    assert cli["form_counts"]["caption"]["n"] == len(pairs)  # captions need no concept name
    # Repeated pictures: one recognition item per distinct (concept, picture), shown by every item showing it.
    pictures = {p["picture"]: p for p in cli["pictures"]}
    cat = next(p for p in pictures.values() if p["concept"] == "cat" and "test/0" in p["items"])
    assert cat["items"] == ["test/0", "test/2"]
    assert sum(k.startswith("recognition|") for k in keys) == len(loop.recognition) == sum(
        p["correct_recognition"] is not None for p in cli["pictures"])
    assert [{k: p[k] for k in ("picture", "concept", "items", "correct_recognition")} for p in cli["pictures"]] == [
        {k: p[k] for k in ("picture", "concept", "items", "correct_recognition")} for p in loop.pictures]
    # The same decomposition, over the same items (those scored in every form), but for the caption form's parts.
    d = dict(cli["decomposition"])
    assert d.pop("caption_recovery") is not None and d["acc"].pop("caption") is not None
    d["forms"].remove("caption")
    want = dict(loop.decomposition)
    assert want.pop("caption_recovery") is None
    assert d == want and d["n"] == len(pairs) - 2
    metrics = loop.metrics()
    assert metrics["gap/n"] == len(pairs) and metrics["gap/n_both"] == len(pairs) - 2
