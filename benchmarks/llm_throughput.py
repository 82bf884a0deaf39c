"""LLM requests per second of a real ``tokenswap build-store``, at concurrency 1 and at the default.

    python benchmarks/llm_throughput.py        # writes benchmarks/results/llm_throughput.json

Starts its own OpenAI-compatible server on 127.0.0.1 (:class:`tests.support.LoadLLMServer`) that
answers every request after a fixed ``--latency`` and serves at most ``--capacity`` at once (the rest
queue, as a serving engine's full batch does), so the most any client can get is
``capacity / latency`` requests/s. Then runs ``tokenswap build-store --config store_generate.yaml`` on
the packaged Magpie fixture (``data.path=fixture``, ``--rows`` rows, ``sources=[rendered_text]``; the
LLM extractor; that config leaves the judge off) against it, once with ``extractor.llm.concurrency=1``
and once at ``--concurrency`` (default: the config default, 32).

Throughput = HTTP requests / the client's wall time from the first request to the last reply (``llm.extract``
in ``report.json``). The closing line extrapolates to Magpie-Pro-300K at that latency: one extraction request
per row (300,000 rows) plus one judge request per image (116,722 kept samples x 1.75 images), i.e.
``hours = (300000 + 116722 * 1.75) / throughput / 3600``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support import LoadLLMServer, concept_reply  # noqa: E402

MAGPIE_ROWS = 300_000
KEPT_SAMPLES = 116_722
IMAGES_PER_SAMPLE = 1.75


def build(out: Path, base_url: str, rows: int, concurrency: int | None) -> dict:
    cmd = [sys.executable, "-m", "tokenswap.cli", "build-store", "--config", "store_generate.yaml",
           f"output_dir={out}", "data.path=fixture", f"data.max_samples={rows}", "sources=[rendered_text]",
           f"extractor.llm.base_url={base_url}", "progress=false"]
    if concurrency is not None:
        cmd.append(f"extractor.llm.concurrency={concurrency}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"build-store failed (rc={done.returncode}):\n{done.stderr[-3000:]}")
    report = json.loads((out / "report.json").read_text())
    llm = report["llm"]["extract"]
    return {
        "concurrency": concurrency,
        "requests": llm["requests"],
        "cached": llm["cached"],
        "errors": llm["errors"],
        "max_in_flight": llm["max_in_flight"],
        "requests_wall_s": round(llm["wall_s"], 3),
        "extract_stage_s": round(report["time_s"]["extract"], 3),
        "build_total_s": round(report["time_s"]["total"], 3),
        "req_per_s": llm["requests"] / llm["wall_s"],
        "samples_kept": report["samples_kept"],
    }


def main() -> None:
    from tokenswap.store.build_config import LLMConfig

    default = LLMConfig.__dataclass_fields__["concurrency"].default
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300, help="fixture rows (320 at most)")
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per request on the server")
    parser.add_argument("--capacity", type=int, default=32, help="requests the server serves at once")
    parser.add_argument("--concurrency", type=int, default=default, help="the build's concurrency to measure")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "llm_throughput.json"))
    args = parser.parse_args()

    with LoadLLMServer(concept_reply, latency=args.latency, capacity=args.capacity) as server, \
            tempfile.TemporaryDirectory() as tmp:
        one = build(Path(tmp) / "c1", server.base_url, args.rows, 1)
        server.max_in_flight = 0
        many = build(Path(tmp) / "cN", server.base_url, args.rows, None if args.concurrency == default else args.concurrency)
        many["concurrency"] = args.concurrency
        many["server_max_in_flight"] = server.max_in_flight
    if (one["samples_kept"], one["errors"], many["errors"]) != (many["samples_kept"], 0, 0):
        raise SystemExit(f"the two builds disagree or failed requests: {one} vs {many}")
    capacity_rps = args.capacity / args.latency
    x = many["req_per_s"]
    requests_300k = MAGPIE_ROWS + KEPT_SAMPLES * IMAGES_PER_SAMPLE
    hours = requests_300k / x / 3600
    result = {
        "server": {"latency_s": args.latency, "capacity": args.capacity, "capacity_req_per_s": capacity_rps},
        "rows": args.rows,
        "concurrency_1": one,
        "concurrency_n": many,
        "fraction_of_capacity": x / capacity_rps,
        "speedup_vs_concurrency_1": x / one["req_per_s"],
        "extrapolation_300k": {
            "formula": "hours = (300000 + 116722 * 1.75) / req_per_s / 3600",
            "requests": requests_300k,
            "hours": hours,
            "hours_at_concurrency_1": requests_300k / one["req_per_s"] / 3600,
        },
        "target": {"fraction_of_capacity_min": 0.8, "speedup_min": 20},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"concurrency 1: {one['req_per_s']:.1f} req/s ({one['requests']} requests in {one['requests_wall_s']:.1f}s, "
          f"max {one['max_in_flight']} in flight)")
    print(f"concurrency {args.concurrency}: {x:.1f} req/s ({many['requests']} requests in "
          f"{many['requests_wall_s']:.1f}s, max {many['max_in_flight']} in flight); server capacity "
          f"{capacity_rps:.0f} req/s ({args.capacity} at once x {args.latency:g}s)")
    print(f"wrote {out}")
    print(f"llm throughput: {x:.1f} req/s at concurrency {args.concurrency} = {100 * x / capacity_rps:.0f}% of server "
          f"capacity; {x / one['req_per_s']:.1f}x concurrency 1; 300K rows: {hours:.2f} h")


if __name__ == "__main__":
    main()
