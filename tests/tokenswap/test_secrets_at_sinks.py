"""The API key reaches no sink: a loopback server whose error body quotes the ``Authorization`` header (raw,
JSON-escaped, URL-encoded, plus form, cut) or whose reply repeats the key, through ``tokenswap build-store`` and
``tokenswap eval --backend openai``; and ``user:password@`` refused in every base URL a config takes."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

import pytest

from tests.support import LoadLLMServer, concept_reply
from tokenswap.cli import main as tokenswap_main

ROOT = Path(__file__).resolve().parents[2]

KEY = 'sk-sink/Te+st"key\\0a1b2c3d4e5f6g7h8'  # JSON, percent and plus forms all differ from the raw one
KEY_ENV = "TOKENSWAP_SINK_TEST_KEY"


def leaked_forms() -> dict[str, str]:
    """What of the key must be in no file and no output: each encoded form, and cuts of 12 characters."""
    once = json.dumps(KEY)[1:-1]
    full = {"raw": KEY, "json": once, "percent": urllib.parse.quote(KEY, safe=""),
            "plus": urllib.parse.quote_plus(KEY)}
    cuts = {f"{name} prefix": f[:12] for name, f in full.items()} | {f"{name} suffix": f[-12:] for name, f in full.items()}
    return full | cuts


def assert_no_key(root: Path, *texts: str) -> None:
    leaks = []
    for path in sorted(root.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            leaks += [f"{path.relative_to(root)}: {n}" for n, f in leaked_forms().items() if f.encode() in data]
    for i, text in enumerate(texts):
        leaks += [f"output {i}: {n}" for n, f in leaked_forms().items() if f in text]
    assert not leaks, leaks


def echo(form: str, auth: str) -> bytes:
    """An error body quoting the Authorization header the way some servers and proxies do."""
    if form == "raw":
        return f"invalid header Authorization: {auth}".encode()
    if form == "json":
        return json.dumps({"error": {"message": f"bad Authorization {auth}", "type": "invalid_request_error"}}).encode()
    if form == "percent":
        return f"rejected /v1/chat/completions?authorization={urllib.parse.quote(auth, safe='')}".encode()
    if form == "plus":
        return f"rejected /v1/chat/completions?authorization={urllib.parse.quote_plus(auth)}".encode()
    if form == "cut":  # the client keeps the first 500 bytes of an error body: the key is cut there
        return ("x" * (500 - len("Bearer ") - 17) + auth).encode()
    # The build keeps the first 500 characters of the client's message, which opens with the URL: cut there.
    assert form == "cut by the build"
    return ("x" * 390 + auth + "x" * 100).encode()


FORMS = ["raw", "json", "percent", "plus", "cut", "cut by the build"]


def server_for(form: str, reply_text) -> LoadLLMServer:
    """Echoes the header in ``form`` (a 500, retried then failed) for every third request; ``reply`` otherwise."""
    counter = {"n": 0}

    def respond(payload, headers):
        counter["n"] += 1
        if form == "reply" or counter["n"] % 3:
            return None
        return 500, echo(form, headers["authorization"])

    return LoadLLMServer(reply_text, respond=respond)


def build_args(out: Path, base_url: str) -> list[str]:
    return ["build-store", "--config", "store_generate.yaml", f"output_dir={out}", "data.path=fixture",
            "data.max_samples=12", "sources=[rendered_text]", "extractor.kind=llm", "extractor.llm.model=m",
            f"extractor.llm.base_url={base_url}", f"extractor.llm.api_key_env={KEY_ENV}",
            "extractor.llm.max_retries=0", "extractor.llm.concurrency=4", "samples_per_shard=4", "progress=false"]


@pytest.mark.integration
@pytest.mark.parametrize("form", [*FORMS, "reply"])
def test_build_store_writes_the_key_nowhere(form, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(KEY_ENV, KEY)

    def reply(payload):  # the model repeats the key after its answer: the cache holds the reply
        return concept_reply(payload) + (f"\n(you sent {KEY})" if form == "reply" else "")

    out = tmp_path / "build"
    with server_for(form, reply) as server:
        rc = tokenswap_main(build_args(out, server.base_url))
        assert len(server.requests) > 0
    said = capsys.readouterr()
    report = json.loads((out / "report.json").read_text())
    if form == "reply":
        assert rc == 0 and report["complete"] is True
        cached = (out / "state" / "cache" / "extract-r000.jsonl").read_text()
        assert "(you sent [API key])" in cached  # the reply is kept, the key in it masked
    else:
        assert rc == 1 and report["complete"] is False and report["failed_requests"] > 0
        marker = json.loads((out / "state" / "candidates" / "failed-r000.json").read_text())
        assert all("HTTP 500" in f["error"] for f in marker["failed_rows"])
        if not form.startswith("cut"):  # (a cut key's mask may be cut off where the build stores 500 characters)
            assert "[API key]" in report["error"] and "[API key]" in said.err  # the message is kept, the key masked
    assert_no_key(out, said.out, said.err)


def eval_args(server, bench: Path, out: Path, *extra: str) -> list[str]:
    return ["eval", "--backend", "openai", "--base-url", server.base_url, "--model", "some-vlm", "--bench",
            str(bench), "--api-key-env", KEY_ENV, "--out", str(out), "--max-retries", "0", "--max-error-share", "1",
            "--concurrency", "4", *extra]


@pytest.mark.integration
@pytest.mark.parametrize("form", [*FORMS, "reply"])
def test_eval_writes_the_key_nowhere(form, tiny_bench, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(KEY_ENV, KEY)
    out = tmp_path / "eval"
    with server_for(form, lambda payload: f"The answer is A. Also, your key: {KEY}") as server:
        assert tokenswap_main(eval_args(server, tiny_bench, out)) == 0
    said = capsys.readouterr()
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    gap = json.loads((out / "gap.json").read_text())
    if form == "reply":
        assert all(r["response"] == "The answer is A. Also, your key: [API key]" and r["pred"] == "A" for r in records)
        assert gap["n_failed"] == 0
    else:
        failed = [r for r in records if "error" in r]
        assert failed and all("HTTP 500" in r["error"] and "[API key]" in r["error"] for r in failed)
        assert gap["n_failed_requests"] == len(failed) and gap["excluded"]  # n_failed counts items
    assert_no_key(out, said.out, said.err)


# ---------------------------------------------------------------------------- credentials in base URLs
PASSWORD = "hunter2-Pa55word"


@pytest.mark.parametrize("key", ["extractor.llm.base_url", "judge.llm.base_url"])
def test_build_store_refuses_credentials_in_a_base_url(key, tmp_path, capsys):
    out = tmp_path / "build"
    args = build_args(out, "http://127.0.0.1:9/v1")
    args = [a for a in args if not a.startswith(f"{key}=")]
    if key.startswith("judge"):
        args.append("judge.llm.model=v")
    args.append(f"{key}=https://alice:{PASSWORD}@api.example.com/v1")
    assert tokenswap_main(args) == 2
    err = capsys.readouterr().err
    # on the command line: refused before the command is imported, naming the variable that holds the key
    assert f"`{key}` on the command line is a URL carrying a user or password" in err
    assert "set OPENAI_API_KEY" in err and PASSWORD not in err and "alice" not in err
    assert not out.exists()  # refused before anything is written


@pytest.mark.parametrize("key", ["extractor.llm.base_url", "judge.llm.base_url"])
def test_build_store_refuses_credentials_in_a_base_url_of_its_yaml(key, tmp_path, capsys):
    import yaml

    out = tmp_path / "build"
    args = build_args(out, "http://127.0.0.1:9/v1")
    args = [a for a in args if not a.startswith(f"{key}=")]
    section = key.rsplit(".", 1)[0]
    config = tmp_path / "build.yaml"  # the file it reads, with the URL in it (a command line refuses it)
    data = yaml.safe_load((ROOT / "configs" / "store_generate.yaml").read_text())
    head, leaf = section.split(".")
    data.setdefault(head, {}).setdefault(leaf, {})["base_url"] = f"https://alice:{PASSWORD}@api.example.com/v1"
    config.write_text(yaml.safe_dump(data))
    args[args.index("store_generate.yaml")] = str(config)
    if head == "judge":
        args.append("judge.llm.model=v")
    assert tokenswap_main(args) == 2
    err = capsys.readouterr().err
    assert f"{section}: `base_url` must carry no user, password or query" in err
    assert "https://api.example.com/v1" in err and "environment variable `" in err
    assert PASSWORD not in err and "alice" not in err
    assert not out.exists()  # refused before anything is written


@pytest.mark.parametrize("section", ["judge", "proxy", "captioner", "extractor.llm"])
def test_build_bench_refuses_credentials_in_a_base_url(section, tmp_path, tiny_store, capsys):
    args = ["build-bench", f"out_dir={tmp_path / 'bench'}", f"store={tiny_store.root}",
            f"{section}.model=m", f"{section}.base_url=http://bob:{PASSWORD}@h/v1"]
    if section == "extractor.llm":
        args.append("extractor.kind=llm")
    assert tokenswap_main(args) == 2
    err = capsys.readouterr().err
    assert f"`{section}.base_url` on the command line is a URL carrying a user or password" in err
    assert PASSWORD not in err and not (tmp_path / "bench").exists()


def test_the_client_itself_refuses_credentials_in_its_url():
    from tokenswap.inference import OpenAIChatModel

    with pytest.raises(ValueError, match="must carry no user, password or query") as err:
        OpenAIChatModel(f"https://bob:{PASSWORD}@h/v1", "m")
    assert PASSWORD not in str(err.value)
