"""Items per second of a real ``tokenswap eval --backend openai``, at concurrency 1 and at the default.

    python benchmarks/eval_serving.py        # writes benchmarks/results/eval_serving.json

Starts its own OpenAI-compatible server on 127.0.0.1 (:class:`tokenswap.testing.LoadLLMServer`) that answers
every request after a fixed ``--latency`` and serves at most ``--capacity`` at once (the rest queue, as a
serving engine's full batch does), so no client can get more than ``capacity / latency`` requests/s. Then runs
``tokenswap eval --backend openai`` on a TokenSwap-Bench-format set of ``--pairs`` pairs (two requests per pair:
the text form and the interleaved form, one 56x56 image each) against it, once with ``--concurrency 1`` and
once at ``--concurrency`` (default 32, the evaluators' default). Throughput = requests / the time from the
first request's arrival to the last one's answer (arrival + latency), as the server saw it; the command's
whole wall time (process start, imports and bench loading included) is reported beside it.

The closing line extrapolates to TokenSwap-Bench (1,516 pairs = 3,032 requests) at that latency.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tokenswap.testing import LoadLLMServer  # noqa: E402

BENCH_REQUESTS = 2 * 1516


def _bench(root: Path, pairs: int) -> None:
    from PIL import Image

    from tokenswap.data.tokenswap_bench import write_tokenswap_bench
    from tokenswap.eval.mc import MCItem

    rows = []
    for i in range(pairs):
        text = MCItem(f"b{i}", "miscellaneous", f"Is the cat {i} small?", ["yes", "no", "maybe", "never"], i % 4)
        inter = MCItem(f"b{i}", "miscellaneous", f"Is the <image 1> {i} small?", ["yes", "no", "maybe", "never"],
                       i % 4, {1: Image.new("RGB", (56, 56), (i * 37 % 256, 90, 160))})
        rows.append((text, inter))
    write_tokenswap_bench(rows, root)


def _run(bench: Path, out: Path, base_url: str, concurrency: int) -> float:
    cmd = [sys.executable, "-m", "tokenswap.cli", "eval", "--backend", "openai", "--base-url", base_url,
           "--model", "bench-model", "--bench", str(bench), "--out", str(out), "--concurrency", str(concurrency)]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"tokenswap eval failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=200)
    p.add_argument("--latency", type=float, default=0.2, help="seconds the server takes per request")
    p.add_argument("--capacity", type=int, default=64, help="requests the server serves at once")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "eval_serving.json"))
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp, LoadLLMServer(
        reply=lambda payload: "Answer: B", latency=args.latency, capacity=args.capacity
    ) as server:
        root = Path(tmp)
        _bench(root / "bench", args.pairs)
        walls, spans = {}, {}
        for c in (1, args.concurrency):
            seen = len(server.arrivals)
            walls[c] = _run(root / "bench", root / f"out{c}", server.base_url, c)
            times = [t for t, _ in server.arrivals[seen:]]
            spans[c] = max(times) + args.latency - min(times)
        requests = 2 * args.pairs
        assert len(server.requests) == 2 * requests, "every request answered once per run"
    rate = {c: requests / s for c, s in spans.items()}
    ceiling = min(args.capacity, args.concurrency) / args.latency
    result = {
        "pairs": args.pairs, "requests_per_run": requests, "latency_s": args.latency, "capacity": args.capacity,
        "wall_s": {str(c): round(w, 3) for c, w in walls.items()},
        "request_span_s": {str(c): round(w, 3) for c, w in spans.items()},
        "requests_per_s": {str(c): round(r, 2) for c, r in rate.items()},
        "share_of_ceiling": round(rate[args.concurrency] / ceiling, 3),
        "tokenswap_bench_minutes": round(BENCH_REQUESTS / rate[args.concurrency] / 60, 2),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"eval serving: {rate[args.concurrency]:.1f} req/s at concurrency {args.concurrency} = "
          f"{100 * rate[args.concurrency] / ceiling:.0f}% of the server's ceiling; "
          f"{rate[args.concurrency] / rate[1]:.1f}x concurrency 1; TokenSwap-Bench: "
          f"{BENCH_REQUESTS / rate[args.concurrency] / 60:.1f} min")


if __name__ == "__main__":
    main()
