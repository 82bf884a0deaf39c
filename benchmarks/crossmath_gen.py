"""CrossMath generator throughput: valid puzzles per second by difficulty and canvas size.

Every puzzle counted passed the generator's own acceptance (all equations hold, the hop solver
determines every blank, the difficulty label is right); rejected drafts are part of the cost.
Rendering one style (PNG encoding excluded) is timed on the same puzzles.

    .venv/bin/python benchmarks/crossmath_gen.py            # 200 puzzles per cell
    .venv/bin/python benchmarks/crossmath_gen.py --n 50

Prints a markdown table and writes benchmarks/results/crossmath_gen.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from tokenswap.crossmath import DIFFICULTIES, generate_puzzle, render_grid

# (label, rows, cols, n_equations); None draws 5-15 equations per puzzle as released, the default.
SIZES = [
    ("9x9, 5 eq", 9, 9, 5),
    ("17x21, 5-15 eq (default)", 17, 21, None),
    ("17x21, 14 eq", 17, 21, 14),
]


def bench_cell(difficulty: str, rows: int, cols: int, n_equations: int | None, n: int, seed: int) -> dict:
    start = time.perf_counter()
    puzzles = [
        generate_puzzle(seed + i, difficulty=difficulty, rows=rows, cols=cols, n_equations=n_equations)
        for i in range(n)
    ]
    gen_s = time.perf_counter() - start
    start = time.perf_counter()
    for puzzle in puzzles:
        render_grid(puzzle.grid, "original")
    render_s = time.perf_counter() - start
    return {
        "difficulty": difficulty,
        "rows": rows,
        "cols": cols,
        "n_equations": n_equations,
        "n": n,
        "puzzles_per_s": n / gen_s,
        "renders_per_s": n / render_s,
        "mean_blanks": statistics.fmean(len(p.answer) for p in puzzles),
        "mean_max_hop": statistics.fmean(max(p.hops) for p in puzzles),
        "mean_image_px": statistics.fmean(55 * p.rows * 55 * p.cols for p in puzzles),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=200, help="puzzles per (difficulty, size) cell")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "crossmath_gen.json"))
    args = parser.parse_args()

    results = []
    print("| size | difficulty | puzzles/s | renders/s | blanks | max hop |")
    print("|---|---|---|---|---|---|")
    for label, rows, cols, n_equations in SIZES:
        for difficulty in DIFFICULTIES:
            row = bench_cell(difficulty, rows, cols, n_equations, args.n, args.seed) | {"size": label}
            results.append(row)
            print(
                f"| {label} | {difficulty} | {row['puzzles_per_s']:.0f} | {row['renders_per_s']:.0f} | "
                f"{row['mean_blanks']:.1f} | {row['mean_max_hop']:.1f} |",
                flush=True,
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"python": platform.python_version(), "machine": platform.machine(), "processor": platform.processor()}
    out.write_text(json.dumps({"benchmark": "crossmath_gen", "meta": meta, "results": results}, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
