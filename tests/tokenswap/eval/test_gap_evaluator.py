"""GapEvaluator on the tiny Qwen2-VL: scorer agreement, result shape, recognition control, 2-process equality."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from PIL import Image

from tokenswap.eval.gap import GapEvaluator, GapStats, summarize
from tokenswap.eval.mc import MCItem
from tokenswap.eval.recognition import recognition_items
from tokenswap.families import load_checkpoint
from tokenswap.inference.hf import letter_token_ids


@pytest.fixture(scope="module")
def b_model(always_b):
    return load_checkpoint(always_b)


def test_loglik_and_generate_agree_when_confident(b_model, make_pairs):
    model, processor = b_model
    pairs = make_pairs(8)
    model.train()
    loglik = GapEvaluator(processor, pairs, scorer="loglik", batch_size=3, progress=False).evaluate(model)
    assert model.training, "evaluate must restore train mode"
    gen = GapEvaluator(processor, pairs, scorer="generate", batch_size=3, max_new_tokens=4, progress=False)
    generated = gen.evaluate(model)
    for a, b in zip(loglik.items, generated.items):
        assert a["pred_text"] == a["pred_interleaved"] == "B"
        assert b["pred_text"] == b["pred_interleaved"] == "B", b
        assert b["response_text"].strip() == "B"
    expected = sum(t.answer == 1 for t, _ in pairs) / len(pairs)
    for r in (loglik, generated):
        assert r.acc_text == r.acc_interleaved == expected and r.gap == 0.0
        assert sorted(r.by_images) == [0, 1, 2] and sum(s.n for s in r.by_images.values()) == 8
    json.dumps(loglik.to_dict())
    md = loglik.to_markdown()
    assert "| all | 8 |" in md and "| 2 |" in md
    metrics = loglik.metrics()
    for key in ("gap/acc_text", "gap/acc_interleaved", "gap/abs", "gap/rel", "gap/images_1/abs"):
        assert key in metrics


def test_cached_inputs_are_reused(b_model, make_pairs):
    model, processor = b_model
    ev = GapEvaluator(processor, make_pairs(4), batch_size=4, progress=False)
    first = ev.evaluate(model)
    batches = ev._batches
    assert ev.evaluate(model).items == first.items and ev._batches is batches


def test_recognition_control_on_always_b(b_model, make_pairs):
    from dataclasses import replace

    model, processor = b_model
    pairs = make_pairs(8)
    # Two more questions showing the same pictures (as a bench asks several questions per concept).
    pairs += [(replace(t, id=t.id + "b"), replace(i, id=i.id + "b")) for t, i in pairs[4:6]]
    result = GapEvaluator(processor, pairs, forms=("recognition",), batch_size=4, progress=False).evaluate(model)
    rec = recognition_items([i for _, i in pairs])
    pictures = list(dict.fromkeys(r.id for _, _, r in rec))  # one per distinct (picture, concept)
    assert len(rec) == sum(i.num_images for _, i in pairs) > len(pictures)
    assert result.recognition_n == len(pictures) == len(result.recognition)
    assert [r["picture"] for r in result.recognition] == pictures
    # The model always says B: a picture is "identified" iff its target sits at position B.
    answer = {r.id: r.answer for _, _, r in rec}
    identified = [answer[p] == 1 for p in pictures]
    assert result.recognition_mc == sum(identified) / len(identified)
    assert [r["correct_mc"] for r in result.recognition] == identified
    # The controlled subset follows the naming form: items whose pictures were all named right.
    named = {r["picture"]: r["correct_naming"] for r in result.recognition}
    assert result.recognition_naming == sum(named.values()) / len(named)
    recognized = [all(named[r.id] for i, _, r in rec if i == j) for j in range(len(pairs))]
    assert [r["recognized_naming"] for r in result.items] == recognized
    # `recognized` follows the multiple-choice form (the recognition form every backend asks).
    assert [r["recognized"] for r in result.items] == [all(answer[r.id] == 1 for i, _, r in rec if i == j)
                                                       for j in range(len(pairs))]
    assert result.controlled.n == sum(recognized)
    metrics = result.metrics()
    for key in ("gap/recognition_mc", "gap/recognition_naming", "gap/controlled/abs"):
        assert key in metrics


def test_naming_recognition_scores_each_reply_like_a_plain_forward(b_model, make_pairs):
    """The batched, left-padded naming scores equal log p(reply | naming prompt) from one unpadded forward."""
    import torch

    from tokenswap.eval.gap import NAMING_ANSWER, NAMING_PROMPT

    model, processor = b_model
    pairs = make_pairs(5)
    result = GapEvaluator(processor, pairs, forms=("recognition",), batch_size=3, progress=False).evaluate(model)
    rec = recognition_items([i for _, i in pairs])
    tok = processor.tokenizer
    item_of = {r.id: r for _, _, r in rec}
    for record in result.recognition:
        item = item_of[record["picture"]]
        image = Image.open(__import__("io").BytesIO(item.images[1])) if isinstance(item.images[1], bytes) else item.images[1]
        text = NAMING_PROMPT.split("<image 1>")[1]
        conv = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": text}]}]
        prompt = processor.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        expected = []
        for name in item.choices:
            full = prompt + NAMING_ANSWER.format(concept=name)
            n = len(tok(full)["input_ids"]) - len(tok(prompt)["input_ids"])
            batch = processor(text=[full], images=[image.convert("RGB")], return_tensors="pt")
            with torch.no_grad():
                logits = model(**batch).logits[0, :-1].float().log_softmax(-1)
            ids = batch["input_ids"][0, 1:]
            expected.append(float(logits[-n:].gather(-1, ids[-n:, None]).sum()))
        assert record["loglik_naming"] == pytest.approx(expected, abs=2e-4)
        assert record["pred_naming"] == item.choices[max(range(4), key=expected.__getitem__)]
        assert record["correct_naming"] == (record["pred_naming"] == item.choices[item.answer])


def test_naming_recognition_finds_the_name_a_model_was_taught(tiny_qwen2vl, make_pairs):
    """Teach the tiny model to reply "A cat." to the naming prompt for one picture: naming recognition finds it."""
    import torch

    from tokenswap.eval.gap import NAMING_ANSWER, NAMING_PROMPT

    model, processor = load_checkpoint(tiny_qwen2vl)
    pairs = make_pairs(6)
    rec = recognition_items([i for _, i in pairs])
    ev = GapEvaluator(processor, pairs, forms=("recognition",), batch_size=8, progress=False)
    # Train on the evaluator's own candidate rows: the right name of every picture, via its labels.
    units = [u for u in ev.units if u.naming and u.candidate == u.item.answer]
    from tokenswap.eval.gap import naming_inputs

    batch, reply_len = naming_inputs(processor, [(u.item.images[1], u.item.choices[u.candidate]) for u in units])
    labels = torch.full_like(batch["input_ids"], -100)
    for row, n in enumerate(reply_len):
        labels[row, -n:] = batch["input_ids"][row, -n:]
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(60):
        loss = model(**batch, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    result = ev.evaluate(model)
    assert NAMING_PROMPT and NAMING_ANSWER
    assert result.recognition_n == len({r.id for _, _, r in rec})
    assert result.recognition_naming == 1.0, result.recognition


def test_recognition_items_are_deterministic_with_distinct_choices(make_pairs):
    pairs = make_pairs(9)
    inter = [i for _, i in pairs]
    a, b = recognition_items(inter, seed=3), recognition_items(inter, seed=3)
    assert [(i, t, r.choices, r.answer) for i, t, r in a] == [(i, t, r.choices, r.answer) for i, t, r in b]
    for i, tag, r in a:
        assert len(set(r.choices)) == 4
        assert r.choices[r.answer] == inter[i].concepts[tag]
        assert r.question == "<image 1>\nWhich concept does this image show?" and r.images[1] is inter[i].images[tag]
    assert {r.answer for _, _, r in a} != {a[0][2].answer}  # positions vary
    with pytest.raises(ValueError, match="at least 4 distinct concepts"):
        img = Image.new("RGB", (4, 4))
        recognition_items([MCItem("x", "s", "<image 1>", list("abcd"), 0, {1: img}, {1: "cat"})])


def test_summarize_controlled_gap_on_constructed_records():
    items = [
        {"num_images": 1, "correct_text": True, "correct_interleaved": False},
        {"num_images": 2, "correct_text": True, "correct_interleaved": True},
        {"num_images": 2, "correct_text": True, "correct_interleaved": False},
        {"num_images": 1, "correct_text": False, "correct_interleaved": False},
    ]
    recognition = [
        {"item": 0, "correct": False},
        {"item": 1, "correct": True},
        {"item": 1, "correct": True},
        {"item": 2, "correct": True},
        {"item": 2, "correct": False},
        {"item": 3, "correct": True},
    ]
    r = summarize("loglik", "zero_shot", items, recognition)
    assert r.overall == GapStats(4, 0.75, 0.25, 0.5, 0.5 / 0.75)
    assert r.by_images[2] == GapStats(2, 1.0, 0.5, 0.5, 0.5)
    assert r.recognition_mc == 4 / 6
    assert r.controlled == GapStats(2, 0.5, 0.5, 0.0, 0.0)  # items 1 and 3


def test_argument_errors(tiny_processor, make_pairs):
    pairs = make_pairs(2)
    with pytest.raises(ValueError, match="cot.*generate"):
        GapEvaluator(tiny_processor, pairs, scorer="loglik", prompt="cot")
    with pytest.raises(ValueError, match="k_shot.*shots"):
        GapEvaluator(tiny_processor, pairs, prompt="k_shot")
    with pytest.raises(KeyError, match="high_school_biology"):
        GapEvaluator(tiny_processor, pairs, prompt="k_shot", shots={"other": make_pairs(5)}, k=5)
    text, inter = pairs[0]
    with pytest.raises(ValueError, match="paired with"):
        GapEvaluator(tiny_processor, [(text, pairs[1][1])])
    ids = letter_token_ids(tiny_processor.tokenizer)
    assert len(ids) == 4 and all(ids)


def test_k_shot_evaluates(b_model, make_pairs):
    model, processor = b_model
    shots = {"high_school_biology": make_pairs(2)}
    r = GapEvaluator(processor, make_pairs(3), prompt="k_shot", shots=shots, k=2, progress=False).evaluate(model)
    assert r.prompt == "k_shot" and r.overall.n == 3


_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {tests!r})
    from conftest import _make_pairs as make_pairs
    from accelerate import Accelerator
    from tokenswap.eval.gap import GapEvaluator
    from tokenswap.families import load_checkpoint

    state = Accelerator()  # reads ACCELERATE_USE_CPU; a bare PartialState() would not
    model, processor = load_checkpoint({model!r})
    out = {{}}
    for scorer in ("loglik", "generate"):
        ev = GapEvaluator(processor, make_pairs(7), scorer=scorer, batch_size=2, max_new_tokens=3,
                          forms=("recognition",), progress=False)
        out[scorer] = ev.evaluate(model).to_dict()
    out["world"] = state.num_processes
    if state.is_main_process:
        with open({dest!r}, "w") as f:
            json.dump(out, f)
    state.wait_for_everyone()
    # without it gloo's threads can abort a rank at exit ("terminate called without an active exception")
    from tokenswap.training import close_process_group, end_script

    close_process_group()
    end_script()
    """
)


@pytest.mark.integration
def test_two_process_cpu_equals_single_process(tiny_qwen2vl, tmp_path, make_pairs, free_port):
    model, processor = load_checkpoint(tiny_qwen2vl)
    single = {}
    for scorer in ("loglik", "generate"):
        ev = GapEvaluator(
            processor, make_pairs(7), scorer=scorer, batch_size=2, max_new_tokens=3, forms=("recognition",), progress=False
        )
        single[scorer] = ev.evaluate(model).to_dict()
    dest = tmp_path / "dist.json"
    script = tmp_path / "dist_eval.py"
    script.write_text(_SCRIPT.format(tests=str(Path(__file__).parent), model=str(tiny_qwen2vl), dest=str(dest)))
    accelerate = Path(sys.executable).parent / "accelerate"
    # A free rendezvous port: another 2-rank launch on accelerate's default 29500 aborts gloo ("terminate called").
    cmd = [str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--main_process_port", str(free_port)]
    cmd += ["--mixed_precision", "no", "--dynamo_backend", "no", str(script)]
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dist = json.loads(dest.read_text())
    assert dist.pop("world") == 2
    single = json.loads(json.dumps(single))
    for scorer in ("loglik", "generate"):
        # Naming log-likelihoods are sums of floats over differently padded batches: equal to rounding.
        for a, b in [*zip(dist[scorer]["recognition"], single[scorer]["recognition"]),
                     *zip(dist[scorer]["pictures"], single[scorer]["pictures"])]:
            assert a.pop("loglik_naming") == pytest.approx(b.pop("loglik_naming"), abs=1e-4)
    assert dist == single


def test_loglik_scores_qwen3_5_where_training_puts_the_answer(tiny_family, make_pairs):
    """Qwen3.5's generation prompt opens a think block (``<think>\\n``); training writes an answer without reasoning
    after ``<think>\\n\\n</think>\\n\\n``. The in-loop scorer and the hf backend read the letters there."""
    import torch

    from tokenswap.eval.mc import build_conversation
    from tokenswap.families import family_of, render_conversation
    from tokenswap.inference.backends import HFBackend

    model, processor = load_checkpoint(tiny_family("qwen3_5"))
    family = family_of("qwen3_5")
    pairs = make_pairs(3)
    evaluator = GapEvaluator(processor, pairs, scorer="loglik", batch_size=1, progress=False)
    result = evaluator.evaluate(model)
    letter_ids = letter_token_ids(processor.tokenizer)
    built = {idx[0]: batch for idx, batch in evaluator._batches}
    for i, ((text, inter), record) in enumerate(zip(pairs, result.items)):
        for u, (item, pred) in enumerate(((text, record["pred_text"]), (inter, record["pred_interleaved"]))):
            conv = build_conversation(item)
            assert processor.apply_chat_template(conv, tokenize=False, add_generation_prompt=True).endswith(
                "<|im_start|>assistant\n<think>\n")
            # Where training puts the answer: the text before "B" in a rendered (user, assistant "B") turn.
            rendered, learn = render_conversation(family, [*conv, {"role": "assistant", "content": "B"}],
                                                  family.default_system_prompt)
            prefix = rendered[: learn[0][1] - len("B<|im_end|>")]
            assert prefix.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
            images = [p["image"] for p in conv[0]["content"] if p["type"] == "image"]
            expected = processor(text=[prefix], images=images or None, return_tensors="pt")
            assert torch.equal(built[2 * i + u]["input_ids"], expected["input_ids"])
            with torch.no_grad():
                logprobs = model(**expected).logits[0, -1].float().log_softmax(-1)
            letters = torch.stack([torch.logsumexp(logprobs[ids], 0) for ids in letter_ids])
            assert pred == "ABCD"[int(letters.argmax())]
            backend = HFBackend(model, processor, "tiny-qwen3.5", letter_ids=letter_ids)
            (scored,) = backend.score_letters([conv])
            assert scored.letter_probs == pytest.approx(letters.exp().tolist(), rel=1e-4, abs=1e-6)


def test_in_loop_items_without_concept_names_keep_the_gap_and_an_empty_form_is_logged(b_model, make_pairs, capsys):
    """The in-loop evaluator follows `tokenswap eval`'s plan: an item without concept names is scored in text and
    interleaved and skipped in both; a form left with no item is logged with n 0, never raised (training goes on)."""
    from dataclasses import replace

    model, processor = b_model
    pairs = make_pairs(6)
    nameless = [(t, replace(i, concepts={})) for t, i in pairs]  # no item's rows aligned: no concept names at all
    result = GapEvaluator(processor, nameless, forms=("both",), batch_size=4, progress=False).evaluate(model)
    with_pictures = sum(i.num_images > 0 for _, i in pairs)
    assert result.overall.n == len(pairs) and result.excluded == []
    assert result.form_counts["both"] == {"n": len(pairs) - with_pictures, "failed": 0, "skipped": with_pictures}
    skipped = [r for r in result.items if r["correct_both"] is None]
    assert len(skipped) == with_pictures and all("no concept name" in r["skipped_both"] for r in skipped)
    metrics = result.metrics()
    assert metrics["gap/n"] == len(pairs) and metrics["gap/n_both"] == len(pairs) - with_pictures
    # Only items with pictures, none with concept names: both has no item at all, said on stderr, not raised.
    capsys.readouterr()
    pictured = [(t, replace(i, concepts={})) for t, i in pairs if i.num_images]
    result = GapEvaluator(processor, pictured, forms=("both",), batch_size=4, progress=False).evaluate(model)
    assert result.form_counts["both"]["n"] == 0 and result.overall.n == len(pictured)
    assert [m["form"] for m in result.decomposition["missing"]] == ["both"] and result.decomposition["load"] is None
    assert "gap eval: the both form rests on 0 items: 0 items failed and 4 were skipped in it" in capsys.readouterr().err
    assert result.metrics()["gap/n_both"] == 0.0 and "gap/acc_both" not in result.metrics()
