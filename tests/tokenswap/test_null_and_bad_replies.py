"""Replies that are no answer: a null (or missing) content, a body Python's JSON parser cannot take (100,000-deep
nesting, a 4,300-digit integer), logprobs of +1000 or NaN, lone surrogates, poisoned cache and record lines.

Each is a failed request at the one place replies are parsed (the client): retried, never cached, never
committed as done, never scored, asked again by the rerun; through the client itself, ``build-store`` (extract
and judge), the bench builder and the three evaluators.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from pathlib import Path

import pytest
from PIL import Image

from tests.support import LoadLLMServer, ScriptedLLMServer, concept_reply, llm_answer, llm_reply
from tokenswap.cli import main as tokenswap_main
from tokenswap.inference import LLMRequestError, OpenAIChatModel, ResponseCache, cache_key
from tokenswap.inference.runs import RecordLog

MSG = [{"role": "user", "content": "hi"}]
DEEP = b"[" * 100_000 + b"]" * 100_000
HUGE = "9" * 4400


def body(content="fine", top=None, usage=None) -> bytes:
    choice = {"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
    if top is not None:
        choice["logprobs"] = {"content": [{"token": "A", "logprob": -0.1, "top_logprobs": top}]}
    data = {"choices": [choice]}
    if usage is not None:
        data["usage"] = usage
    return json.dumps(data).encode()


BAD_BODIES = {
    "100,000-deep nesting": DEEP,
    "deep nesting inside the message": b'{"choices": [{"message": {"content": ' + DEEP + b"}}]}",
    "a 4,400-digit integer": b'{"choices": [{"message": {"content": "A"}}], "usage": {"prompt_tokens": '
                             + HUGE.encode() + b"}}",
    "lone surrogates in the content": b'{"choices": [{"message": {"content": "\\ud800 A"}}]}',
    "a list as content": body(content=["A"]),
}


@pytest.mark.integration
@pytest.mark.parametrize("what", list(BAD_BODIES))
def test_a_body_python_cannot_take_is_a_retried_failed_request(what):
    with ScriptedLLMServer() as server:
        model = OpenAIChatModel(server.base_url, "m", max_retries=1, max_backoff=0.05)
        server.script = [llm_reply(BAD_BODIES[what]), llm_reply(llm_answer("second try"))]
        t0 = time.monotonic()
        assert model.chat(MSG) == "second try" and model.num_requests == 2
        server.script = [llm_reply(BAD_BODIES[what])] * 2
        with pytest.raises(LLMRequestError, match="failed after 2 attempts") as err:
            model.chat([{"role": "user", "content": "again"}])
        assert time.monotonic() - t0 < 20
        assert server.base_url in str(err.value) and len(str(err.value)) < 2000


BAD_LOGPROBS = {
    "+1000": [{"token": "A", "logprob": 1000.0}],
    "NaN": b'[{"token": "A", "logprob": NaN}]',
    "Infinity": b'[{"token": "A", "logprob": -Infinity}]',
    "a string": [{"token": "A", "logprob": "-0.1"}],
    "no token": [{"logprob": -0.1}],
    "200 alternatives": [{"token": f"t{i}", "logprob": -1.0} for i in range(200)],
}


def logprob_body(top) -> bytes:
    if isinstance(top, bytes):
        return body(top=[]).replace(b'"top_logprobs": []', b'"top_logprobs": ' + top)
    return body(content="A", top=top)


@pytest.mark.integration
@pytest.mark.parametrize("what", list(BAD_LOGPROBS))
def test_logprobs_that_are_no_log_probabilities_are_an_invalid_reply(what):
    good = body(content="A", top=[{"token": "A", "logprob": -0.25}, {"token": " B", "logprob": -1.5}])
    with ScriptedLLMServer() as server:
        model = OpenAIChatModel(server.base_url, "m", max_retries=1, max_backoff=0.05)
        server.script = [llm_reply(logprob_body(BAD_LOGPROBS[what])), llm_reply(good)]
        reply = model.request(MSG, top_logprobs=5)
        assert reply.top_logprobs == [("A", -0.25), (" B", -1.5)] and model.num_requests == 2
        server.script = [llm_reply(logprob_body(BAD_LOGPROBS[what]))] * 2
        with pytest.raises(LLMRequestError, match="no log-probabilities"):
            model.request([{"role": "user", "content": "again"}], top_logprobs=5)
        # Not asked for: whatever the server adds is ignored, the answer stands.
        server.script = [llm_reply(logprob_body(BAD_LOGPROBS[what]))]
        assert model.request([{"role": "user", "content": "plain"}]).top_logprobs is None


@pytest.mark.integration
def test_absurd_usage_counts_are_left_out_not_summed():
    with ScriptedLLMServer() as server:
        model = OpenAIChatModel(server.base_url, "m", max_retries=0)
        server.script = [llm_reply(body(usage={"prompt_tokens": 10**30, "completion_tokens": -5, "total_tokens": 7}))]
        assert model.request(MSG).usage == {"total_tokens": 7}
        assert model.stats.prompt_tokens == 0


def test_a_reply_of_100000_braces_is_no_json_object_and_fails_fast():
    from tokenswap.inference.parsing import parse_json_response

    for text in ("{" * 100_000, '{"a": ' * 100_000 + "1" + "}" * 100_000, '{"n": ' + HUGE + "}"):
        t0 = time.monotonic()
        with pytest.raises(ValueError, match="no JSON object"):
            parse_json_response(text)
        assert time.monotonic() - t0 < 5


# ---------------------------------------------------------------------------- poisoned cache and record lines
def poisoned_cache(path: Path, questions: list[str]) -> None:
    """One good entry for questions[0]; every other question gets a line that is no answer."""
    keys = [cache_key("m", [{"role": "user", "content": q}], temperature=0.0, max_tokens=512) for q in questions]
    good = ResponseCache(path)
    good.put(keys[0], "cached answer")
    good.close()
    entry = json.loads(path.read_text())
    lines = [
        json.dumps([keys[1], "a list, not an entry"]),
        json.dumps({"key": keys[2], "response": None, "check": "x"}),
        json.dumps({"key": keys[3], "response": 42}),
        json.dumps({**entry, "key": keys[4]}),  # the good entry's content under another question's key
        json.dumps({**entry, "key": keys[5], "response": "edited answer"}),
        '{"key": "' + keys[6] + '", "response": "A", "top_logprobs": [["A", NaN]], "check": "0"}',
        '{"key": "' + keys[7] + '", "response": "A", "n": ' + HUGE + "}",
        '{"key": "' + keys[8] + '", "response": ' + "[" * 100_000 + "]" * 100_000 + "}",
        json.dumps({"key": keys[9], "response": "A", "top_logprobs": [["t", -1.0]] * 1000}),
        json.dumps({"key": keys[10], "response": "A", "reasoning": 7}),
    ]
    with open(path, "a") as f:
        f.write("\n".join(lines) + "\n")


@pytest.mark.integration
def test_poisoned_cache_entries_are_skipped_with_one_warning_and_asked_again(tmp_path):
    questions = [f"q{i}" for i in range(11)]
    path = tmp_path / "cache.jsonl"
    poisoned_cache(path, questions)
    with LoadLLMServer(lambda payload: "fresh answer") as server:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = OpenAIChatModel(server.base_url, "m", cache_path=path, max_retries=0)
        said = [str(w.message) for w in caught]
        assert len(said) == 1 and str(path) in said[0] and "10 line(s) skipped" in said[0]
        answers = [model.chat([{"role": "user", "content": q}]) for q in questions]
        assert answers == ["cached answer"] + ["fresh answer"] * 10
        assert len(server.requests) == 10  # every poisoned question asked again, the good one not
        model.close()
    with pytest.warns(UserWarning, match="10 line"):
        again = ResponseCache(path)  # what was asked is now cached for good, the poison stays skipped
    assert len(again) == 11


def test_the_record_log_survives_lines_no_run_writes(tmp_path):
    path = tmp_path / "records.jsonl"
    lines = ['{"key": "good", "response": "A"}', "[" * 100_000 + "]" * 100_000, '{"key": "huge", "n": ' + HUGE + "}",
             '{"key": ["a", "list"], "response": "A"}', '"just a string"', '{"key": {"a": 1}}', "not json"]
    path.write_text("\n".join(lines) + "\n")
    log = RecordLog(path)
    assert list(log.records) == ["good"] and log.answered("good") and not log.answered("huge")
    log.append({"key": "new", "response": "B"})
    assert set(RecordLog(path).records) == {"good", "new"}


# ---------------------------------------------------------------------------- build-store (extract and judge)
def build_args(out: Path, base_url: str, *extra: str) -> list[str]:
    return ["build-store", "--config", "store_generate.yaml", f"output_dir={out}", "data.path=fixture",
            "data.max_samples=24", "sources=[rendered_text]", "extractor.kind=llm", "extractor.llm.model=m",
            f"extractor.llm.base_url={base_url}", "judge.llm.model=v", f"judge.llm.base_url={base_url}",
            "extractor.llm.max_retries=1", "judge.llm.max_retries=1", "extractor.llm.concurrency=4",
            "judge.llm.concurrency=4", "samples_per_shard=4", "concept_batch_size=4", "progress=false", *extra]


def build_files(out: Path) -> dict:
    """What a build holds: candidate chunks, store shards, rejected lists, dataset shards and the plan byte for byte
    (a judge batch the rerun commits keeps the shard name it has in an uninterrupted build), and the store row by row.
    """
    from tokenswap.store.image_store import ImageStore

    files = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
             if p.is_file() and p.relative_to(out).as_posix().startswith(
                 ("dataset/", "store/", "state/candidates/part-", "state/images/rejected-"))}
    files["state/plan.json"] = (out / "state" / "plan.json").read_bytes()
    store = ImageStore(out / "store")
    files["store rows"] = sorted((k, im.image_id, im.source, json.dumps(im.meta, sort_keys=True))
                                 for k in store.keys() for im in store.get(k))
    return files


@pytest.fixture(scope="module")
def reference_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "build"
    with LoadLLMServer(concept_reply) as server:
        assert tokenswap_main(build_args(out, server.base_url)) == 0
    return out


@pytest.mark.integration
@pytest.mark.parametrize("stage", ["extract", "judge"])
@pytest.mark.parametrize("answer", ["null", "deep nesting"])
def test_build_store_commits_no_null_or_unparsable_reply_and_the_rerun_asks_again(stage, answer, reference_build,
                                                                                   tmp_path, capsys):
    def hit(payload) -> bool:
        system = payload["messages"][0]["role"] == "system"
        return (system if stage == "extract" else not system) and "garden" in json.dumps(payload).lower()

    def respond(payload, headers):
        if not (broken["on"] and hit(payload)):
            return None
        return 200, (body(content=None) if answer == "null" else DEEP)

    broken = {"on": True}
    out = tmp_path / "build"
    with LoadLLMServer(concept_reply, respond=respond) as server:
        assert tokenswap_main(build_args(out, server.base_url)) == 1
        err = capsys.readouterr().err
        assert "failed for good" in err and "null message content" in err if answer == "null" else "nested" in err
        report = json.loads((out / "report.json").read_text())
        assert report["complete"] is False and report["failed_requests"] > 0
        if stage == "extract":
            (marker,) = report["ranks"]["extract"]
            assert marker["llm_extraction"]["failed_texts"] == 0  # not taken for "no concepts"
        failed_asked = [p for p in server.requests if hit(p)]
        assert failed_asked
        broken["on"] = False  # the server recovers
        before = len(server.requests)
        capsys.readouterr()
        assert tokenswap_main(build_args(out, server.base_url)) == 0
        assert f"build-store: resuming {out}: " in capsys.readouterr().err  # says it is no fresh build
        asked_again = server.requests[before:]
        assert any(hit(p) for p in asked_again)
    report = json.loads((out / "report.json").read_text())
    assert report["complete"] is True
    assert build_files(out) == build_files(reference_build)  # as if nothing had happened
    # The resumed build's extraction counts are the whole build's, not those of its last run's few chunks.
    reference = json.loads((reference_build / "report.json").read_text())
    assert report["ranks"]["extract"][0]["llm_extraction"] == reference["ranks"]["extract"][0]["llm_extraction"]


# ---------------------------------------------------------------------------- tokenswap eval
def eval_args(server, bench: Path, out: Path, *extra: str) -> list[str]:
    return ["eval", "--backend", "openai", "--base-url", server.base_url, "--model", "some-vlm", "--bench",
            str(bench), "--out", str(out), "--max-retries", "1", "--max-error-share", "1", "--concurrency", "4", *extra]


def _answer(payload) -> str:
    return "The answer is B." if "banana" in json.dumps(payload) else "The answer is A."


@pytest.fixture(scope="module")
def reference_eval(tiny_bench, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference-eval") / "eval"
    with LoadLLMServer(_answer) as server:
        assert tokenswap_main(eval_args(server, tiny_bench, out)) == 0
    return json.loads((out / "gap.json").read_text())


@pytest.mark.integration
@pytest.mark.parametrize("answer", ["null", "missing content", "deep nesting", "huge integer"])
def test_eval_scores_no_null_or_unparsable_reply_and_the_rerun_asks_only_those(answer, tiny_bench, reference_eval,
                                                                                tmp_path):
    bad = {"null": body(content=None), "missing content": b'{"choices": [{"message": {"role": "assistant"}}]}',
           "deep nesting": DEEP, "huge integer": BAD_BODIES["a 4,400-digit integer"]}[answer]
    broken = {"on": True}

    def hit(payload) -> bool:
        return "circle" in json.dumps(payload)

    def respond(payload, headers):
        return (200, bad) if broken["on"] and hit(payload) else None

    out = tmp_path / "eval"
    with LoadLLMServer(_answer, respond=respond) as server:
        assert tokenswap_main(eval_args(server, tiny_bench, out)) == 0
        records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
        failed = [r for r in records if "error" in r]
        assert failed and all(r["response"] is None and r["pred"] is None for r in failed)  # never the answer ""
        gap = json.loads((out / "gap.json").read_text())
        assert gap["n_failed"] == len(failed) and [e["id"] for e in gap["excluded"]] == [failed[0]["id"]]
        assert failed[0]["id"] not in {i["id"] for i in gap["items"]}  # not scored wrong: not scored
        broken["on"] = False
        before = len(server.requests)
        assert tokenswap_main(eval_args(server, tiny_bench, out)) == 0
        assert len(server.requests) - before == len(failed) and all(hit(p) for p in server.requests[before:])
    gap = json.loads((out / "gap.json").read_text())
    assert gap["n_failed"] == 0 and gap["items"] == reference_eval["items"]
    assert gap["acc_text"] == reference_eval["acc_text"] and gap["gap"] == reference_eval["gap"]


@pytest.mark.integration
@pytest.mark.parametrize("what", ["+1000", "NaN"])
def test_eval_loglik_writes_no_overflowing_or_nan_logprob(what, tiny_bench, tmp_path):
    good = [{"token": "A", "logprob": -0.2}, {"token": "B", "logprob": -2.0}]
    broken = {"on": True}

    def respond(payload, headers):
        if broken["on"] and "circle" in json.dumps(payload):
            return 200, logprob_body(BAD_LOGPROBS[what])
        return 200, body(content="A", top=good)

    out = tmp_path / "eval"
    with LoadLLMServer(respond=respond) as server:
        assert tokenswap_main(eval_args(server, tiny_bench, out, "--scorer", "loglik")) == 0
        text = (out / "records.jsonl").read_text() + (out / "gap.json").read_text()
        assert "NaN" not in text and "Infinity" not in text
        records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
        failed = [r for r in records if "error" in r]
        assert failed and all("no log-probabilities" in r["error"] and "letter_probs" not in r for r in failed)
        assert all(math.isfinite(p) for r in records for p in r.get("letter_probs", []))
        broken["on"] = False
        assert tokenswap_main(eval_args(server, tiny_bench, out, "--scorer", "loglik")) == 0
    assert json.loads((out / "gap.json").read_text())["n_failed"] == 0


@pytest.mark.integration
def test_crossmath_and_rest_eval_score_no_null_reply_and_ask_it_again(tmp_path):
    from tokenswap.crossmath.data import load_crossmath

    data = tmp_path / "cm"
    assert tokenswap_main(["crossmath", "generate", "--n", "3", "--out", str(data), "--styles", "original"]) == 0
    null_table = load_crossmath(data / "Original")[1]["markdown_table"]
    soe = tmp_path / "soe"
    assert tokenswap_main(["rest", "build", "--source", "soebench", "--n", "2", "--out", str(soe)]) == 0
    broken = {"on": True}

    def reply(payload):
        text = json.dumps(payload)
        if broken["on"] and (json.dumps(null_table)[1:-1] in text or "Transcribe" in text):
            return None
        return "<answer>1 2</answer> A"

    with LoadLLMServer(reply) as server:
        common = ["--backend", "openai", "--base-url", server.base_url, "--model", "m", "--max-retries", "0",
                  "--max-error-share", "1"]
        cm = ["crossmath", "eval", "--data", str(data / "Original"), "--modality", "text", "--out",
              str(tmp_path / "cm-out"), *common]
        rest = ["rest", "eval", "--data", str(soe), "--ocr", "--out", str(tmp_path / "rest-out"), *common]
        assert tokenswap_main(cm) == 0 and tokenswap_main(rest) == 0
        metrics = json.loads((tmp_path / "cm-out" / "metrics_text.json").read_text())
        assert (metrics["n"], metrics["n_failed"]) == (2, 1)  # the null one not scored (no "no answer")
        assert metrics["no_answer"] == 0
        rest_metrics = json.loads((tmp_path / "rest-out" / "metrics.json").read_text())
        assert rest_metrics["n_failed"] > 0 and rest_metrics["variants"]["sans_200"]["all"]["n"] == 0
        broken["on"] = False
        before = len(server.requests)
        assert tokenswap_main(cm) == 0
        assert len(server.requests) - before == 1  # only the null one asked again
        assert tokenswap_main(rest) == 0
    assert json.loads((tmp_path / "cm-out" / "metrics_text.json").read_text())["n"] == 3
    rest_metrics = json.loads((tmp_path / "rest-out" / "metrics.json").read_text())
    assert rest_metrics["n_failed"] == 0 and rest_metrics["variants"]["sans_200"]["all"]["n"] == 2


# ---------------------------------------------------------------------------- bench builder
COLORS = {"horse": "red", "moon": "white", "sun": "yellow"}
QUESTIONS = {"k0": "[k0] Does a horse run?", "k1": "[k1] Is the moon bright?", "k2": "[k2] Is the sun hot?"}


def _bench_answer(payload) -> str:
    text = json.dumps(payload)
    if payload["model"] == "judge":
        return json.dumps({"valid": "moon" not in text})
    return "The answer is B."


def _bench_builder(store, out: Path, base_url: str):
    from tokenswap.concepts import LexiconExtractor
    from tokenswap.eval.bench_builder import BenchBuilder

    def model(name: str) -> OpenAIChatModel:
        return OpenAIChatModel(base_url, name, max_retries=1, max_backoff=0.05, concurrency=2,
                               cache_path=out / "cache" / f"{name}.jsonl")

    return BenchBuilder(extractor=LexiconExtractor(store.keys()), store=store, judge=model("judge"),
                        proxy=model("proxy"), captioner=None, out_dir=out, filters=("validity",), concurrency=2)


def _bench_files(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != "requests.json" and "cache" not in p.relative_to(out).parts}


@pytest.mark.integration
def test_the_bench_builder_records_no_null_reply_and_the_rerun_equals_an_uninterrupted_run(tmp_path):
    from tokenswap.eval.bench_builder import BenchRequestsFailed
    from tokenswap.eval.mc import MCItem
    from tokenswap.store.image_store import ImageStore, StoreWriter

    with StoreWriter(tmp_path / "store") as w:
        for concept, color in COLORS.items():
            w.add(concept, Image.new("RGB", (32, 32), color), source="test")
    store = ImageStore(tmp_path / "store")
    items = [MCItem(k, "astronomy", q, ["w", "x", "y", "z"], 1) for k, q in QUESTIONS.items()]
    broken = {"on": True}

    def reply(payload):
        return None if broken["on"] and "sun" in json.dumps(payload) else _bench_answer(payload)

    with LoadLLMServer(reply) as server:
        ref = _bench_builder(store, tmp_path / "ref", server.base_url)
        broken["on"] = False
        assert ref.run(items)["kept"] == 2
        broken["on"] = True
        out = tmp_path / "bench"
        with pytest.raises(BenchRequestsFailed, match=r"1 item\(s\) had a request that failed for good"):
            _bench_builder(store, out, server.base_url).run(items)
        recorded = {json.loads(line)["id"] for line in (out / "results.jsonl").read_text().splitlines()}
        assert recorded == {"k0", "k1"}  # the null verdict's item is not recorded as done (nor as dropped)
        cached = [json.loads(line)["response"] for p in (out / "cache").glob("*.jsonl")
                  for line in p.read_text().splitlines()]
        assert cached and None not in cached and "" not in cached
        broken["on"] = False
        before = len(server.requests)
        assert _bench_builder(store, out, server.base_url).run(items)["kept"] == 2
        assert all("sun" in json.dumps(p) for p in server.requests[before:])
    assert _bench_files(out) == _bench_files(tmp_path / "ref")


def test_record_log_keeps_a_reply_with_unicode_line_separators_whole(tmp_path):
    # json.dumps(ensure_ascii=False) writes U+2028, U+2029 and U+0085 raw: splitlines() would cut the record in
    # two, both halves unreadable, and the answered unit would be asked again (or its answer lost) on resume.
    path = tmp_path / "records.jsonl"
    log = RecordLog(path)
    reply = "first\u2028second\u2029third\x85fourth\x1cfifth"
    log.append({"key": "q1", "response": reply})
    log.append({"key": "q2", "response": "plain"})
    again = RecordLog(path)
    assert again.answered("q1") and again.records["q1"]["response"] == reply
    assert set(again.records) == {"q1", "q2"}
