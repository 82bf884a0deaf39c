"""Magpie loader on local JSONL and parquet files in the hub schema, and the packaged fixture."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokenswap.data.magpie import fixture_path, iter_magpie, magpie_to_sample
from tokenswap.store.embedded import load_fixture

ROWS = [
    {
        "uuid": f"u{i}",
        "conversations": [{"from": "human", "value": f"Tell me about the cat number {i}."}, {"from": "gpt", "value": "Cats."}],
        "model": "Llama-3-70B-Instruct",
        "difficulty": "easy",
    }
    for i in range(5)
]


def _expected(i):
    return {
        "id": f"u{i}",
        "messages": [
            {"role": "user", "content": f"Tell me about the cat number {i}."},
            {"role": "assistant", "content": "Cats."},
        ],
        "concepts": [],
        "images": [],
    }


def test_jsonl(tmp_path):
    path = tmp_path / "magpie.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert list(iter_magpie(str(path))) == [_expected(i) for i in range(5)]
    assert list(iter_magpie(str(path), streaming=False, max_samples=2)) == [_expected(0), _expected(1)]


def test_parquet(tmp_path):
    path = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    assert list(iter_magpie(str(path))) == [_expected(i) for i in range(5)]
    # A folder of parquet shards, as the hub repo lays it out.
    assert list(iter_magpie(str(tmp_path), streaming=True)) == [_expected(i) for i in range(5)]


def test_system_turn_and_malformed_rows(tmp_path):
    row = {"uuid": "s", "conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hi"}]}
    assert [m["role"] for m in magpie_to_sample(row)["messages"]] == ["system", "user"]
    with pytest.raises(ValueError, match=r"row 7 \(uuid 'x'\): conversations\[1\].from is 'bot'"):
        magpie_to_sample({"uuid": "x", "conversations": [{"from": "human", "value": "a"}, {"from": "bot", "value": "b"}]}, 7)
    with pytest.raises(ValueError, match="field 'uuid'"):
        magpie_to_sample({"conversations": []}, 3)
    with pytest.raises(ValueError, match="field 'conversations'"):
        magpie_to_sample({"uuid": "y", "conversations": []}, 3)
    bad = [ROWS[0], {"uuid": "bad", "conversations": [{"from": "human", "value": 5}]}, ROWS[1]]
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in bad))
    with pytest.raises(ValueError, match=r"bad\.jsonl:2 \(uuid 'bad'\): conversations\[0\].value must be a string"):
        list(iter_magpie(str(path)))
    assert [s["id"] for s in iter_magpie(str(path), skip_malformed=True)] == ["u0", "u1"]


def test_fixture_is_magpie_format_and_reproducible():
    from tests.assets.make_magpie_fixture import make_rows

    lines = fixture_path().read_text().splitlines()
    assert len(lines) >= 300
    assert [json.loads(line) for line in lines] == make_rows()
    assert len({json.loads(line)["uuid"] for line in lines}) == len(lines)


def test_load_fixture_fills_concepts_from_the_embedded_store(embedded_build):
    from tokenswap.store import ImageStore, read_swap_dataset

    store = ImageStore(embedded_build / "store")
    samples = load_fixture(store)
    assert 250 <= len(samples) < 320
    for s in samples:
        assert s["concepts"] and s["images"] == []
        for c in s["concepts"]:
            text = s["messages"][c["message"]]["content"]
            assert s["messages"][c["message"]]["role"] == "user" and store.get(c["key"]) and text[c["start"] : c["end"]]
    # Same spans as the build wrote into the swap dataset.
    built = {s["id"]: s for s in read_swap_dataset(embedded_build / "dataset")}
    assert {s["id"]: s for s in samples} == built
