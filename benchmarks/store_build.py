"""Store build overhead beyond the image sources' own time, and ImageStore.get lookups per second.

    python benchmarks/store_build.py            # writes benchmarks/results/store_build.json

Three measurements, in one run:

1. ``embedded``: the offline build of ``store_embedded.yaml`` (OpenMoji + rendered text over the
   320-row fixture). Its sources cost ~5 ms per concept, so every millisecond of bookkeeping shows.
2. ``slow_source``: the same build with each source call padded by ``--source-ms`` per concept
   (default 50 ms, about one step-distilled diffusion image on a GPU). The padding counts as source
   time, so this is the overhead ratio a real generation/retrieval build would see. Target <= 5%.
3. ``lookup``: ``ImageStore.get`` on random keys of the built store (normalization included).

Overhead = total build time - time inside ``images_for`` of the sources (the report's ``overhead_s``):
sample streaming, extraction, PNG encoding, Arrow shards, fsyncs, dataset shards and the report.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from tokenswap.store import ImageStore
from tokenswap.store import builders as build_mod
from tokenswap.store.build import build_store, embedded_config


class _Padded:
    """Wraps a source so each call costs ``ms`` more per concept (simulating a slower model)."""

    def __init__(self, source, ms: float):
        self.source, self.ms = source, ms

    def __getattr__(self, name):  # name, info, rejected, ...: whatever the build reads from a source
        return getattr(self.source, name)

    def images_for(self, concepts):
        time.sleep(self.ms * len(concepts) / 1000)
        return self.source.images_for(concepts)


def _run(root: Path, pad_ms: float | None) -> dict:
    builders = dict(build_mod.SOURCE_BUILDERS)
    if pad_ms is not None:
        for name, make in builders.items():
            build_mod.SOURCE_BUILDERS[name] = lambda cfg, state, make=make: _Padded(make(cfg, state), pad_ms)
    try:
        report = build_store(embedded_config(root))
    finally:
        build_mod.SOURCE_BUILDERS.update(builders)
    total, source = report["time_s"]["total"], report["source_s"]
    overhead = total - source
    return {
        "total_s": round(total, 4),
        "source_s": round(source, 4),
        "overhead_s": round(overhead, 4),
        "overhead_vs_source": round(overhead / source, 4),
        "overhead_frac_of_total": round(overhead / total, 4),
        "overhead_ms_per_sample": round(1000 * overhead / report["samples_read"], 3),
        "overhead_ms_per_concept": round(1000 * overhead / report["concepts_found"], 3),
        "stages_s": {k: round(v, 4) for k, v in report["time_s"].items()},
        "samples": report["samples_read"],
        "concepts": report["concepts_found"],
        "images": report["store_images"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source-ms", type=float, default=50.0, help="padding per concept for the slow-source run")
    parser.add_argument("--lookups", type=int, default=200_000)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "store_build.json"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        _run(Path(tmp) / "warmup", None)  # imports, font and SVG file caches
        embedded = _run(Path(tmp) / "embedded", None)
        slow = _run(Path(tmp) / "slow", args.source_ms)
        store = ImageStore(Path(tmp) / "embedded" / "store")
        keys = store.keys()
        rng = random.Random(0)
        # Mixed-case, article-prefixed queries exercise normalize_concept as the collator's lookups do.
        queries = [rng.choice(["", "the ", "A "]) + rng.choice(keys).title() for _ in range(args.lookups)]
        t0 = time.perf_counter()
        hits = sum(1 for q in queries if store.get(q))
        lookup_s = time.perf_counter() - t0
        raw = [rng.choice(keys) for _ in range(args.lookups)]
        t0 = time.perf_counter()
        for q in raw:
            store.get(q)
        raw_s = time.perf_counter() - t0

    result = {
        "embedded": embedded,
        "slow_source": {"source_ms_per_concept": args.source_ms, **slow},
        "lookup": {
            "lookups": args.lookups,
            "hit_rate": hits / args.lookups,
            "lookups_per_s": round(args.lookups / lookup_s),
            "normalized_key_lookups_per_s": round(args.lookups / raw_s),
        },
        "target": {"overhead_vs_source_max": 0.05, "met_with_slow_source": slow["overhead_vs_source"] <= 0.05},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(
        f"embedded build: total {embedded['total_s']:.2f}s, sources {embedded['source_s']:.2f}s, "
        f"overhead {embedded['overhead_s']:.2f}s = {embedded['overhead_vs_source']:.1%} of source time "
        f"({embedded['overhead_ms_per_concept']:.1f} ms/concept, {embedded['overhead_ms_per_sample']:.2f} ms/sample)"
    )
    print(
        f"slow source ({args.source_ms:.0f} ms/concept): total {slow['total_s']:.2f}s, overhead {slow['overhead_s']:.2f}s "
        f"= {slow['overhead_vs_source']:.1%} of source time (target <= 5%)"
    )
    print(
        f"ImageStore.get: {result['lookup']['lookups_per_s']:,} lookups/s (raw text queries), "
        f"{result['lookup']['normalized_key_lookups_per_s']:,} lookups/s (already-normalized keys)"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
