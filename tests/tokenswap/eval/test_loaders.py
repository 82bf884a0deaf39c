"""MMLU and TokenSwap-Bench loaders on local parquet files written in the hub schemas."""

from __future__ import annotations

import pytest
from datasets import ClassLabel, Dataset, Features, Image, Sequence, Value
from PIL import Image as PILImage

from tokenswap.data.mmlu import load_mmlu, mmlu_shots
from tokenswap.data.tokenswap_bench import load_tokenswap_bench, load_tokenswap_bench_pairs

MMLU_FEATURES = Features(
    {
        "question": Value("string"),
        "subject": Value("string"),
        "choices": Sequence(Value("string")),
        "answer": ClassLabel(names=["A", "B", "C", "D"]),
    }
)


def _write(ds: Dataset, path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.to_parquet(str(path))


def test_mmlu_local_hub_layout(tmp_path):
    rows = [
        {"question": f"Q{i}?", "subject": "anatomy", "choices": ["a", "b", "c", "d"], "answer": i % 4}
        for i in range(6)
    ]
    ds = Dataset.from_list(rows, features=MMLU_FEATURES)
    _write(ds, tmp_path / "all" / "test-00000-of-00001.parquet")
    _write(ds.select(range(5)), tmp_path / "all" / "dev-00000-of-00001.parquet")
    _write(ds.select(range(2)), tmp_path / "all" / "validation-00000-of-00001.parquet")
    items = load_mmlu(tmp_path, "all", "test")
    assert [it.answer for it in items] == [0, 1, 2, 3, 0, 1]
    assert items[0].id == "anatomy/test/0" and items[0].choices == ["a", "b", "c", "d"]
    assert len(load_mmlu(tmp_path, "all", "test", limit=3)) == 3
    # `dev` is read as dev, not silently as `validation`.
    assert len(load_mmlu(tmp_path, "all", "dev")) == 5
    assert len(load_mmlu(tmp_path, "all", "validation")) == 2
    assert [i.question for i in mmlu_shots(tmp_path)["anatomy"]] == [f"Q{i}?" for i in range(5)]
    with pytest.raises(FileNotFoundError, match="astronomy/test"):
        load_mmlu(tmp_path, "astronomy", "test")


def _bench(tmp_path):
    red, blue = PILImage.new("RGB", (16, 16), "red"), PILImage.new("RGB", (16, 16), "blue")
    text_rows = [
        {
            "subject": "college_biology",
            "question": "Is a cat a mammal?",
            "choices": ["yes", "no", "cat", "dog"],
            "answer": 0,
        },
        {
            "subject": "astronomy",
            "question": "Which is hotter?",
            "choices": ["sun", "moon", "ice", "snow"],
            "answer": 0,
        },
    ]
    img_rows = [
        {
            "subject": "college_biology",
            "question": "Is a <image 1> a mammal?",
            "choices": ["yes", "no", "<image 1>", "<image 2>"],
            "answer": 0,
            "image_1": red,
            "image_2": blue,
        },
        {
            "subject": "astronomy",
            "question": "Which is hotter?",
            "choices": ["<image 1>", "moon", "ice", "snow"],
            "answer": 0,
            "image_1": blue,
            "image_2": None,
        },
    ]
    base = {"subject": Value("string"), "question": Value("string"), "choices": Sequence(Value("string"))}
    base["answer"] = Value("int64")
    _write(Dataset.from_list(text_rows, features=Features(base)), tmp_path / "text" / "test-00000-of-00001.parquet")
    img_features = Features({**base, "image_1": Image(), "image_2": Image()})
    _write(Dataset.from_list(img_rows, features=img_features), tmp_path / "img" / "test-00000-of-00001.parquet")
    return tmp_path


def test_tokenswap_bench_local(tmp_path):
    root = _bench(tmp_path)
    img = load_tokenswap_bench(root, "img")
    assert img[0].question == "Is a <image 1> a mammal?" and sorted(img[0].images) == [1, 2]
    assert img[0].images[1].convert("RGB").getpixel((0, 0)) == (255, 0, 0)
    assert sorted(img[1].images) == [1] and img[1].num_images == 1
    pairs = load_tokenswap_bench_pairs(root)
    assert [(t.id, i.id) for t, i in pairs] == [("test/0", "test/0"), ("test/1", "test/1")]
    assert pairs[0][1].concepts == {1: "cat", 2: "dog"} and pairs[1][1].concepts == {1: "sun"}
    assert pairs[0][0].images == {}


def test_tokenswap_bench_missing_image_column(tmp_path):
    base = {"subject": Value("string"), "question": Value("string"), "choices": Sequence(Value("string"))}
    base["answer"] = Value("int64")
    row = {"subject": "s", "question": "a <image 2>", "choices": list("abcd"), "answer": 1, "image_1": None}
    _write(
        Dataset.from_list([row], features=Features({**base, "image_1": Image()})),
        tmp_path / "img" / "test-00000-of-00001.parquet",
    )
    with pytest.raises(KeyError, match="row 0: tag <image 2> needs a non-empty column image_2"):
        load_tokenswap_bench(tmp_path, "img")


def test_write_tokenswap_bench_with_non_contiguous_tags(tmp_path):
    """An item showing <image 1> and <image 3> (no <image 2>) round-trips: columns go up to image_3."""
    import io

    from PIL import Image as PILImage

    from tokenswap.data.tokenswap_bench import load_tokenswap_bench_pairs, write_tokenswap_bench
    from tokenswap.eval.mc import MCItem, as_rgb

    def png(color: str) -> bytes:
        buf = io.BytesIO()
        PILImage.new("RGB", (8, 8), color).save(buf, format="PNG")
        return buf.getvalue()

    text = MCItem("q0", "s", "Is a cat near a dog?", ["cat", "b", "dog", "d"], 2)
    inter = MCItem("q0", "s", "Is a <image 1> near a <image 3>?", ["<image 1>", "b", "<image 3>", "d"], 2,
                   images={1: png("red"), 3: png("blue")})
    plain = MCItem("q1", "s", "Is a <image 1> red?", list("abcd"), 0, images={1: png("green")})
    write_tokenswap_bench([(text, inter), (MCItem("q1", "s", "Is a cow red?", list("abcd"), 0), plain)],
                          tmp_path / "bench")
    (t0, i0), (_, i1) = load_tokenswap_bench_pairs(str(tmp_path / "bench"))
    assert sorted(i0.images) == [1, 3] and i0.num_images == 2 and i1.num_images == 1
    assert as_rgb(i0.images[3]).getpixel((0, 0)) == (0, 0, 255)
    assert i0.concepts == {1: "cat", 3: "dog"} and t0.question == text.question


def _via_datasets(root, config):
    """The same folder read through `datasets` (its README declares the layout, as a hub copy's does)."""
    import shutil

    copy = root.parent / f"{root.name}-declared"
    if not copy.exists():
        shutil.copytree(root, copy)
        for config_dir in ("text", "img"):  # out of the hub layout's file names: only the README finds them
            for f in (copy / config_dir).glob("*.parquet"):
                f.rename(f.with_name(f.name.replace("test-", "part-")))
        (copy / "README.md").write_text(
            "---\nconfigs:\n- config_name: text\n  data_files:\n  - split: test\n    path: text/part-*.parquet\n"
            "- config_name: img\n  data_files:\n  - split: test\n    path: img/part-*.parquet\n---\n")
    return load_tokenswap_bench(copy, config)


@pytest.mark.integration
def test_a_bench_folder_reads_without_datasets_and_gives_what_datasets_gives(tmp_path):
    import subprocess
    import sys

    root = _bench(tmp_path / "bench")
    for config in ("text", "img"):
        fast, slow = load_tokenswap_bench(root, config), _via_datasets(root, config)
        assert [(i.id, i.subject, i.question, i.choices, i.answer, sorted(i.images)) for i in fast] == \
            [(i.id, i.subject, i.question, i.choices, i.answer, sorted(i.images)) for i in slow]
        for a, b in zip(fast, slow):
            assert all(a.images[k].mode == b.images[k].mode and a.images[k].tobytes() == b.images[k].tobytes()
                       for k in a.images)
    # `tokenswap eval` reading a local bench: no `datasets` import (seconds of a command's start).
    probe = ("import sys; from tokenswap.data.tokenswap_bench import load_tokenswap_bench_pairs; "
             f"pairs = load_tokenswap_bench_pairs({str(root)!r}); print(len(pairs), 'datasets' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["2", "False"], done.stderr[-2000:]
