"""The store build under faults: concurrent builds, changed settings, typos, negative limits, hostile images."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from tokenswap.config import ConfigError, load_config
from tokenswap.store import ImageStore, read_swap_dataset
from tokenswap.store.build import StoreBuildConfig, build_store
from tokenswap.store.coordination import build_lock

REPO = Path(__file__).resolve().parents[3]


def cli_main(argv):
    """`tokenswap build-store ...` through the real entry point (it maps refusals to exit 2, failures to 1)."""
    from tokenswap.cli import main

    return main(["build-store", *argv])


def _cfg(out: Path, *overrides: str) -> StoreBuildConfig:
    return load_config(StoreBuildConfig, "store_embedded.yaml", [f"output_dir={out}", "progress=false", *overrides])


def test_a_second_build_on_a_locked_folder_is_refused_naming_the_holder(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    with build_lock(out, 0):
        code = cli_main(["--config", "store_embedded.yaml", f"output_dir={out}", "data.max_samples=10"])
        err = capsys.readouterr().err
    assert code == 1
    assert str(out) in err and f"pid {os.getpid()}" in err and "another process" in err
    assert not (out / "state").exists()  # the refused build wrote nothing
    # The lock is gone with its holder: the same command now builds.
    assert cli_main(["--config", "store_embedded.yaml", f"output_dir={out}", "data.max_samples=10"]) == 0


@pytest.mark.integration
def test_two_builds_started_together_one_builds_the_other_is_refused(tmp_path):
    ref = tmp_path / "ref"
    build_store(_cfg(ref, "data.max_samples=120", "samples_per_shard=10"))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "tokenswap.cli", "build-store", "--config", "store_embedded.yaml",
           f"output_dir={out}", "data.max_samples=120", "samples_per_shard=10", "progress=false"]
    procs = [subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 1], results
    refused = next(err for code, err in results if code == 1)
    assert "being built by another process" in refused and str(out) in refused
    assert read_swap_dataset(out / "dataset") == read_swap_dataset(ref / "dataset")
    assert sorted(im.image_id for im in ImageStore(out / "store")) == sorted(
        im.image_id for im in ImageStore(ref / "store")
    )


def test_resuming_with_other_sources_is_refused_showing_the_difference(tmp_path):
    build_store(_cfg(tmp_path, "data.max_samples=20"))
    with pytest.raises(ValueError, match=r"sources: was \['openmoji', 'rendered_text'\], now \['rendered_text'\]"):
        build_store(_cfg(tmp_path, "data.max_samples=20", "sources=[rendered_text]", "extractor.vocabulary=[cat]"))
    with pytest.raises(ValueError, match=r"source_settings.openmoji.size: was 112, now 64"):
        build_store(_cfg(tmp_path, "data.max_samples=20", "openmoji.size=64"))


def test_a_typo_in_data_path_writes_nothing_so_the_fixed_command_runs(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--config", "store_embedded.yaml", f"output_dir={out}", "progress=false"]
    assert cli_main([*argv, f"data.path={tmp_path / 'magpie.jsonll'}"]) == 2
    err = capsys.readouterr().err
    assert "data.path" in err and "magpie.jsonll" in err and "does not exist" in err
    assert not (out / "state").exists()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert cli_main([*argv, f"data.path={empty}"]) == 2
    assert "empty.jsonl" in capsys.readouterr().err
    assert not (out / "state").exists()
    assert cli_main([*argv, "data.max_samples=10"]) == 0


def test_a_malformed_row_is_named_then_skipped_and_counted_when_asked(tmp_path, capsys):
    data = tmp_path / "magpie.jsonl"
    rows = [json.dumps({"uuid": f"u{i}", "conversations": [{"from": "human", "value": f"a cat and a dog {i}"},
                                                          {"from": "gpt", "value": "ok"}]}) for i in range(6)]
    rows[3] = rows[3].replace("a cat", "a cat \\udcff")  # the JSON escape of a lone surrogate
    data.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    argv = ["--config", "store_embedded.yaml", f"output_dir={out}", f"data.path={data}", "samples_per_shard=2"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert f"{data}:4 (uuid 'u3')" in err and "surrogate" in err and "data.skip_malformed: true" in err
    assert (out / "state" / "plan.json").exists() and "nothing was written" not in err
    # The rows before the bad one were committed; skipping resumes the same build instead of refusing it.
    assert cli_main([*argv, "data.skip_malformed=true"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["rows_malformed_skipped"] == 1 and report["samples_read"] == 5
    ref = tmp_path / "ref"
    assert cli_main([*argv[:2], f"output_dir={ref}", *argv[3:], "data.skip_malformed=true"]) == 0
    assert read_swap_dataset(out / "dataset") == read_swap_dataset(ref / "dataset")


@pytest.mark.parametrize(
    "override", ["data.max_samples=-1", "data.max_samples=0", "extractor.max_concepts=-1", "openmoji.size=0",
                 "barrier_timeout_s=.nan", "rendered_text.size=-5"]
)
def test_negative_and_zero_limits_are_config_errors(override):
    with pytest.raises(ConfigError, match=override.split("=")[0].split(".")[-1]):
        load_config(StoreBuildConfig, "store_embedded.yaml", ["output_dir=/tmp/unused", override])


def test_hostile_corpus_images_are_rejected_by_name_and_the_build_goes_on(tiny_clip, hostile, tmp_path):
    corpus = tmp_path / "corpus"
    bad = hostile.hostile_files(corpus)
    for i, colour in enumerate(["red", "green", "blue", "yellow"]):
        Image.new("RGB", (40, 30), colour).save(corpus / f"ok{i}.png")
    data = tmp_path / "m.jsonl"
    data.write_text("".join(
        json.dumps({"uuid": f"s{i}", "conversations": [{"from": "human", "value": t}, {"from": "gpt", "value": "ok"}]})
        + "\n" for i, t in enumerate(["a cat and a dog", "an apple", "the dog"])
    ))
    cfg = load_config(StoreBuildConfig, None, [
        f"output_dir={tmp_path / 'out'}", f"data.path={data}", "sources=[retrieval]", "extractor.vocabulary=[cat,dog,apple]",
        f"retrieval.clip_path={tiny_clip}", f"retrieval.corpus={corpus}", "retrieval.top_k=7", "retrieval.min_score=-1",
        "retrieval.batch_size=2", "progress=false",
    ])
    with pytest.warns(UserWarning, match="image rejected"):
        report = build_store(cfg)
    assert report["images_rejected"] == 3
    named = " ".join(r["what"] for r in report["rejected_images"])
    assert all(p.name in named for p in bad)
    store = ImageStore(tmp_path / "out" / "store")
    assert {im.meta["item"] for im in store} <= {f"ok{i}.png" for i in range(4)}
    assert all(len(store.get(k)) == 4 for k in ("cat", "dog", "apple"))
    # A bad file planted after indexing is refused at retrieval time, again by name.
    hostile.sliver_png(corpus / "ok0.png")
    (tmp_path / "out" / "report.json").unlink()
    for p in (tmp_path / "out").glob("state/images/*"):
        p.unlink()
    for p in (tmp_path / "out" / "store" / "shards").glob("*"):
        p.unlink()
    with pytest.warns(UserWarning, match="ok0.png"):
        report = build_store(cfg)
    assert report["images_rejected"] == 3 + 3  # the corpus three + ok0.png once per concept


def test_store_writer_refuses_hostile_bytes_and_reading_a_planted_one_is_a_clear_error(hostile, tmp_path):
    import pyarrow as pa

    from tokenswap.images import BadImageError
    from tokenswap.store import CorruptImageError, StoreWriter
    from tokenswap.store.image_store import SCHEMA, image_id_of

    bomb = hostile.bomb_png(tmp_path / "bomb.png").read_bytes()
    sliver = hostile.sliver_png(tmp_path / "sliver.png").read_bytes()
    with StoreWriter(tmp_path / "store") as w:
        for data in (bomb, sliver, b"not an image"):
            with pytest.raises(BadImageError, match="concept 'cat'"):
                w.add("cat", data, source="test")
    # A shard written by something else (an older build, a tampered file) is refused on read.
    row = {"key": "cat", "concept": "cat", "image_id": image_id_of(bomb), "image": bomb, "source": "planted",
           "score": 1.0, "width": 0, "height": 0, "meta": "{}"}
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, SCHEMA) as writer:
        writer.write_table(pa.Table.from_pylist([row], schema=SCHEMA))
    (tmp_path / "store" / "shards" / "part-r000-000000.arrow").write_bytes(sink.getvalue().to_pybytes())
    (image,) = ImageStore(tmp_path / "store").get("cat")
    with pytest.raises(CorruptImageError, match="decompression bomb"):
        image.load()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["sources=[retrieval]", "retrieval.clip_path=c", "retrieval.corpus=d", "retrieval.top_k=-1"],
         "retrieval: `top_k` must be >= 1, got -1"),
        (["extractor.kind=llm", "extractor.llm.model=m", "extractor.llm.base_url=localhost:8000"],
         "extractor.llm: `base_url` must be an http(s) URL"),
        (["extractor.kind=llm", "extractor.llm.model=m", "extractor.llm.timeout=-1"], "`timeout` must be a finite number of seconds > 0, got -1"),
    ],
    ids=["retrieval-top-k", "llm-base-url", "llm-timeout-negative"],
)
def test_optional_sections_report_their_own_field_problems(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(StoreBuildConfig, "store_embedded.yaml", ["output_dir=/tmp/unused", *overrides])
