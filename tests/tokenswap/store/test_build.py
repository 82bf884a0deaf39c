"""The store build: offline config end to end, config errors, LLM extraction + judge, kill-and-resume."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tokenswap.concepts import Concept, validate_concepts
from tokenswap.config import ConfigError, load_config
from tokenswap.store import ImageStore, build_embedded_store, read_swap_dataset
from tokenswap.store.build import StoreBuildConfig, build_store, embedded_config

REPO = Path(__file__).resolve().parents[3]


def cli_main(argv):
    """`tokenswap build-store ...` through the real entry point (it maps refusals to exit 2, failures to 1)."""
    from tokenswap.cli import main

    return main(["build-store", *argv])


def _check_dataset(out: Path) -> list[dict]:
    store = ImageStore(out / "store")
    samples = read_swap_dataset(out / "dataset")
    for s in samples:
        assert set(s) == {"id", "messages", "concepts", "images"}
        concepts = [Concept.from_dict(c) for c in s["concepts"]]
        validate_concepts(concepts, [m["content"] for m in s["messages"]], s["id"])
        for c in concepts:
            assert s["messages"][c.message]["role"] == "user" and store.get(c.key)
    return samples


def test_store_embedded_yaml_end_to_end(embedded_build):
    report = json.loads((embedded_build / "report.json").read_text())
    samples = _check_dataset(embedded_build)
    assert report["complete"] and report["samples_read"] == 320 and report["samples_kept"] == len(samples) >= 250
    assert report["concept_coverage"] == 1.0 and report["images_per_sample"] >= 1.0
    assert report["overhead_s"] == pytest.approx(report["time_s"]["total"] - report["source_s"])
    store = ImageStore(embedded_build / "store")
    key = sorted(store.keys())[0]
    assert {im.source for im in store.get(key)} == {"openmoji", "rendered_text"}
    assert store.get(key)[0].source == "openmoji"  # pictures rank above rendered words
    assert "CC BY-SA 4.0" in store.info["attribution"]
    assert store.get(key)[0].load().size == (112, 112)
    # The YAML and embedded_config() describe the same build.
    yaml_cfg = load_config(StoreBuildConfig, "store_embedded.yaml", [f"output_dir={embedded_build}"])
    assert dataclasses.asdict(yaml_cfg) == dataclasses.asdict(embedded_config(embedded_build))


def test_build_embedded_store_is_cached(tmp_path, monkeypatch):
    import tokenswap.store.embedded as embedded

    store = build_embedded_store(tmp_path)

    def no_second_build(cfg):
        raise AssertionError("the second call built the store again")

    monkeypatch.setattr(embedded, "build_store", no_second_build)
    again = build_embedded_store(tmp_path)
    assert again.keys() == store.keys() and len(store) > 100


def test_config_errors_name_the_key(tmp_path, capsys):
    assert cli_main(["--config", "store_embedded.yaml", f"output_dir={tmp_path}", "extractor.kindd=llm"]) == 2
    err = capsys.readouterr().err
    assert "extractor.kindd" in err and "did you mean `extractor.kind`" in err
    with pytest.raises(ConfigError, match="retrieval"):
        load_config(StoreBuildConfig, "store_embedded.yaml", ["sources=[retrieval]"])
    with pytest.raises(ConfigError, match="unknown source 'pictures'"):
        load_config(StoreBuildConfig, "store_embedded.yaml", ["sources=[pictures]"])
    for name in ("store_generate.yaml", "store_retrieve.yaml"):
        cfg = load_config(StoreBuildConfig, name)
        assert cfg.data.path == "Magpie-Align/Magpie-Pro-300K-Filtered" and cfg.extractor.kind == "llm"


def test_resume_refuses_changed_sharding(tmp_path):
    cfg = embedded_config(tmp_path)
    cfg.data.max_samples = 20
    build_store(cfg)
    cfg.samples_per_shard = 7
    with pytest.raises(ValueError, match="samples_per_shard"):
        build_store(cfg)


def _magpie_file(path: Path, texts: list[str]) -> str:
    rows = [
        {"uuid": f"s{i}", "conversations": [{"from": "human", "value": t}, {"from": "gpt", "value": "ok"}]}
        for i, t in enumerate(texts)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.integration
def test_llm_extraction_and_validity_judge_in_a_build(fake_openai, tmp_path):
    words = ["cat", "dog", "apple"]

    def reply(payload):
        content = payload["messages"][-1]["content"]
        if payload["messages"][0]["role"] == "system":  # the extractor
            text = content.split("<<<", 1)[1].rsplit(">>>", 1)[0]
            spans = [{"text": w, "start": text.find(w) + 1, "end": text.find(w) + 1 + len(w)} for w in words if w in text]
            return "```json\n" + json.dumps({"concepts": spans}) + "\n```"  # offsets off by one: repaired
        question = next(p["text"] for p in content if p["type"] == "text")
        assert any(p["type"] == "image_url" for p in content)  # the target is shown as an image
        return json.dumps({"valid": '"dog"' not in question, "reason": "scripted"})

    fake_openai.reply = reply
    data = _magpie_file(tmp_path / "m.jsonl", ["my cat and my dog", "an apple a day", "nothing here", "dog days"])
    cfg = load_config(
        StoreBuildConfig,
        None,
        [
            f"output_dir={tmp_path / 'out'}",
            f"data.path={data}",
            "sources=[rendered_text]",
            "extractor.kind=llm",
            "extractor.llm.model=fake",
            f"extractor.llm.base_url={fake_openai.base_url}",
            "judge.llm.model=fake-vlm",
            f"judge.llm.base_url={fake_openai.base_url}",
            "progress=false",
        ],
    )
    report = build_store(cfg)
    store = ImageStore(tmp_path / "out" / "store")
    assert store.attempted("dog") and store.get("dog") == []  # judged invalid, dropped
    (cat,) = store.get("cat")
    assert cat.meta["judge"] == {"valid": True, "reason": "scripted"}
    samples = _check_dataset(tmp_path / "out")
    assert [s["id"] for s in samples] == ["s0", "s1"]
    assert [c["key"] for c in samples[0]["concepts"]] == ["cat"]
    assert report["ranks"]["extract"][0]["llm_extraction"]["offsets_repaired"] == 4
    # A rerun from scratch (new output_dir) asks the endpoint nothing new for extraction: cached in state/.
    n = len(fake_openai.requests)
    build_store(cfg)
    assert len(fake_openai.requests) == n


def _store_rows(out: Path) -> list[tuple]:
    ds = ImageStore(out / "store").to_dataset()
    return sorted(zip(ds["key"], ds["source"], ds["image_id"]))


@pytest.mark.integration
def test_kill_and_resume_matches_an_uninterrupted_build(tmp_path):
    overrides = ["samples_per_shard=8", "concept_batch_size=2", "data.max_samples=200"]
    ref = tmp_path / "ref"
    build_store(load_config(StoreBuildConfig, "store_embedded.yaml", [f"output_dir={ref}", *overrides]))

    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "tokenswap.cli", "build-store", "--config", "store_embedded.yaml", f"output_dir={out}", *overrides]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rng = random.Random(0)
    kills = 0
    def written() -> int:
        return sum(1 for p in out.rglob("*") if p.is_file()) if out.exists() else 0

    for _ in range(4):
        before = written()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Kill only once this attempt has committed something new (so every kill lands mid-build,
        # whatever the machine's speed), then at a random moment shortly after.
        deadline = time.monotonic() + 120
        while proc.poll() is None and written() <= before + rng.randint(1, 3) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.2))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
        if (out / "report.json").exists():
            break
    assert kills >= 2, "the build finished before it could be killed; raise the workload"
    subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True)

    rows = _store_rows(out)
    assert len(rows) == len(set(rows)), "duplicate store entries after resume"
    assert rows == _store_rows(ref)
    assert read_swap_dataset(out / "dataset") == read_swap_dataset(ref / "dataset")
    store = ImageStore(out / "store")
    for image in store:
        image.load()  # raises CorruptImageError on a torn write
