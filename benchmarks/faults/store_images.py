"""Section ``store_images`` of benchmarks/faults.py: hostile files in a retrieval corpus (decompression bomb, 1x4000
sliver, truncated JPEG, empty file, text named .png): the build completes and names each file.
"""

from __future__ import annotations

import json
from pathlib import Path

from ._common import PY, REPO, Tally, _load, hostile, run

OUTCOME = (
    "build completes; each file rejected by name in report.json (`images_rejected`), never stored"
)


def section_store_images(t: Tally, work: Path) -> None:
    conftest = _load("ts_store_conftest", REPO / "tests/tokenswap/store/conftest.py")
    clip = conftest.build_tiny_clip(work / "tiny-clip")
    corpus = work / "corpus"
    bad = hostile.hostile_files(corpus)
    (corpus / "empty.png").write_bytes(b"")
    (corpus / "notes.png").write_text("this is not an image\n")
    bad += [corpus / "empty.png", corpus / "notes.png"]
    from PIL import Image

    for i, colour in enumerate(["red", "green", "blue", "yellow"]):
        Image.new("RGB", (40, 30), colour).save(corpus / f"ok{i}.png")
    data = work / "corpus-magpie.jsonl"
    rows = ["a cat and a dog", "an apple", "the dog runs", "a red apple and a cat"]
    data.write_text("".join(
        json.dumps({"uuid": f"s{i}", "conversations": [{"from": "human", "value": r}, {"from": "gpt", "value": "ok"}]})
        + "\n" for i, r in enumerate(rows)))
    out = work / "store-hostile"
    proc = run([PY, "-m", "tokenswap.cli", "build-store", f"output_dir={out}", f"data.path={data}",
                "sources=[retrieval]", "extractor.vocabulary=[cat,dog,apple]", f"retrieval.clip_path={clip}",
                f"retrieval.corpus={corpus}", "retrieval.top_k=9", "retrieval.min_score=-1", "progress=false"], 300)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    named = " ".join(r["what"] for r in report.get("rejected_images", []))
    stored = set()
    if (out / "store" / "store.json").exists():
        from tokenswap.store import ImageStore

        stored = {im.meta.get("item") for im in ImageStore(out / "store")}
    for path in bad:
        ok = proc.returncode == 0 and path.name in named and path.name not in stored
        t.add("store_images", f"{path.name} in a retrieval corpus", ok, f"rc={proc.returncode} {proc.stderr[-300:]}")
