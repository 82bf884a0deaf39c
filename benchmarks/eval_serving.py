"""Requests per second of a real ``tokenswap eval --backend openai --forms all``, at concurrency 1 and at the default.

    python benchmarks/eval_serving.py        # writes benchmarks/results/eval_serving.json

Starts its own OpenAI-compatible server on 127.0.0.1 (:class:`tests.support.LoadLLMServer`) that answers
every request after a fixed ``--latency`` and serves at most ``--capacity`` at once (the rest queue, as a
serving engine's full batch does). Then runs ``tokenswap eval --backend openai --forms all`` on a
TokenSwap-Bench-format set of ``--pairs`` pairs (one 56x56 picture each, every picture shown by two items, ten
concepts) against it: per item the five item forms (text, interleaved, both, caption, rendered), per distinct
picture one caption and one recognition item, so ``5 * pairs + 2 * pictures`` requests, each answered once (the
run asserts it, and that every distinct picture was captioned and identified exactly once). It runs once at
``--concurrency`` (default 32, the evaluators' default) and once, on ``--pairs-c1`` pairs, at concurrency 1.

Throughput = requests / the time from the first request's arrival to the last one's answer (arrival + latency),
as the server saw it; the command's whole wall time (process start, imports and bench loading included) is
reported beside it. No client can beat ``min(capacity, concurrency) / latency`` requests/s: with the defaults
(capacity 64, concurrency 32) the limit is the client's own ``--concurrency``, not the server.

The closing line extrapolates to TokenSwap-Bench with ``--forms all`` at that latency: 1,516 items x 5 item forms
plus 2 requests per distinct picture, at most 6,946 pictures (one per swap), so at most 21,472 requests.

It then gives, all from the same concurrency-``--concurrency`` run, what the client itself costs:

* ``client CPU X ms/request``: the eval process's CPU time (user + system, all threads, read from ``/proc`` every
  10 ms) from the first request's arrival to the last answer, over the requests (target: at most 2 ms);
* ``start -> first request X s``: from the process start to the server seeing the first request (imports, bench
  loading, planning); ``last reply -> exit X s``: from the last answer to the process exit (scoring, statistics,
  writing); target: the two together at most 4 s;
* ``N% of a bodies-only client``: the eval's requests/s over that of a client that only posts the very bodies the
  eval sent (pre-built, read from a file; same concurrency, one pooled ``httpx.Client``, its own process) to the
  same server right after (target: at least 98%).

The closing line is one line, read by ``tests/test_benchmarks.py``::

    eval serving: R req/s at concurrency C = P% of the ceiling (L in flight / latency, set by W); Fx concurrency 1;
    TokenSwap-Bench --forms all: M min; client CPU X ms/request, start -> first request S s, last reply -> exit T s,
    B% of a bodies-only client
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support import LoadLLMServer  # noqa: E402

BENCH_REQUESTS = 5 * 1516 + 2 * 6946  # --forms all on TokenSwap-Bench, every swap its own picture (an upper bound)
CONCEPTS = ["cat", "dog", "apple", "car", "tree", "house", "boat", "bird", "fish", "star"]
CAPTION = "Describe this image in a few words."
RECOGNITION = "Which concept does this image show?"


def _bench(root: Path, pairs: int) -> int:
    """Write the bench; returns its number of distinct pictures."""
    from PIL import Image

    from tokenswap.data.tokenswap_bench import write_tokenswap_bench
    from tokenswap.eval.mc import MCItem

    rows = []
    for i in range(pairs):
        k = i // 2  # picture k is shown by items 2k and 2k + 1
        concept = CONCEPTS[k % len(CONCEPTS)]
        choices = ["yes", "no", "maybe", "never"]
        text = MCItem(f"b{i}", "miscellaneous", f"Is the {concept} {i} small?", choices, i % 4)
        inter = MCItem(f"b{i}", "miscellaneous", f"Is the <image 1> {i} small?", choices, i % 4,
                       {1: Image.new("RGB", (56, 56), (k * 37 % 256, k * 11 % 256, 160))})
        rows.append((text, inter))
    write_tokenswap_bench(rows, root)
    return math.ceil(pairs / 2)


def _reply(payload: dict) -> str:
    text = "".join(p.get("text", "") for p in payload["messages"][0]["content"])
    return "A small square." if text.strip() == CAPTION else "Answer: B"


def _kinds(payloads: list[dict]) -> Counter:
    """Requests by kind, and the distinct pictures each picture-level kind was asked about."""
    out: Counter = Counter()
    for payload in payloads:
        content = payload["messages"][0]["content"]
        text = "".join(p.get("text", "") for p in content)
        kind = "caption" if text.strip() == CAPTION else "recognition" if RECOGNITION in text else "item"
        out[kind] += 1
        if kind != "item":
            (url,) = [p["image_url"]["url"] for p in content if p["type"] == "image_url"]
            out[kind, base64.b64decode(url.split(",", 1)[1])] += 1
    return out


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU of a live process, all its threads (``/proc/PID/stat`` fields 14 and 15)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


def _cpu_at(samples: list[tuple[float, float]], when: float) -> float:
    """The sampled CPU seconds at monotonic time ``when`` (the last sample at or before it)."""
    before = [cpu for t, cpu in samples if t <= when]
    return before[-1] if before else samples[0][1]


def _run(bench: Path, out: Path, base_url: str, concurrency: int) -> tuple[float, float, float, list]:
    """``(wall seconds, start monotonic, end monotonic, CPU samples)`` of one ``tokenswap eval`` process."""
    cmd = [sys.executable, "-m", "tokenswap.cli", "eval", "--backend", "openai", "--base-url", base_url,
           "--model", "bench-model", "--bench", str(bench), "--out", str(out), "--concurrency", str(concurrency),
           "--forms", "all"]
    samples: list[tuple[float, float]] = []
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)

    def sample() -> None:
        while proc.poll() is None:
            cpu = _cpu_seconds(proc.pid)
            if cpu is not None:
                samples.append((time.monotonic(), cpu))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, stderr = proc.communicate()
    end = time.monotonic()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"tokenswap eval failed ({proc.returncode}):\n{stderr[-3000:]}")
    return end - start, start, end, samples


# A client that only posts pre-built bodies: what any client's rate is bounded by on this server and machine.
_BODIES_ONLY = """
import sys, httpx
from concurrent.futures import ThreadPoolExecutor
url, path, width = sys.argv[1], sys.argv[2], int(sys.argv[3])
bodies = open(path, "rb").read().split(b"\\n")
headers = {"Content-Type": "application/json", "Accept": "application/json", "Accept-Encoding": "identity"}
with httpx.Client(limits=httpx.Limits(max_connections=width, max_keepalive_connections=width), timeout=60) as client:
    def post(body):
        client.post(url, content=body, headers=headers).raise_for_status()
    with ThreadPoolExecutor(width) as pool:
        list(pool.map(post, bodies))
"""


def _bodies_only(payloads: list[dict], base_url: str, concurrency: int, folder: Path) -> None:
    path = folder / "bodies.jsonl"
    path.write_bytes(b"\n".join(json.dumps(p, ensure_ascii=False).encode() for p in payloads))
    subprocess.run([sys.executable, "-c", _BODIES_ONLY, f"{base_url}/chat/completions", str(path), str(concurrency)],
                   check=True, cwd=REPO)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=200)
    p.add_argument("--pairs-c1", type=int, default=20, help="pairs of the concurrency-1 run (its rate needs few)")
    p.add_argument("--latency", type=float, default=0.2, help="seconds the server takes per request")
    p.add_argument("--capacity", type=int, default=64, help="requests the server serves at once")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "eval_serving.json"))
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp, LoadLLMServer(
        reply=_reply, latency=args.latency, capacity=args.capacity
    ) as server:
        root = Path(tmp)
        walls, spans, counts, client = {}, {}, {}, {}
        for c, pairs in ((1, min(args.pairs_c1, args.pairs)), (args.concurrency, args.pairs)):
            pictures = _bench(root / f"bench{c}", pairs)
            seen, served = len(server.arrivals), len(server.requests)
            walls[c], start, end, samples = _run(root / f"bench{c}", root / f"out{c}", server.base_url, c)
            times = [t for t, _ in server.arrivals[seen:]]
            spans[c] = max(times) + args.latency - min(times)
            first, last = min(times), max(times) + args.latency
            client[c] = {
                "cpu_ms_per_request": 1000 * (_cpu_at(samples, last) - _cpu_at(samples, first)) / len(times),
                "start_to_first_request_s": first - start, "last_reply_to_exit_s": end - last,
            }
            kinds = _kinds(server.requests[served:])
            counts[c] = len(server.requests) - served
            # Each request answered once; each distinct picture captioned once and identified once.
            assert counts[c] == len(times) == 5 * pairs + 2 * pictures, (counts[c], len(times), pairs, pictures)
            assert kinds["item"] == 5 * pairs and kinds["caption"] == kinds["recognition"] == pictures, kinds
            assert all(n == 1 for k, n in kinds.items() if isinstance(k, tuple)), "a picture asked twice"
        # The bodies the concurrency run sent, posted again by a client that does nothing else.
        seen = len(server.arrivals)
        _bodies_only(server.requests[-counts[args.concurrency]:], server.base_url, args.concurrency, root)
        times = [t for t, _ in server.arrivals[seen:]]
        bodies_rate = len(times) / (max(times) + args.latency - min(times))
    rate = {c: counts[c] / s for c, s in spans.items()}
    limit = min(args.capacity, args.concurrency)
    ceiling = limit / args.latency
    limiter = "the client's --concurrency" if args.concurrency <= args.capacity else "the server's capacity"
    result = {
        "forms": "all", "pairs": args.pairs, "pairs_c1": min(args.pairs_c1, args.pairs),
        "requests": {str(c): n for c, n in counts.items()}, "latency_s": args.latency, "capacity": args.capacity,
        "concurrency": args.concurrency, "ceiling_req_per_s": ceiling, "ceiling_set_by": limiter,
        "wall_s": {str(c): round(w, 3) for c, w in walls.items()},
        "request_span_s": {str(c): round(w, 3) for c, w in spans.items()},
        "requests_per_s": {str(c): round(r, 2) for c, r in rate.items()},
        "share_of_ceiling": round(rate[args.concurrency] / ceiling, 3),
        "tokenswap_bench_minutes": round(BENCH_REQUESTS / rate[args.concurrency] / 60, 2),
        "client": {str(c): {k: round(v, 3) for k, v in m.items()} for c, m in client.items()},
        "bodies_only_req_per_s": round(bodies_rate, 2),
        "share_of_bodies_only": round(rate[args.concurrency] / bodies_rate, 3),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"eval serving: {rate[args.concurrency]:.1f} req/s at concurrency {args.concurrency} = "
          f"{100 * rate[args.concurrency] / ceiling:.0f}% of the ceiling ({limit} in flight / latency, set by "
          f"{limiter}); {rate[args.concurrency] / rate[1]:.1f}x concurrency 1; TokenSwap-Bench --forms all: "
          f"{BENCH_REQUESTS / rate[args.concurrency] / 60:.1f} min; client CPU "
          f"{client[args.concurrency]['cpu_ms_per_request']:.2f} ms/request, start -> first request "
          f"{client[args.concurrency]['start_to_first_request_s']:.1f} s, last reply -> exit "
          f"{client[args.concurrency]['last_reply_to_exit_s']:.1f} s, {100 * rate[args.concurrency] / bodies_rate:.0f}% "
          "of a bodies-only client")


if __name__ == "__main__":
    main()
