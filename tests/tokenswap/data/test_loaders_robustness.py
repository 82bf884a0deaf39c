"""Loaders under bad input: edited files, hidden errors, bad spans, empty files, malformed lines."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from PIL import Image

from tokenswap.data.llava import load_llava
from tokenswap.data.magpie import iter_magpie
from tokenswap.data.schema import load_samples


def _llava(path: Path, records: list) -> Path:
    path.write_text(json.dumps(records))
    return path


def _rec(i: int, image: str | None = None) -> dict:
    rec = {"id": f"r{i}", "conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": f"a{i}"}]}
    if image:
        rec["image"] = image
    return rec


def test_load_llava_rereads_an_edited_file_and_rechecks_images(tmp_path):
    root = tmp_path / "images"
    root.mkdir()
    Image.new("RGB", (8, 8)).save(root / "a.png")
    path = _llava(tmp_path / "llava.json", [_rec(0, "a.png"), _rec(1)])
    assert load_llava(path, image_root=root)["id"] == ["r0", "r1"]
    time.sleep(0.01)
    _llava(path, [_rec(0, "a.png"), _rec(1), _rec(2)])  # same path, new content
    assert load_llava(path, image_root=root)["id"] == ["r0", "r1", "r2"]
    os.remove(root / "a.png")  # the cached rows must not skip the image check
    with pytest.raises(FileNotFoundError, match=r"1 LLaVA images are missing .*a\.png"):
        load_llava(path, image_root=root)
    assert load_llava(path, image_root=root, on_missing_image="drop")["id"] == ["r1", "r2"]


@pytest.mark.parametrize(
    "content, match",
    [
        ("", r"llava\.json: not valid JSON \(the file is empty\)"),
        ("[]", "the list of LLaVA records is empty"),
        ('{"a": 1}', "expected a JSON list"),
        ('[{"id": 1, "conversations": [{"from": "robot", "value": "x"}]}]', r"record 0 \(id 1\) turn 0"),
        ('[{"id": 1}, 5]', r"record 0 \(id 1\) has no 'conversations'"),
        ('[{"id": 1, "conversations": [{"from": "human", "value": "x"}]}, 5]', r"record 1: expected an object"),
        ('[{"id": 1, "conversations": [{"from": "human", "value": "x \\udcff"}]}]',
         r"record 0: sample '1': message 0 content: .*lone UTF-16 surrogate"),
    ],
    ids=["empty", "empty-list", "not-a-list", "bad-role", "no-conversations", "not-an-object", "surrogate"],
)
def test_load_llava_errors_name_file_and_record_not_dataset_generation_error(tmp_path, content, match):
    path = tmp_path / "llava.json"
    path.write_text(content)
    with pytest.raises((ValueError, KeyError), match=match):
        load_llava(path)


def _sample(i: int, start: int = 0, end: int = 3) -> dict:
    return {"id": f"s{i}", "messages": [{"role": "user", "content": "cat here"}, {"role": "assistant", "content": "ok"}],
            "concepts": [{"message": 0, "start": start, "end": end, "key": "cat"}], "images": []}


def test_load_samples_names_file_and_line_of_a_bad_span(tmp_path):
    path = tmp_path / "swap.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [_sample(0), _sample(1), _sample(2, 5, 40)]) + "\n")
    with pytest.raises(ValueError, match=r"swap\.jsonl:3: sample 's2': concept 'cat' span \[5, 40\) is out of range"):
        load_samples(str(path))
    path.write_text(json.dumps(_sample(0)) + "\n" + json.dumps(_sample(1))[:30] + "\n")
    with pytest.raises(ValueError, match=r"swap\.jsonl:2 is not valid JSON"):
        load_samples(str(path))
    path.write_text("")
    with pytest.raises(ValueError, match="no samples"):
        load_samples(str(path))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_samples(str(tmp_path / "nope.jsonl"))
    path.write_text(json.dumps(_sample(0)) + "\n")
    assert load_samples(str(path))["id"] == ["s0"]


def _magpie_line(i: int) -> bytes:
    return json.dumps({"uuid": f"u{i}", "conversations": [{"from": "human", "value": f"hi {i}"},
                                                         {"from": "gpt", "value": "ok"}]}).encode() + b"\n"


def test_skip_malformed_counts_truncated_non_utf8_and_list_lines(tmp_path):
    path = tmp_path / "magpie.jsonl"
    path.write_bytes(
        _magpie_line(0)
        + _magpie_line(1)[:25] + b"\n"  # truncated
        + b'{"uuid": "x", "conversations": "\xff\xfe"}\n'  # not UTF-8
        + b'[1, 2, 3]\n'  # a list, not an object
        + b'{"uuid": "u4", "conversations": []}\n'  # bad field
        + b"\n"
        + _magpie_line(5)
    )
    stats: dict = {}
    with pytest.warns(UserWarning, match="skipped 4 malformed of 6 rows"):
        ids = [s["id"] for s in iter_magpie(str(path), skip_malformed=True, stats=stats)]
    assert ids == ["u0", "u5"] and stats["rows"] == 6 and stats["malformed"] == 4
    assert any(":3 is not UTF-8" in e for e in stats["malformed_examples"])
    with pytest.raises(ValueError, match=r"magpie\.jsonl:2 is not valid JSON"):
        list(iter_magpie(str(path)))


def test_a_lone_surrogate_is_malformed_where_the_row_enters(tmp_path):
    # json.loads turns the escape into a str that no UTF-8 writer or tokenizer takes: refused on reading, not later.
    path = tmp_path / "magpie.jsonl"
    path.write_bytes(_magpie_line(0) + b'{"uuid": "u1", "conversations": [{"from": "human", "value": "a cat \\udcff"},'
                     b' {"from": "gpt", "value": "ok"}]}\n' + b'{"uuid": "u\\ud800", "conversations": [{"from": '
                     b'"human", "value": "x"}]}\n' + _magpie_line(3))
    with pytest.raises(ValueError, match=r"magpie\.jsonl:2 \(uuid 'u1'\): conversations\[0\]\.value: .*lone "
                                         r"UTF-16 surrogate.*data\.skip_malformed: true"):
        list(iter_magpie(str(path)))
    stats: dict = {}
    with pytest.warns(UserWarning, match="skipped 2 malformed of 4 rows"):
        assert [s["id"] for s in iter_magpie(str(path), skip_malformed=True, stats=stats)] == ["u0", "u3"]
    assert any(":3: field 'uuid'" in e for e in stats["malformed_examples"])


@pytest.mark.parametrize(
    "row, match",
    [
        ({"concepts": [{"message": 0, "start": 0, "key": "cat"}]}, r"sample 's0': concepts\[0\]: .*missing 'end'"),
        ({"concepts": [{"message": 0, "start": "abc", "end": 3, "key": "cat"}]}, r"sample 's0': .*`start` must be an int"),
        ({"concepts": [{"message": 0, "start": 0.9, "end": 3, "key": "cat"}]}, r"sample 's0': .*`start` must be an int"),
        ({"concepts": {"message": 0, "start": 0, "end": 3, "key": "cat"}}, r"sample 's0': `concepts` must be a list"),
        ({"messages": [{"role": "robot", "content": "cat here"}]}, r"sample 's0': message 0 has role 'robot'"),
        ({"messages": [{"role": None, "content": "cat here"}]}, r"sample 's0': message 0 has role None"),
        ({"messages": [{"role": "user", "content": "cat \udcff"}]}, r"sample 's0': message 0 content: .*surrogate"),
        ({"id": "s\udcff"}, r"`id` must be a string or an integer.*surrogate"),
    ],
    ids=["no-end", "start-abc", "start-float", "concepts-dict", "role-robot", "role-none", "surrogate", "id-surrogate"],
)
def test_load_samples_names_file_line_and_sample_of_every_malformed_row(tmp_path, row, match):
    path = tmp_path / "swap.jsonl"
    path.write_text(json.dumps(_sample(1)) + "\n" + json.dumps({**_sample(0), **row}) + "\n")
    with pytest.raises(ValueError, match=r"swap\.jsonl:2: " + match):
        load_samples(str(path))


def test_empty_magpie_file_is_a_clear_error(tmp_path):
    path = tmp_path / "magpie.jsonl"
    path.write_text("")
    with pytest.raises(ValueError, match="has no rows"):
        list(iter_magpie(str(path)))
    with pytest.raises(ValueError, match="max_samples must be >= 1"):
        list(iter_magpie(str(path), max_samples=-1))
