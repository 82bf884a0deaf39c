"""Section ``bad_replies`` of benchmarks/faults.py: bodies of 100,000-deep nesting, a 4,400-digit integer, lone
surrogates, logprobs of +1000 or NaN: retried by the client then failed requests (never a crash), in ``tokenswap
eval`` (generate and loglik: nothing non-finite written, the rerun fills in) and ``build-store``; each kind of
poisoned response-cache entry skipped with one warning naming the file and asked again; lines no run writes in
``records.jsonl`` skipped on resume.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import ScriptedLLMServer, llm_answer, llm_reply

from ._common import (
    Tally,
    _build_reference,
    _eval_answer,
    _eval_cmd,
    _eval_reference,
    _eval_rerun_trials,
    _fault_bench,
    _store_rerun_trials,
    run,
)

OUTCOME = (
    "100,000-deep nesting, 4,400-digit integers, lone surrogates, +1000/NaN logprobs: failed requests, "
    "nothing non-finite written, the rerun fills in; poisoned cache/record lines skipped (one warning) and asked again"
)


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

    from tests.support import LoadLLMServer
    from tokenswap.inference import LLMRequestError, OpenAIChatModel, ResponseCache, cache_key

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
