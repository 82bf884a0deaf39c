"""tokenswap.redaction: every form of a secret masked (raw, JSON-escaped, URL-encoded, cut), URL credentials,
secret-named fields and command-line overrides, refused base URLs, and the Trainer's arguments masked on the way
out while the Trainer keeps the real values."""

from __future__ import annotations

import copy
import io
import json
import pickle
import sys
import urllib.parse

import pytest

from tokenswap import redaction
from tokenswap.redaction import (
    MIN_CUT,
    RedactingStream,
    base_url_problem,
    mask_secrets,
    redact,
    redact_argv,
    redact_data,
    remember,
    remember_env,
)

KEY = 'sk-unit/Te+st"key\\a1b2c3d4e5f6 end'  # encodes differently in JSON, percent and plus forms


def forms(secret: str) -> dict[str, str]:
    """The forms a server may quote a secret in."""
    once = json.dumps(secret)[1:-1]
    return {
        "raw": secret,
        "json": once,
        "json, slash escaped": once.replace("/", "\\/"),
        "json in json": json.dumps(once)[1:-1],
        "json ascii": json.dumps(secret + "é")[1:-1],
        "percent": urllib.parse.quote(secret, safe=""),
        "percent, lower-case hex": urllib.parse.quote(secret, safe="").lower(),
        "percent, slash kept": urllib.parse.quote(secret),
        "plus": urllib.parse.quote_plus(secret),
        "cut prefix": secret[:MIN_CUT + 3],
        "cut suffix": secret[-(MIN_CUT + 2):],
        "json cut prefix": once[:MIN_CUT + 8],  # cut inside the escaped quote: `...st\\"k`
    }


@pytest.fixture(scope="module", autouse=True)
def _known():
    remember(KEY, "API key")


@pytest.mark.parametrize("form", list(forms(KEY)))
def test_every_form_of_a_known_secret_is_masked(form):
    text = forms(KEY)[form]
    out = redact(f'HTTP 401: {{"detail": "Authorization: Bearer {text}"}} (request 7)')
    assert "[API key]" in out and out.startswith('HTTP 401: {"detail": "Authorization: Bearer ')
    assert out.endswith('"} (request 7)')
    for value in forms(KEY).values():
        assert value[:MIN_CUT] not in out  # no trace left of any form


def test_a_cut_shorter_than_the_minimum_is_left_and_text_around_is_kept():
    assert redact(f"x {KEY[:MIN_CUT - 1]} y") == f"x {KEY[:MIN_CUT - 1]} y"
    assert redact("nothing secret here, 12345678") == "nothing secret here, 12345678"


def test_url_credentials_are_masked_in_plain_json_and_encoded_urls():
    assert redact("GET https://bob:hunter22@host.example/v1 failed") == "GET https://<CREDENTIALS>@host.example/v1 failed"
    assert redact('{"u": "https:\\/\\/bob:hunter22@host\\/v1"}') == '{"u": "https:\\/\\/<CREDENTIALS>@host\\/v1"}'
    assert "hunter22" not in redact("next=https%3A%2F%2Fbob%3Ahunter22%40host%2Fv1")
    assert redact("mail me at a@b.com or see https://host/x?to=a@b.com") == \
        "mail me at a@b.com or see https://host/x?to=a@b.com"


def test_an_environment_key_is_masked_as_it_is_now(monkeypatch):
    remember_env("TS_UNIT_ROTATING_KEY")
    monkeypatch.setenv("TS_UNIT_ROTATING_KEY", "first-key-0123456789")
    assert redact("first-key-0123456789") == "[API key]"
    monkeypatch.setenv("TS_UNIT_ROTATING_KEY", "second-key-9876543210")  # rotated between two requests
    assert redact("got second-key-9876543210") == "got [API key]"


def test_short_values_and_masks_are_not_remembered():
    remember("abc")
    remember("<HUB_TOKEN>")  # transformers' own mask is no secret to hide everywhere
    assert redact("abc <HUB_TOKEN>") == "abc <HUB_TOKEN>"


def test_config_masking_by_field_name_remembers_the_values():
    masked = mask_secrets({"train": {"hub_token": "hf_unit_0123456789", "learning_rate": 0.1, "push_to_hub": True},
                           "llm": {"api_key": "", "url": "https://ann:pa55word-x@h/v1"}})
    assert masked == {"train": {"hub_token": "<HUB_TOKEN>", "learning_rate": 0.1, "push_to_hub": True},
                      "llm": {"api_key": "", "url": "https://<CREDENTIALS>@h/v1"}}
    # remembered: the same values are masked wherever they turn up later, in any form
    assert redact("token hf_unit_0123456789, password pa55word-x") == "token [hub token], password [credentials]"


def test_records_are_redacted_as_data_not_by_field_name():
    record = {"token": "A", "response": f"my key is {KEY}", "list": [KEY, 1.5, None], KEY: "key as a key"}
    assert redact_data(record) == {"token": "A", "response": "my key is [API key]", "list": ["[API key]", 1.5, None],
                                   "[API key]": "key as a key"}


def test_the_command_line_loses_its_secrets():
    argv = ["--config", "tiny/post.yaml", "train.hub_token=hf_argv_0123456789", "--api-key", "argv-key-0123",
            "train.hub_model_id=https://u:argv-pass-99@h/org/m", "data.path=x.jsonl"]
    assert redact_argv(argv) == ["--config", "tiny/post.yaml", "train.hub_token=<HUB_TOKEN>", "--api-key",
                                 "<API_KEY>", "train.hub_model_id=https://<CREDENTIALS>@h/org/m", "data.path=x.jsonl"]
    assert redact("hf_argv_0123456789 argv-key-0123 argv-pass-99").count("[") == 3


@pytest.mark.parametrize("url", ["https://bob:hunter2-secret@api.example.com/v1", "http://bob@h/v1",
                                 "http://h/v1?api_key=hunter2-secret"])
def test_a_base_url_with_credentials_is_refused_without_quoting_them(url):
    problem = base_url_problem(url, "extractor.llm.base_url", "MY_KEY")
    assert problem is not None and "`extractor.llm.base_url`" in problem and "`MY_KEY`" in problem
    assert "hunter2" not in problem and "bob" not in problem
    assert base_url_problem("http://localhost:8000/v1") is None
    assert "http(s) URL" in base_url_problem("ftp://bob:hunter2-secret@h/v1")


def test_a_redacting_stream_masks_what_is_written_through_it():
    sink = io.StringIO()
    stream = RedactingStream(sink)
    print(f"error: {KEY}", file=stream)
    assert sink.getvalue() == "error: [API key]\n" and stream.getvalue() == sink.getvalue()


class _Writes(io.StringIO):
    """A sink that records each write it is handed, as a write-through stderr hands each one to write(2)."""

    def __init__(self):
        super().__init__()
        self.writes: list[str] = []

    def write(self, text):
        self.writes.append(text)
        return super().write(text)


def test_a_printed_line_reaches_the_inner_stream_in_one_write_and_a_secret_in_pieces_is_masked():
    # print() writes each argument, each separator and the end apart; the stream hands on whole lines only.
    sink = _Writes()
    stream = RedactingStream(sink)
    print("error: ", *(KEY[i:i + 3] for i in range(0, len(KEY), 3)), sep="", file=stream, flush=True)
    assert sink.writes == ["error: [API key]\n"]  # pieces shorter than MIN_CUT: each alone is no secret
    print("one\ntwo", "three", file=stream)
    assert sink.writes[1:] == ["one\n", "two three\n"]
    stream.write("\r 40%|####  | 4/10")  # a progress bar: held until its flush, then shown at once
    assert len(sink.writes) == 3
    stream.flush()
    assert sink.writes[-1] == "\r 40%|####  | 4/10"
    stream.write("x" * RedactingStream.HOLD_LIMIT)  # nothing is held without bound
    assert sink.writes[-1] == "x" * RedactingStream.HOLD_LIMIT


def test_a_closed_reader_is_said_once_then_nothing_is_written():
    from tokenswap.errors import OutputClosedError

    class Closed(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    stream = RedactingStream(Closed())
    with pytest.raises(OutputClosedError) as e:
        print("table row", file=stream)
    assert e.value.fd is None  # StringIO has no descriptor
    # Not an OSError: no `except OSError` around printing code (a save-failure handler) takes it for its own fault,
    # and no `except Exception` (logging's handleError) goes on after it.
    assert not isinstance(e.value, Exception)
    print("more", file=stream, flush=True)  # nowhere to go, and no second error


@pytest.mark.integration
def test_a_forked_child_sends_none_of_the_parents_held_text_and_can_print_while_a_parent_thread_holds_the_lock():
    import os
    import threading
    import time

    read, write = os.pipe()
    stream = RedactingStream(os.fdopen(write, "w", buffering=1))
    stream.write("the parent's half line ")
    held = threading.Event()
    release = threading.Event()

    def hold():
        with stream._lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(30)
    pid = os.fork()
    if pid == 0:  # the child: print and leave at once (a lock copied as held would hang here)
        try:
            print("child line", file=stream, flush=True)
        finally:
            os._exit(0)
    release.set()
    holder.join()
    deadline = time.monotonic() + 30
    while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
        time.sleep(0.01)
    if done == (0, 0):
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    status = done[1] if done != (0, 0) else "hung"
    print("and its end", file=stream, flush=True)
    stream._inner.close()
    with os.fdopen(read) as pipe:
        lines = pipe.read().splitlines()
    assert status == 0 and sorted(lines) == ["child line", "the parent's half line and its end"]


def test_what_a_redacting_block_left_unfinished_goes_out_when_it_ends(capsys):
    with redaction.redacting_std_streams():
        sys.stdout.write(f"no newline {KEY}")
    assert capsys.readouterr().out == "no newline [API key]"


def test_the_trainers_arguments_are_masked_on_the_way_out_and_real_inside(tmp_path):
    import torch
    from transformers import TrainingArguments

    from tokenswap.training.trainer_args import redacting

    cls = redacting(TrainingArguments)
    args = cls(output_dir=str(tmp_path), hub_token="hf_pickle_0123456789", use_cpu=True,
               hub_model_id="https://eve:pickle-pass-42@hub.example.com/org/m")
    assert cls.__name__ == "TrainingArguments" and isinstance(args, TrainingArguments)
    for text in (json.dumps(args.to_dict()), str(args), repr(args), args.to_json_string()):
        assert "hf_pickle" not in text and "pickle-pass" not in text
    assert args.to_dict()["hub_model_id"] == "https://<CREDENTIALS>@hub.example.com/org/m"
    torch.save(args, tmp_path / "training_args.bin")  # what the Trainer does at every save
    raw = (tmp_path / "training_args.bin").read_bytes()
    assert b"hf_pickle" not in raw and b"pickle-pass" not in raw
    loaded = torch.load(tmp_path / "training_args.bin", weights_only=False)
    assert type(loaded) is TrainingArguments  # loads without tokenswap's class
    assert (loaded.hub_token, loaded.learning_rate) == ("<HUB_TOKEN>", args.learning_rate)
    assert type(pickle.loads(pickle.dumps(args))) is TrainingArguments
    # The Trainer itself keeps what it needs to push to the hub.
    for same in (args, copy.copy(args), copy.deepcopy(args)):
        assert same.hub_token == "hf_pickle_0123456789" and type(same) is cls


def test_the_module_imports_nothing_of_tokenswap_but_the_errors_it_raises():
    """Every module may use it: it stands on tokenswap.errors alone, which imports nothing of tokenswap."""
    import ast
    from pathlib import Path

    from tokenswap import errors

    imported = []
    for module in (redaction, errors):
        tree = ast.parse(Path(module.__file__).read_text())
        imported += [(module.__name__, n.module or "") for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        imported += [(module.__name__, a.name) for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert [(m, i) for m, i in imported if i.startswith("tokenswap")] == [("tokenswap.redaction", "tokenswap.errors")]


def test_a_config_error_quoting_a_secret_of_the_yaml_prints_it_masked(capsys, tmp_path):
    from dataclasses import dataclass

    from tokenswap.training import run_recipe

    @dataclass(kw_only=True)
    class Toy:
        hub_token: str | None = None
        url: str | None = None

    config = tmp_path / "toy.yaml"  # remembered though the file fails its checks: the problems quote the values
    config.write_text("hub_token: [hf_cfg_error_0123456]\nurl: [https://ann:cfg-pass-777@h/v1]\n")
    with pytest.raises(SystemExit) as e:  # a recipe's entry: the error printed through the redacting streams
        run_recipe(lambda cfg: pytest.fail("ran on a bad config"), Toy, ["--config", str(config)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "`hub_token` must be" in err and "`url` must be" in err
    assert "hf_cfg_error" not in err and "cfg-pass" not in err
