"""Every form of ``tokenswap eval`` against a scripted model server whose answers follow fixed rules from the pictures
it receives, so each form's accuracy, the recognition rate, the decomposition and the gap by images sent have exact
expected values; bad input (no concept names, a picture that does not decode, an empty or huge caption); resume.

The scripted model (:class:`RuleModel`) decodes every ``image_url`` it is sent and looks the picture's pixels up in a
table the test builds: which concept it shows and whether the model "recognises" it; pictures of rendered words are
registered by rendering the words with the store's own renderer. An item is answered right iff it is not marked
hard, fewer than 3 image parts came with it (the load rule) and every concept of the question is available: as a
word in the text (the text form, ``both``, a caption naming it), as a recognisable picture, or as a picture of the
word. A caption names a recognisable picture's concept ("a photo of a cat") and not an unrecognisable one's; the
recognition item is answered right for a recognisable picture only.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.support import LoadLLMServer
from tokenswap.cli import main as tokenswap_main
from tokenswap.data.tokenswap_bench import load_tokenswap_bench_pairs
from tokenswap.eval.gap import GapEvaluator
from tokenswap.eval.mc import LETTERS, MCItem
from tokenswap.families import load_checkpoint

ROOT = Path(__file__).resolve().parents[3]

# concept -> (colour, recognisable); "cat2" is a second, different picture of a cat.
PICTURES = {
    "cat": ("red", True), "dog": ("green", True), "car": ("blue", False), "apple": ("yellow", True),
    "house": ("purple", False), "tree": ("orange", True), "cat2": ("white", True),
}
# (question with {picture} slots, choices, answer, hard): a slot is replaced by the word in the text config and by
# an <image N> tag in the img config (one tag per distinct picture, repeated where the picture repeats).
ITEMS = [
    ("Is a {cat} bigger than a mouse?", ["yes", "no", "same", "unknown"], 0, False),
    ("Can a {car} fly?", ["yes", "no", "sometimes", "unknown"], 1, False),
    ("Does a {cat} chase a {dog}, or does the {cat} flee?", ["chase", "flee", "both", "neither"], 2, False),
    ("Is an {apple} found in a {house}?", ["yes", "no", "often", "never"], 2, False),
    ("Is the sky blue?", ["yes", "no", "at night", "never"], 0, False),
    ("(hard) Which {tree} is tallest?", ["oak", "pine", "fir", "elm"], 3, True),
    ("Which is heavier: the {dog} or the {cat2}?", ["the {dog}", "the {cat2}", "same", "unknown"], 0, False),
    ("Is a {apple} sweet?", ["yes", "no", "sour", "bitter"], 0, False),
]
CAPTION_TEXT = "Describe this image in a few words."


def _word(slot: str) -> str:
    return "cat" if slot == "cat2" else slot


def _picture(slot: str) -> Image.Image:
    color, _ = PICTURES[slot]
    return Image.new("RGB", (40 + 4 * list(PICTURES).index(slot), 40), color)


def write_bench(root: Path, items=ITEMS, broken: set[int] = frozenset()) -> list[dict]:
    """The bench in the hub layout; returns the test's own view of each item (its slots, tags, answer)."""
    from tokenswap.data.tokenswap_bench import write_tokenswap_bench

    pairs, views = [], []
    for i, (question, choices, answer, hard) in enumerate(items):
        texts = [f"[q{i}] {question}", *choices]
        slots = list(dict.fromkeys(re.findall(r"\{(\w+)\}", " ".join(texts))))
        tag = {s: n + 1 for n, s in enumerate(slots)}
        plain = [re.sub(r"\{(\w+)\}", lambda m: _word(m.group(1)), t) for t in texts]
        tagged = [re.sub(r"\{(\w+)\}", lambda m, tag=tag: f"<image {tag[m.group(1)]}>", t) for t in texts]
        if i in broken:  # the img row says something else: the two configs do not align on this item
            tagged[0] = tagged[0].replace("?", " today?")
        text = MCItem(f"q{i}", "tiny_world", plain[0], plain[1:], answer)
        inter = MCItem(f"q{i}", "tiny_world", tagged[0], tagged[1:], answer, {tag[s]: _picture(s) for s in slots})
        pairs.append((text, inter))
        sent = sum(len(re.findall(r"\{\w+\}", t)) for t in texts)
        views.append({"id": f"test/{i}", "marker": f"q{i}", "slots": slots, "answer": LETTERS[answer], "hard": hard, "sent": sent})
    write_tokenswap_bench(pairs, root)
    return views


def _pixels(image: Image.Image) -> str:
    array = np.asarray(image.convert("RGB"))
    return f"{array.shape}:{hash(array.tobytes())}"


class RuleModel:
    """The scripted model: ``reply(payload)`` for :class:`tests.support.LoadLLMServer`."""

    def __init__(self, captions: dict[str, str] | None = None):
        from tokenswap.store.sources import render_word

        self.table: dict[str, tuple[str, bool, str]] = {}  # pixels -> (concept, recognisable, kind)
        for slot, (_, known) in PICTURES.items():
            self.table[_pixels(_picture(slot))] = (_word(slot), known, slot)
        for word in {_word(s) for s in PICTURES}:
            self.table[_pixels(render_word(word))] = (word, True, "rendered")
        self.captions = captions or {}  # slot -> a caption reply to give instead of the rule's
        self.items = {}
        self.asked: Counter = Counter()

    def reply(self, payload: dict) -> str:
        parts = payload["messages"][0]["content"]
        text = "".join(p["text"] for p in parts if p["type"] == "text")
        seen = [self.table[_pixels(Image.open(io.BytesIO(base64.b64decode(p["image_url"]["url"].split(",", 1)[1]))))]
                for p in parts if p["type"] == "image_url"]
        if text.strip() == CAPTION_TEXT:
            (concept, known, slot), = seen
            self.asked["caption", slot] += 1
            if slot in self.captions:
                return self.captions[slot]
            return f"A photo of a {concept}." if known else "A blurry shape."
        if "Which concept does this image show?" in text:
            (concept, known, slot), = seen
            self.asked["recognition", slot] += 1
            options = dict(re.findall(r"^([ABCD])\. (.+)$", text, flags=re.M))
            right = next(k for k, v in options.items() if v == concept)
            return f"Answer: {right if known else next(k for k in options if k != right)}"
        view = self.items[re.search(r"\[(q\d+)\]", text).group(1)]
        self.asked["item", view["id"]] += 1
        words = {_word(s) for s in view["slots"]}
        pictured = {c for c, known, kind in seen if known}
        available = all(re.search(rf"\b{w}\b", text) or w in pictured for w in words)
        right = not view["hard"] and len(seen) < 3 and available
        wrong = LETTERS[(LETTERS.index(view["answer"]) + 1) % 4]
        return f"Answer: {view['answer'] if right else wrong}"


def expected(views: list[dict]) -> dict:
    """What the rules give, form by form, from the test's own view of the items (not from tokenswap's forms)."""
    out = {}
    for v in views:
        known = {_word(s): PICTURES[s][1] for s in v["slots"]}
        load = v["sent"] >= 3

        def ok(available: bool, images: bool, hard=v["hard"], load=load) -> bool:
            return not hard and not (images and load) and available

        out[v["id"]] = {
            "text": ok(True, False), "interleaved": ok(all(known.values()), True), "both": ok(True, True),
            "caption": ok(all(known.values()), False), "rendered": ok(True, True),
            "recognized": all(PICTURES[s][1] for s in v["slots"]), "sent": v["sent"],
        }
    return out


def _valid_lines(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # the torn last line of a kill
            pass
    return out


def _eval(server, bench: Path, out: Path, *extra: str) -> list[str]:
    return ["eval", "--backend", "openai", "--base-url", server.base_url, "--model", "rule-vlm", "--bench",
            str(bench), "--out", str(out), "--concurrency", "4", *extra]


@pytest.fixture
def bench(tmp_path):
    root = tmp_path / "bench"
    return root, write_bench(root)


@pytest.mark.integration
def test_every_form_and_the_decomposition_follow_the_rules(bench, tmp_path):
    root, views = bench
    model = RuleModel()
    model.items = {v["marker"]: v for v in views}
    with LoadLLMServer(reply=model.reply) as server:
        assert tokenswap_main(_eval(server, root, tmp_path / "out", "--forms", "all")) == 0
        n_requests = len(server.requests)
    summary = json.loads((tmp_path / "out" / "gap.json").read_text())
    want = expected(views)
    forms = ["text", "interleaved", "both", "caption", "rendered"]
    assert summary["forms"] == [*forms, "recognition"] and summary["n"] == len(views) == summary["n_pairs"]
    assert summary["n_failed"] == summary["n_skipped"] == 0 and summary["excluded"] == []
    for item in summary["items"]:
        w = want[item["id"]]
        assert {f: item[f"correct_{f}"] for f in forms} == {f: w[f] for f in forms}, item["id"]
        assert item["recognized"] == w["recognized"] and item["images_sent"] == w["sent"]
    for f in forms:
        assert summary[f"acc_{f}"] == pytest.approx(sum(w[f] for w in want.values()) / len(want))
    # Seven pictures in the bench, one shown by two items (q0, q2 show the same cat); q7's apple is q3's.
    slots = {s for v in views for s in v["slots"]}
    assert summary["n_pictures"] == len(slots) == 7
    assert summary["recognition_rate"] == pytest.approx(sum(PICTURES[s][1] for s in slots) / len(slots))
    # Each distinct picture captioned once and identified once; every item asked once per item form.
    assert {k: n for k, n in model.asked.items() if k[0] != "item"} == {
        (kind, s): 1 for kind in ("caption", "recognition") for s in slots}
    assert {k[1]: n for k, n in model.asked.items() if k[0] == "item"} == {v["id"]: 5 for v in views}
    assert n_requests == 5 * len(views) + 2 * len(slots)
    pictures = {p["picture"].split("#")[0] for p in summary["pictures"]}
    assert pictures == {"cat", "dog", "car", "apple", "house", "tree"}
    captions = {p["concept"]: p["caption"] for p in summary["pictures"]}
    assert captions["car"] == "A blurry shape" and captions["dog"] == "A photo of a dog"

    d = summary["decomposition"]

    def mean(values) -> float:
        values = list(values)
        return sum(values) / len(values)

    t, x, b, c, r = ([w[f] for w in want.values()] for f in forms)
    assert d["gap"]["value"] == pytest.approx(mean(a - z for a, z in zip(t, x)))
    assert d["load"]["value"] == pytest.approx(mean(a - z for a, z in zip(t, b)))
    assert d["content"]["value"] == pytest.approx(mean(a - z for a, z in zip(b, x)))
    assert d["caption_recovery"]["value"] == pytest.approx(mean(a - z for a, z in zip(c, x)))
    assert d["reading_recovery"]["value"] == pytest.approx(mean(a - z for a, z in zip(r, x)))
    known = [w for w in want.values() if w["recognized"]]
    assert d["recognised_only"]["n"] == len(known)
    assert d["recognised_only"]["gap"]["value"] == pytest.approx(mean(w["text"] - w["interleaved"] for w in known))
    rest = mean(w["both"] - w["interleaved"] for w in known)
    parts = {k: v["value"] for k, v in d["components"].items()}
    assert parts == pytest.approx({"load": d["load"]["value"], "recognition": d["content"]["value"] - rest,
                                   "rest": rest})
    assert sum(parts.values()) == pytest.approx(d["gap"]["value"])
    for k, group in d["by_images_sent"].items():
        members = [w for w in want.values() if w["sent"] == int(k)]
        assert group["n"] == len(members)
        assert group["gap"]["value"] == pytest.approx(mean(w["text"] - w["interleaved"] for w in members))
    assert sorted(map(int, d["by_images_sent"])) == sorted({w["sent"] for w in want.values()})
    md = (tmp_path / "out" / "gap.md").read_text()
    assert "Why the gap" in md and "load = text − both" in md
    assert (tmp_path / "out" / "gap_forms.png").stat().st_size > 5000


@pytest.mark.integration
def test_a_rerun_with_more_forms_asks_only_the_new_ones_and_recognition_runs_on_openai(bench, tmp_path):
    root, views = bench
    model = RuleModel()
    model.items = {v["marker"]: v for v in views}
    out = tmp_path / "out"
    with LoadLLMServer(reply=model.reply) as server:
        assert tokenswap_main(_eval(server, root, out)) == 0  # today's default: the gap alone
        assert len(server.requests) == 2 * len(views)
        default = json.loads((out / "gap.json").read_text())
        assert default["forms"] == ["text", "interleaved"] and "Why the gap" not in (out / "gap.md").read_text()
        assert tokenswap_main(_eval(server, root, out, "--forms", "both,recognition")) == 0
        slots = {s for v in views for s in v["slots"]}
        assert len(server.requests) == 3 * len(views) + len(slots)
    summary = json.loads((out / "gap.json").read_text())
    assert summary["forms"] == ["text", "interleaved", "both", "recognition"]
    assert [i["correct_text"] for i in summary["items"]] == [i["correct_text"] for i in default["items"]]
    assert set(summary["decomposition"]["components"]) == {"load", "recognition", "rest"}


@pytest.mark.integration
def test_items_without_concept_names_are_skipped_only_in_the_forms_that_need_them(tmp_path):
    root = tmp_path / "bench"
    views = write_bench(root, broken={1, 3})
    model = RuleModel()
    model.items = {v["marker"]: v for v in views}
    with LoadLLMServer(reply=model.reply) as server:
        # The gap alone needs no concept names: every item is scored.
        assert tokenswap_main(_eval(server, root, tmp_path / "plain")) == 0
        assert json.loads((tmp_path / "plain" / "gap.json").read_text())["n"] == len(views)
        server.requests.clear()
        assert tokenswap_main(_eval(server, root, tmp_path / "out", "--forms", "both,rendered")) == 0
        asked = Counter(re.search(r"\[(q\d+)\]", json.dumps(p)).group(1) for p in server.requests)
    summary = json.loads((tmp_path / "out" / "gap.json").read_text())
    # Forms are independent: q1 and q3 stay in the gap (text and interleaved), left out of both and rendered only.
    assert summary["n"] == len(views) and summary["n_skipped"] == summary["n_failed"] == 0 and not summary["excluded"]
    assert asked == {v["marker"]: 2 if v["marker"] in ("q1", "q3") else 4 for v in views}
    assert summary["form_counts"] == {"text": {"n": 8, "failed": 0, "skipped": 0},
                                      "interleaved": {"n": 8, "failed": 0, "skipped": 0},
                                      "both": {"n": 6, "failed": 0, "skipped": 2},
                                      "rendered": {"n": 6, "failed": 0, "skipped": 2}}
    q3 = next(r for r in summary["items"] if r["id"] == "test/3")
    assert q3["correct_both"] is None and isinstance(q3["correct_text"], bool)
    assert q3["skipped_both"].startswith("not asked: <image 1>, <image 2> have no concept name") and "--forms both," \
        "rendered need" in q3["skipped_both"]
    want = expected(views)
    scored = [w for i, w in want.items() if i not in ("test/1", "test/3")]
    assert summary["acc_both"] == pytest.approx(sum(w["both"] for w in scored) / len(scored))
    assert summary["acc_text"] == pytest.approx(sum(w["text"] for w in want.values()) / len(want))
    d = summary["decomposition"]  # each component on the items scored in the forms it uses
    assert (d["n"], d["acc"]["both"]["n"], d["load"]["n"], d["split"]["n"]) == (8, 6, 6, 6)
    md = (tmp_path / "out" / "gap.md").read_text()
    assert "Split on 6 of the 8 items (the items scored in text, interleaved and both), not of the gap above" in md
    assert "both: n 6, 0 failed, 2 skipped (first: test/1: skipped: not asked" in (tmp_path / "out" / "gap.md").read_text()


@pytest.mark.integration
def test_empty_and_huge_captions_skip_only_the_caption_form_of_their_items(bench, tmp_path):
    root, views = bench
    model = RuleModel(captions={"dog": "", "car": "word " * 400})
    model.items = {v["marker"]: v for v in views}
    out = tmp_path / "out"
    with LoadLLMServer(reply=model.reply) as server:
        assert tokenswap_main(_eval(server, root, out, "--forms", "all")) == 0
        asked = len(server.requests)
        assert tokenswap_main(_eval(server, root, out, "--forms", "all")) == 0
        assert len(server.requests) == asked  # the model's answer, recorded: a rerun does not ask again
    summary = json.loads((out / "gap.json").read_text())
    # The dog is in q2 and q6, the car in q1: their caption forms are never asked; every other form keeps them.
    assert summary["n"] == len(views) and summary["excluded"] == [] and summary["n_skipped"] == 0
    counts = summary["form_counts"]
    assert counts["caption"] == {"n": len(views) - 3, "failed": 0, "skipped": 3}
    assert all(counts[f]["n"] == len(views) for f in ("text", "interleaved", "both", "rendered", "recognition"))
    items = {r["id"]: r for r in summary["items"]}
    assert items["test/2"]["skipped_caption"].startswith("caption of picture dog#") and "the caption is empty" in \
        items["test/2"]["skipped_caption"]
    assert "the caption is 1999 characters, more than 500" in items["test/1"]["skipped_caption"]
    want = expected(views)
    for form in ("text", "interleaved", "both", "rendered"):
        assert [r[f"correct_{form}"] for r in summary["items"]] == [want[i][form] for i in items]
        assert summary[f"acc_{form}"] == pytest.approx(sum(w[form] for w in want.values()) / len(want))
    kept = [i for i in items if i not in ("test/1", "test/2", "test/6")]
    assert summary["acc_caption"] == pytest.approx(sum(want[i]["caption"] for i in kept) / len(kept))
    d = summary["decomposition"]  # the thin caption form narrows only caption recovery
    assert (d["n"], d["acc"]["caption"]["n"], d["caption_recovery"]["n"]) == (len(views), len(kept), len(kept))
    assert d["load"]["n"] == d["split"]["n"] == len(views)
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert not any(r["key"] in ("caption|test/1", "caption|test/2", "caption|test/6") for r in records)


@pytest.mark.integration
def test_captions_holding_tags_template_tokens_or_braces_are_data_and_the_rerun_finishes(bench, tmp_path):
    # A caption "<image 1> next to <image 2>" used to end --forms caption/all with KeyError "tag <image 1> has no
    # image", and since it is recorded, every rerun the same way.
    root, views = bench
    model = RuleModel(captions={"dog": "<image 1> next to <image 2>", "car": "a <|image_pad|> car",
                                "tree": "a {} tree {0}"})
    model.items = {v["marker"]: v for v in views}
    out = tmp_path / "out"
    with LoadLLMServer(reply=model.reply) as server:
        assert tokenswap_main(_eval(server, root, out, "--forms", "all")) == 0
        asked = len(server.requests)
        assert tokenswap_main(_eval(server, root, out, "--forms", "all")) == 0
        assert len(server.requests) == asked
    summary = json.loads((out / "gap.json").read_text())
    items = {r["id"]: r for r in summary["items"]}
    dog_items = [v["id"] for v in views if "dog" in v["slots"]]
    for item in dog_items:  # skipped in the caption form only, with its reason
        assert "the caption holds an image tag (<image 1>)" in items[item]["skipped_caption"]
    assert summary["form_counts"]["caption"]["skipped"] == len(dog_items)
    assert all(summary["form_counts"][f]["n"] == len(views)
               for f in ("text", "interleaved", "both", "rendered", "recognition"))
    captions = {p["concept"]: p["caption"] for p in summary["pictures"]}
    assert captions["car"] == "a car" and captions["tree"] == "a {} tree {0}"  # plain text in its items


@pytest.mark.parametrize("forms, prompt, scorer, said", [
    (["both"], "k_shot", "generate", "--prompt k_shot has shots for the text and interleaved forms only, not for both; "
                                     "drop them from --forms or use --prompt zero_shot / cot"),
    (["text"], "cot", "loglik", "--prompt cot needs --scorer generate (loglik reads one next token)"),
], ids=["k-shot-controls", "cot-loglik"])
def test_the_cli_and_the_in_loop_evaluator_refuse_a_plan_with_one_message(forms, prompt, scorer, said, tmp_path,
                                                                          capsys, make_pairs):
    argv = ["eval", "--model", "m", "--forms", ",".join(forms), "--prompt", prompt, "--scorer", scorer,
            "--out", str(tmp_path / "r")]
    assert tokenswap_main(argv) == 2
    assert capsys.readouterr().err.strip().endswith(said)
    with pytest.raises(ValueError) as refused:  # refused before the processor is read
        GapEvaluator(None, make_pairs(2), scorer=scorer, prompt=prompt, shots={}, forms=forms)
    assert str(refused.value) == said


def test_the_evaluator_and_the_training_config_refuse_caption_in_the_loop_with_one_message(make_pairs):
    from tokenswap.training.config import GapEvalConfig

    with pytest.raises(ValueError) as evaluator:
        GapEvaluator(None, make_pairs(2), forms=["caption"])
    with pytest.raises(ValueError) as config:
        GapEvalConfig(forms=["text", "caption"])
    assert "the caption form cannot run in the training loop" in str(evaluator.value)
    assert str(config.value) == f"`forms`: {evaluator.value}"


@pytest.mark.integration
def test_a_form_resting_on_no_item_exits_1_naming_the_form_and_why(tmp_path, capsys):
    root = tmp_path / "bench"
    views = write_bench(root, items=[item for item in ITEMS if "{" in item[0]])  # every item shows a picture
    model = RuleModel(captions=dict.fromkeys(PICTURES, ""))  # every caption comes back empty
    model.items = {v["marker"]: v for v in views}
    out = tmp_path / "out"
    with LoadLLMServer(reply=model.reply) as server:
        assert tokenswap_main(_eval(server, root, out, "--forms", "both,caption")) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "the caption form rests on 0 items: 0 items failed and 7 were skipped in it" in \
        errors[0] and "the caption is empty" in errors[0]
    summary = json.loads((out / "gap.json").read_text())  # written, so the counts can be read
    assert summary["n"] == len(views) and summary["form_counts"]["caption"]["n"] == 0
    assert summary["form_counts"]["both"]["n"] == len(views) and summary["acc_caption"] is None


@pytest.mark.integration
@pytest.mark.parametrize("pictureless", [False, True], ids=["every-item-shows-a-picture", "with-pictureless-items"])
def test_all_empty_captions_leave_every_other_component_on_its_own_items(tmp_path, capsys, pictureless):
    """Captions all empty, --forms all: the caption form rests on the picture-less items only (or on none: exit 1),
    and every other component still rests on every item, its n beside it; a form on no item is named in one line."""
    root = tmp_path / "bench"
    items = ITEMS if pictureless else [item for item in ITEMS if "{" in item[0]]
    views = write_bench(root, items=items)
    model = RuleModel(captions=dict.fromkeys(PICTURES, ""))
    model.items = {v["marker"]: v for v in views}
    out = tmp_path / "out"
    with LoadLLMServer(reply=model.reply) as server:
        status = tokenswap_main(_eval(server, root, out, "--forms", "all"))
    n, plain = len(views), sum(not v["slots"] for v in views)
    assert status == (0 if pictureless else 1)
    d = json.loads((out / "gap.json").read_text())["decomposition"]
    assert d["n"] == n and d["load"]["n"] == n and d["split"]["n"] == n and d["acc"]["rendered"]["n"] == n
    assert set(d["components"]) == {"load", "recognition", "rest"} and d["recognition_rate"]["value"] is not None
    md = (out / "gap.md").read_text()
    assert f"Split of the gap {100 * d['gap']['value']:+.1f}" in md  # the split is the headline gap's
    assert "| both |" in md and "load = text − both" in md
    if pictureless:
        assert d["acc"]["caption"]["n"] == d["caption_recovery"]["n"] == plain and d["missing"] == []
    else:
        assert "caption" not in d["acc"] and d["caption_recovery"] is None
        assert [m["form"] for m in d["missing"]] == ["caption"]
        (line,) = [x for x in md.splitlines() if x.startswith("Not shown")]
        assert f"the caption form rests on 0 items: 0 items failed and {n} were skipped" in line
        assert "so no caption recovery" in line
    assert (out / "gap_forms.png").stat().st_size > 5000


@pytest.mark.integration
def test_a_picture_that_does_not_decode_is_a_clear_error_before_any_request(tmp_path, capsys):
    import pyarrow.parquet as pq

    root = tmp_path / "bench"
    write_bench(root)
    (path,) = (root / "img").glob("*.parquet")
    table = pq.read_table(path)
    column = table.column("image_1").to_pylist()
    import pyarrow as pa

    column[2] = {"bytes": b"\x89PNG\r\n\x1a\n not a png at all", "path": None}
    index = table.schema.get_field_index("image_1")
    field = table.schema.field(index)
    pq.write_table(table.set_column(index, field, pa.array(column, type=field.type)), path)
    with LoadLLMServer(reply=lambda payload: "A") as server:
        assert tokenswap_main(_eval(server, root, tmp_path / "out")) == 2
        assert not server.requests
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and "row 2: the picture in column image_1 does not decode" in errors[0]
    assert "replace it or drop that row" in errors[0] and not (tmp_path / "out" / "run.json").exists()


@pytest.mark.integration
def test_failed_requests_are_retried_by_the_rerun_and_the_records_equal_an_uninterrupted_run(bench, tmp_path):
    root, views = bench

    def rules() -> RuleModel:
        model = RuleModel()
        model.items = {v["marker"]: v for v in views}
        return model

    with LoadLLMServer(reply=rules().reply) as server:
        assert tokenswap_main(_eval(server, root, tmp_path / "whole", "--forms", "all")) == 0
    model, failing = rules(), {"count": 0}

    def flaky(payload):  # every third request is dropped once (a caption and a recognition item among them)
        failing["count"] += 1
        if failing["count"] % 3 == 0:
            raise ConnectionError("dropped")
        return model.reply(payload)

    out = tmp_path / "flaky"
    with LoadLLMServer(reply=flaky) as server:
        args = _eval(server, root, out, "--forms", "all", "--max-retries", "0", "--max-error-share", "1")
        # Exit 1 where the drops left a form with no item at all (work left: the same command resumes).
        assert tokenswap_main(args) in (0, 1)
        first = json.loads((out / "gap.json").read_text())
        assert first["n_failed"] > 0 and first["n_failed_requests"] > 0
        assert all(r.startswith(("error", "skipped")) for e in first["excluded"] for r in e["forms"].values())
        server.reply = model.reply  # the rerun: nothing dropped
        assert tokenswap_main(args) == 0
    whole = {r["key"]: r for r in map(json.loads, (tmp_path / "whole" / "records.jsonl").read_text().splitlines())}
    resumed = {r["key"]: r for r in map(json.loads, (out / "records.jsonl").read_text().splitlines())}
    assert resumed == whole
    a, b = (json.loads((d / "gap.json").read_text()) for d in (tmp_path / "whole", out))
    for key in ("items", "pictures", "decomposition", "n_failed", "n_skipped", "usage"):
        assert a[key] == b[key], key


@pytest.mark.integration
def test_kill_mid_run_then_resume_equals_an_uninterrupted_run(bench, tmp_path):
    root, views = bench
    model = RuleModel()
    model.items = {v["marker"]: v for v in views}
    with LoadLLMServer(reply=model.reply) as server:
        assert tokenswap_main(_eval(server, root, tmp_path / "whole", "--forms", "all")) == 0
    out = tmp_path / "killed"
    with LoadLLMServer(reply=model.reply, latency=0.3) as server:
        args = _eval(server, root, out, "--forms", "all")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        with open(tmp_path / "run.log", "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "tokenswap.cli", *args], stdout=log, stderr=log, env=env)
            deadline = time.monotonic() + 120
            while not ((out / "records.jsonl").exists() and len((out / "records.jsonl").read_text().splitlines()) >= 12):
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "run.log").read_text()
                time.sleep(0.05)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        before = len({r["key"] for r in _valid_lines(out / "records.jsonl")})
        while server.in_flight:  # the killed client's last requests are still being served (and counted)
            time.sleep(0.05)
        asked = len(server.requests)
        assert tokenswap_main(args) == 0
        asked_again = len(server.requests) - asked
    whole = {r["key"]: r for r in map(json.loads, (tmp_path / "whole" / "records.jsonl").read_text().splitlines())}
    resumed = {r["key"]: r for r in map(json.loads, (out / "records.jsonl").read_text().splitlines())}
    assert resumed == whole and 11 <= before < len(whole)
    # What was recorded before the kill is not asked again, the rest exactly once (requests in flight at the kill
    # had no record yet, so they are asked again).
    assert asked_again == len(whole) - before


@pytest.mark.integration
def test_two_evaluations_on_one_folder_do_not_both_ask(bench, tmp_path, capsys):
    root, views = bench
    out = tmp_path / "out"
    with LoadLLMServer(reply=lambda payload: "A", latency=0.5) as server:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        args = _eval(server, root, out)
        proc = subprocess.Popen([sys.executable, "-m", "tokenswap.cli", *args], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while not server.requests and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tokenswap_main(args) == 1  # refused at once, while the first is asking (busy, as a build or a run)
        err = capsys.readouterr().err
        assert "is being evaluated by another process (pid" in err and "another --out" in err
        assert proc.wait(timeout=120) == 0
        assert len(server.requests) == 2 * len(views)  # every item asked once, by the first


# ----------------------------------------------------------------------------- resume edges and inputs (issue 32)


@pytest.mark.integration
def test_a_resume_that_would_send_other_pictures_is_refused(bench, tmp_path, capsys):
    root, views = bench
    out = tmp_path / "out"
    with LoadLLMServer(reply=lambda payload: "A") as server:
        assert tokenswap_main(_eval(server, root, out, "--limit", "2")) == 0
        for extra, detail in ((["--image-format", "jpeg"], "image_format: 'png' before, 'jpeg' now"),
                              (["--max-pixels", "900"], "max_pixels: None before, 900 now")):
            capsys.readouterr()
            assert tokenswap_main(_eval(server, root, out, "--limit", "2", *extra)) == 2
            assert detail in capsys.readouterr().err
        # A run.json written before these were recorded resumes (it did not say what it sent) and records them.
        old = json.loads((out / "run.json").read_text())
        (out / "run.json").write_text(json.dumps({k: v for k, v in old.items() if k not in ("image_format",
                                                                                           "max_pixels")}))
        asked = len(server.requests)
        assert tokenswap_main(_eval(server, root, out, "--limit", "3")) == 0
        assert len(server.requests) - asked == 2 and json.loads((out / "run.json").read_text()) == old
        assert tokenswap_main(_eval(server, root, out, "--limit", "3", "--image-format", "jpeg")) == 2


@pytest.mark.integration
@pytest.mark.parametrize("content, message", [
    ('{"model": "rule-vlm", "back', "is not valid JSON"),
    ("[1, 2]", "hold a JSON list, not an object"),
    ("", "is empty"),
])
def test_a_damaged_run_json_is_one_line_naming_the_file_and_the_fix(bench, tmp_path, capsys, content, message):
    root, _ = bench
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.json").write_text(content)
    with LoadLLMServer(reply=lambda payload: "A") as server:
        assert tokenswap_main(_eval(server, root, out)) == 2
        assert not server.requests
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and message in errors[0] and str(out / "run.json") in errors[0]
    assert "delete it and rerun with the flags of the run that wrote" in errors[0] and "Traceback" not in errors[0]


@pytest.mark.integration
def test_an_unreachable_hub_bench_is_one_line_and_leaves_no_run_json(bench, tmp_path, capsys):
    root, views = bench
    out = tmp_path / "out"
    with LoadLLMServer(reply=lambda payload: "A") as server:
        args = _eval(server, root, out)
        args[args.index(str(root))] = "dongx1997/TokenSwap-Bench"  # offline here: the hub cannot be reached
        assert tokenswap_main(args) == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
        assert len(errors) == 1 and "--bench 'dongx1997/TokenSwap-Bench' does not exist locally (no such folder), " \
            "and the hub cannot be reached" in errors[0]
        # the fix for a hub id names a command that exists (huggingface_hub 2.x installs `hf`, not `huggingface-cli`)
        assert "`hf download dongx1997/TokenSwap-Bench --repo-type dataset --local-dir DIR`" in errors[0]
        # a mistyped local path is shaped like a hub id: the line says what a bench folder holds, too
        assert "a bench folder holds text/ and img/ parquet splits" in errors[0]
        assert not (out / "run.json").exists() and not server.requests
        assert tokenswap_main(_eval(server, root, out)) == 0  # the corrected command is not refused
        assert len(server.requests) == 2 * len(views)


@pytest.mark.integration
def test_the_family_comes_from_any_path_component_or_a_checkpoint_there_and_is_said_when_not(bench, tmp_path,
                                                                                               capsys):
    root, _ = bench
    checkpoint = tmp_path / "ckpt" / "checkpoint-500"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    with LoadLLMServer(reply=lambda payload: "A") as server:
        for k, (name, tokens, source) in enumerate((("/srv/models/qwen25vl-7b/", 128, "served name"),
                                                    (str(checkpoint), 128, "served path"), ("rule-vlm", 2048, None))):
            server.requests.clear()
            capsys.readouterr()
            out = tmp_path / f"out-{k}"
            args = _eval(server, root, out, "--limit", "1")
            args[args.index("rule-vlm")] = name
            assert tokenswap_main(args) == 0
            assert {p["max_tokens"] for p in server.requests} == {tokens}  # Qwen2.5-VL's release budget: 128
            summary = json.loads((out / "gap.json").read_text())
            assert summary["family_source"] == source
            err = capsys.readouterr().err
            noted = "note: no model family recognised in the served name 'rule-vlm'" in err and "--family" in err
            assert noted == (source is None)
            assert (summary["model_settings"]["family"] is None) == (source is None)


@pytest.mark.integration
def test_a_caption_recorded_anew_asks_again_the_items_that_used_the_old_one(bench, tmp_path):
    root, views = bench
    model = RuleModel()
    model.items = {v["marker"]: v for v in views}
    out = tmp_path / "out"
    with LoadLLMServer(reply=model.reply) as server:
        assert tokenswap_main(_eval(server, root, out, "--forms", "caption")) == 0
        records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
        (dog,) = [r for r in records if r["form"] == "captioning" and r["response"] == "A photo of a dog."]
        with open(out / "records.jsonl", "a") as f:  # the dog's caption as another (later) answer recorded it
            f.write(json.dumps({**dog, "response": "A photo of a dog on grass."}) + "\n")
        server.requests.clear()
        assert tokenswap_main(_eval(server, root, out, "--forms", "caption")) == 0
        asked = sorted(re.search(r"\[(q\d+)\]", json.dumps(p)).group(1) for p in server.requests)
    assert asked == ["q2", "q6"]  # the two items showing the dog, in their caption form, and nothing else
    summary = json.loads((out / "gap.json").read_text())
    assert {p["concept"]: p["caption"] for p in summary["pictures"]}["dog"] == "A photo of a dog on grass"


# ----------------------------------------------------------------------------- one planner for both evaluators (issue 37)
# `tokenswap eval --backend hf --forms all` and the in-loop GapEvaluator ask the same units, skip the same items with
# the same reasons and give the same decomposition, on a bench with items whose tags lack concept names and pictures
# that several items show. The model is the tiny one fine-tuned to answer "B" (conftest's always_b), so both paths'
# answers are deterministic and differ item by item only through each item's answer letter.

BROKEN = {1, 3}  # q1 (a car) and q3 (an apple and a house): their img rows say something else
IN_LOOP = ("both", "rendered", "recognition")  # every form but caption (it needs a generation pass first)


def _reasons_of(record: dict) -> dict:
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
        assert _reasons_of(got) == _reasons_of(want)
        assert bool(_reasons_of(got)) == (got["id"] in broken)
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
    # The same decomposition (each component on the items scored in its forms), but for the caption form's parts.
    d = dict(cli["decomposition"])
    assert d.pop("caption_recovery") is not None and d["acc"].pop("caption") is not None
    d["forms"].remove("caption")
    want = dict(loop.decomposition)
    assert want.pop("caption_recovery") is None
    assert d == want and d["n"] == len(pairs) and d["split"]["n"] == d["load"]["n"] == len(pairs) - 2
    metrics = loop.metrics()
    assert metrics["gap/n"] == len(pairs) and metrics["gap/n_both"] == len(pairs) - 2


@pytest.mark.integration
def test_a_picture_cut_inside_stops_the_run_at_its_row_keeping_every_answer_and_the_rerun_finishes(bench, tmp_path,
                                                                                                   capsys):
    """A JPEG cut short opens (its header is whole): it is found when a request first needs its pixels, and the run
    stops taking units there; what was in flight is answered and recorded, and the fixed bench resumes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root, views = bench
    (path,) = (root / "img").glob("*.parquet")
    table = pq.read_table(path)
    column = table.column("image_1").to_pylist()
    good = column[2]
    buf = io.BytesIO()  # a detailed picture: the cut falls in its scan data, after a whole header
    Image.frombytes("RGB", (96, 96), bytes(i * 7919 % 251 for i in range(96 * 96 * 3))).save(buf, format="JPEG",
                                                                                          quality=95)
    column[2] = {"bytes": buf.getvalue()[: len(buf.getvalue()) * 3 // 5], "path": None}
    index = table.schema.get_field_index("image_1")
    field = table.schema.field(index)

    def write(values):
        pq.write_table(table.set_column(index, field, pa.array(values, type=field.type)), path)

    write(column)
    out = tmp_path / "out"
    model = RuleModel()
    model.items = {v["marker"]: v for v in views}
    with LoadLLMServer(reply=model.reply) as server:
        assert tokenswap_main(_eval(server, root, out, "--forms", "text,interleaved")) == 2
        first = len(server.requests)
        errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
        assert len(errors) == 1 and "row 2: the picture in column image_1 does not decode" in errors[0], errors
        assert "replace it or drop that row" in errors[0]
        kept = {r["key"] for r in _valid_lines(out / "records.jsonl")}
        # Every request made was recorded (the ones in flight when the picture was found included), none of row 2's
        # interleaved item, and rows before it all answered.
        assert len(kept) == first and "interleaved|test/2" not in kept
        assert {"text|test/0", "interleaved|test/0", "text|test/1", "interleaved|test/1"} <= kept
        write([*column[:2], good, *column[3:]])
        assert tokenswap_main(_eval(server, root, out, "--forms", "text,interleaved")) == 0
        assert len(server.requests) == 2 * len(views)  # the rerun asked only what had no answer
    keys = [r["key"] for r in _valid_lines(out / "records.jsonl")]
    assert sorted(keys) == sorted(f"{f}|{v['id']}" for v in views for f in ("text", "interleaved"))
