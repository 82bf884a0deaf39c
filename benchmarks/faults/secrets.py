"""Section ``secrets`` of benchmarks/faults.py: a loopback server whose 500 quotes the ``Authorization`` header (raw,
JSON-escaped, percent-encoded, plus form, cut by the client, cut by the build) or whose reply repeats the key,
through ``build-store`` and ``tokenswap eval --backend openai``: no form of the key in any file of the folder nor in
stdout/stderr; ``user:password@`` in ``extractor.llm`` / ``judge.llm`` / the bench builder's base URLs: exit 2
naming the key and the fix, the password nowhere (on the command line: refused before the command runs, naming the
variable to set instead); a tiny offline W&B training run whose YAML holds ``train.hub_token`` and a ``user:pass@``
URL in ``train.hub_model_id``: neither in the ``.wandb`` file, ``debug.log``, any ``training_args.bin`` nor any
other file, and the run resumes from its checkpoint.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from ._common import ENV, PY, REPO, Tally, _eval_cmd, _fault_bench, _small_build_cmd, contextlib_quiet, run, train_cmd

OUTCOME = (
    "the API key (raw, JSON-escaped, URL-encoded, plus form, cut, in a reply) in no report, marker, cache, record, "
    "summary or stderr; user:password@ base URLs: exit 2; hub token + URL credentials in no W&B file or training_args.bin"
)


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
    from tests.support import LoadLLMServer

    count = {"n": 0}

    def respond(payload, headers):
        count["n"] += 1
        if form == "repeated in the model's reply" or count["n"] % 3:
            return None
        return 500, _echo_body(form, headers["authorization"])

    return LoadLLMServer(reply, respond=respond)


def section_secrets(t: Tally, work: Path, model: Path | None, store: Path | None) -> None:
    """The API key (every encoded and cut form) in no sink; credentials refused in base URLs; W&B and pickles."""
    from tests.support import concept_reply

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
        ok = (proc.returncode == 2 and f"`{key}` on the command line is a URL carrying a user or password"
              in proc.stderr and "in the environment instead" in proc.stderr
              and password not in proc.stderr + proc.stdout and not out.exists())
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
    config = work / "secrets-train.yaml"  # where a secret may be: a command line refuses it
    config.write_text((REPO / "configs" / "tiny" / "post_tokenswap.yaml").read_text().replace(
        "\ntrain:\n", f"\ntrain:\n  hub_token: {token}\n  hub_model_id: https://alice:{url_password}@hub.example.com/org/m\n",
        1))
    secrets = ("train.report_to=[wandb]", "wandb.mode=offline")

    def cmd(*extra, steps):
        argv = train_cmd(out, model, store, *secrets, *extra, steps=steps)
        argv[argv.index("tiny/post_tokenswap.yaml")] = str(config)
        return argv

    first = run(cmd(steps=2), 600)
    resumed = run(cmd("train.resume_from_checkpoint=latest", steps=4), 600)
    said = first.stdout + first.stderr + resumed.stdout + resumed.stderr
    files = {"the .wandb run file": list(out.glob("wandb/offline-run-*/run-*.wandb")),
             "W&B's debug.log": list(out.glob("wandb/offline-run-*/logs/debug*.log")),
             "checkpoint-*/training_args.bin and the final one": list(out.glob("**/training_args.bin")),
             "every other file of the run": [p for p in out.rglob("*") if p.is_file()]}
    for what, paths in files.items():
        found = [f"{p.relative_to(out)}" for p in paths for s in (token, url_password, token[:12], url_password[:10])
                 if s.encode() in p.read_bytes()]
        t.add("secrets", f"train.hub_token and user:pass@ URL in the YAML: not in {what}",
              first.returncode == 0 and bool(paths) and not found, f"rc={first.returncode} files={len(paths)} "
              f"found={found[:3]} {first.stderr[-200:]}")
    t.add("secrets", "the run resumes from its checkpoint (nothing reads training_args.bin back), its output clean",
          resumed.returncode == 0 and (out / "checkpoint-4").is_dir() and token not in said and url_password not in said,
          f"rc={resumed.returncode} {resumed.stderr[-300:]}")
