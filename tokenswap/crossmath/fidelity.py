"""How close our puzzles, records and pictures are to the released CrossMath test set.

``tokenswap crossmath fidelity --released PATH`` prints the statistics of the released set and
of a freshly generated one side by side, the hop solver's agreement with the released
``markdown_answer_step`` labels, and the renderer's pixel parity with the released PNGs. The
released set is read from PATH (a checkout of github ``xuyige/CrossMath`` or its ``data``
folder); nothing of it is shipped here. docs/crossmath_fidelity.md records the facts.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
from PIL import Image

from tokenswap.crossmath.grid import OPERATORS, find_equations, parse_markdown_table
from tokenswap.crossmath.metrics import gold_hops
from tokenswap.crossmath.render import STYLES, StyleName, font_path, render_grid
from tokenswap.crossmath.solver import solve
from tokenswap.errors import InputError

__all__ = [
    "RELEASED_FILES",
    "RELEASED_SHAPE",
    "SHAPE_ROWS",
    "PuzzleStats",
    "fidelity_report",
    "format_shape_table",
    "format_statistics_table",
    "hop_label_agreement",
    "pixel_parity",
    "puzzle_stats",
    "mean_z",
    "proportion_z",
    "record_roundtrip",
    "released_jsonl",
    "released_records",
    "shape_counts",
    "shape_row",
    "summarize",
]

RELEASED_FILES: dict[str, str] = {
    "original": "Original/testset_hr.jsonl",
    "noborder": "Noborder/testset_noborder.jsonl",
    "beige": "Beige/testset_hr_beige.jsonl",
    "altstyle": "Altstyle/testset_altstyle.jsonl",
}
"""The released JSONL of each style, relative to the release's ``data`` folder."""


def released_jsonl(root: str | os.PathLike, style: StyleName) -> Path:
    """The released JSONL of ``style`` under ``root`` (a CrossMath checkout or its ``data`` folder).

    Raises:
        FileNotFoundError: naming the file that was looked for.
    """
    root = Path(root)
    for base in (root, root / "data"):
        path = base / RELEASED_FILES[style]
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"no {RELEASED_FILES[style]} under {str(root)!r} or its data/ folder; pass a checkout of "
        "github.com/xuyige/CrossMath (or its data folder)"
    )


RESTORE = "restore it from a checkout of github.com/xuyige/CrossMath (each style holds 250 puzzles and their images)"


def released_records(root: str | os.PathLike, style: StyleName, pixel_limit: int | None = None) -> list[dict]:
    """The released records of ``style``, each checked to be a whole released record with its picture in place.

    Args:
        root: a CrossMath checkout or its ``data`` folder.
        style: the style.
        pixel_limit: only the first N records need their image (the ones :func:`pixel_parity` compares).

    Returns:
        The records (:func:`~tokenswap.crossmath.data.load_crossmath`).

    Raises:
        FileNotFoundError: the JSONL is missing.
        InputError: the JSONL holds no records, a record that is not a released one (no ``range`` or
            ``difficulty``, a table that does not parse, a hop label that names no hop), or none of the compared
            records has its PNG (a checkout without its images: pixel parity would compare nothing).
    """
    from tokenswap.crossmath.data import load_crossmath
    from tokenswap.crossmath.generator import Puzzle
    from tokenswap.inputs import require_items

    path = released_jsonl(root, style)
    records = load_crossmath(path, fix=RESTORE)
    require_items(records, str(path), "puzzles", RESTORE)
    for index, record in enumerate(records):
        try:
            puzzle_stats(record)
            Puzzle.from_record(record)
        except KeyError as e:
            problem = f"has no {e.args[0]!r}"
        except (TypeError, ValueError) as e:
            problem = f"does not parse ({e})"
        else:
            continue
        raise InputError(f"record {index} of {path} is not a released CrossMath record: it {problem}; {RESTORE}")
    compared = records[:pixel_limit]
    if not any("img_blank" in r and (path.parent / r["img_blank"]).is_file() for r in compared):
        where = path.parent / compared[0]["img_blank"] if "img_blank" in compared[0] else path.parent
        raise InputError(f"none of the {len(compared)} released {STYLES[style].folder} images is there (looked for "
                         f"{str(where)!r}, ...): pixel parity needs the release's PNGs; pass a checkout of "
                         "github.com/xuyige/CrossMath with its image folders")
    return records


@dataclass
class PuzzleStats:
    """The structure of one puzzle, as the fidelity table summarises it.

    Attributes:
        difficulty: the record's label.
        rows: grid rows.
        cols: grid columns.
        equations: number of equations.
        blanks_per_equation: per equation, how many of its three numbers are blanks.
        collapsed: equations going from >= 2 unknowns to 0 in one solver round (never in the release).
        hops: hop of every blank.
        number_range: the record's ``[lo, hi]``.
        largest: the largest number in the solved grid.
        operators: operator cells by glyph.
        blank_positions: blanks at ``a``, ``b`` and ``c`` of their equations (a blank on a crossing counts
            once in each of its two equations).
        filled: non-empty cells.
        crossings: number cells shared by two equations.
        digits: number cells (solved values, each cell once) by digit count, ``[1, 2, 3+]``.
    """

    difficulty: str
    rows: int
    cols: int
    equations: int
    blanks_per_equation: list[int]
    collapsed: int
    hops: list[int]
    number_range: tuple[int, int]
    largest: int
    operators: dict[str, int]
    blank_positions: tuple[int, int, int] = (0, 0, 0)
    filled: int = 0
    crossings: int = 0
    digits: tuple[int, int, int] = (0, 0, 0)


def puzzle_stats(record: dict) -> PuzzleStats:
    """The :class:`PuzzleStats` of a released-format record (ours or the release's)."""
    grid = parse_markdown_table(record["markdown_table"])
    equations = find_equations(grid)
    solution = solve(grid)
    blanks = set(solution.blanks)
    per_eq = [sum(cell in blanks for cell in eq.numbers) for eq in equations]
    # An equation "collapses" when its last two unknowns are solved in the same round elsewhere, so it
    # never has exactly one unknown: the released puzzles never do this.
    collapsed = sum(1 for n, step in zip(per_eq, solution.equation_steps) if n >= 2 and step is None)
    answer = parse_markdown_table(record["markdown_answer"])
    values = [int(v) for row in answer for v in row if v.isdigit()]
    values += [int(v) for row in grid for v in row if v.isdigit()]
    lo, hi = record["range"]
    owners = Counter(cell for eq in equations for cell in eq.numbers)
    solved = {cell: answer[cell[0]][cell[1]] if cell in blanks else grid[cell[0]][cell[1]] for cell in owners}
    lengths = Counter(min(len(v), 3) for v in solved.values())
    return PuzzleStats(
        difficulty=record["difficulty"],
        rows=len(grid),
        cols=len(grid[0]),
        equations=len(equations),
        blanks_per_equation=per_eq,
        collapsed=collapsed,
        hops=gold_hops(record),
        number_range=(int(lo), int(hi)),
        largest=max(values),
        operators=dict(Counter(eq.op for eq in equations)),
        blank_positions=tuple(sum(eq.numbers[k] in blanks for eq in equations) for k in range(3)),
        filled=sum(1 for row in grid for cell in row if cell),
        crossings=sum(1 for n in owners.values() if n > 1),
        digits=(lengths[1], lengths[2], lengths[3]),
    )


def summarize(stats: list[PuzzleStats]) -> dict[str, dict]:
    """Per difficulty (and ``all``): the figures the fidelity table shows.

    Returns:
        ``{difficulty: {"n", "equations_mean", "equations_min", "equations_max", "blanks_mean",
        "blanks_per_equation": {k: count}, "collapsed", "max_rows", "max_cols", "lo_min", "lo_max",
        "hi_min", "hi_max", "largest", "hop_share": {hop: fraction}, "max_hop", "operator_share": {op: fraction}}}``.
    """
    groups: dict[str, list[PuzzleStats]] = {"all": stats}
    for s in stats:
        groups.setdefault(s.difficulty, []).append(s)
    out = {}
    for name, group in groups.items():
        hops = Counter(h for s in group for h in s.hops)
        n_blanks = sum(hops.values())
        out[name] = {
            "n": len(group),
            "equations_mean": float(np.mean([s.equations for s in group])),
            "equations_min": min(s.equations for s in group),
            "equations_max": max(s.equations for s in group),
            "blanks_mean": n_blanks / len(group),
            "blanks_per_equation": dict(sorted(Counter(k for s in group for k in s.blanks_per_equation).items())),
            "collapsed": sum(s.collapsed for s in group),
            "max_rows": max(s.rows for s in group),
            "max_cols": max(s.cols for s in group),
            "lo_min": min(s.number_range[0] for s in group),
            "lo_max": max(s.number_range[0] for s in group),
            "hi_min": min(s.number_range[1] for s in group),
            "hi_max": max(s.number_range[1] for s in group),
            "largest": max(s.largest for s in group),
            "hop_share": {h: hops[h] / n_blanks for h in sorted(hops)},
            "operator_share": {
                op: sum(s.operators.get(op, 0) for s in group) / sum(s.equations for s in group) for op in OPERATORS
            },
            "max_hop": max(hops),
        }
    return out


def _hop_row(summary: dict, hops: range) -> str:
    return " / ".join(f"{100 * summary['hop_share'].get(h, 0.0):.1f}" for h in hops)


def format_statistics_table(ours: dict[str, dict], released: dict[str, dict]) -> str:
    """A markdown table, one row per figure, columns ``released`` and ``ours`` (outputs of :func:`summarize`)."""
    order = [d for d in ("easy", "medium", "hard") if d in ours or d in released]

    def each(summary: dict, key: str, fmt: str = "{}") -> str:
        return " / ".join(fmt.format(summary[d][key]) if d in summary else "-" for d in order)

    def cell(summary: dict) -> list[str]:
        a = summary["all"]
        bpe = a["blanks_per_equation"]
        total_eq = sum(bpe.values())
        return [
            str(a["n"]),
            each(summary, "n"),
            each(summary, "equations_mean", "{:.2f}") + f" ({a['equations_min']}–{a['equations_max']})",
            each(summary, "blanks_mean", "{:.2f}"),
            " / ".join(f"{100 * bpe.get(k, 0) / total_eq:.1f}" for k in range(4)),
            str(a["collapsed"]),
            f"{a['max_rows']}×{a['max_cols']}",
            f"{a['lo_min']}–{a['lo_max']}; {a['hi_min']}–{a['hi_max']}; {a['largest']}",
            _hop_row(a, range(1, 8)) + (f" (+{100 * sum(v for h, v in a['hop_share'].items() if h > 7):.1f} >7)"),
            " / ".join(f"{100 * summary[d]['hop_share'].get(1, 0.0):.1f}" if d in summary else "-" for d in order),
            each(summary, "max_hop"),
            " / ".join(f"{100 * a['operator_share'][op]:.1f}" for op in OPERATORS),
        ]

    labels = [
        "puzzles",
        f"puzzles ({' / '.join(order)})",
        f"equations per puzzle, mean ({' / '.join(order)}) (min–max)",
        f"blanks per puzzle, mean ({' / '.join(order)})",
        "equations with 0 / 1 / 2 / 3 blanks, %",
        "equations going from ≥2 unknowns to 0 in one round",
        "largest grid (rows×cols)",
        "range low end; high end; largest number",
        "blanks at hop 1 / 2 / … / 7, %",
        f"hop-1 share, % ({' / '.join(order)})",
        f"max hop ({' / '.join(order)})",
        "operators + / - / × / ÷, %",
    ]
    lines = ["| | released | ours |", "|---|---|---|"]
    for label, r, o in zip(labels, cell(released), cell(ours)):
        lines.append(f"| {label} | {r} | {o} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Shape: the figures issue 20 measured (blank position, grid size and density, digits, operators per
# difficulty), with the counts a two-sample z needs.

SHAPE_GROUPS = ("all", "easy", "medium", "hard")


def shape_counts(stats: list[PuzzleStats]) -> dict[str, dict]:
    """Per difficulty and ``all``: the counts and moments behind the shape rows of the report.

    Returns:
        ``{group: {"n": puzzles, "blank_position": [a, b, c], "digits": [1, 2, 3+], "operators": [+, -, ×, ÷],
        "<share key>_se": [standard error of each share], "rows" / "cols" / "density" / "crossings": [mean,
        sample std], "rows_min": int, "five_rows": puzzles only 5 rows tall}}``; counts are cells (equation
        slots for blank positions), means are over puzzles. A share's standard error treats the puzzle as the
        unit sampled (its cells share one number range and layout), the ratio estimator's
        ``sqrt(n / (n - 1) * sum_i (x_i - p * m_i)^2) / sum_i m_i``.
    """
    groups: dict[str, list[PuzzleStats]] = {"all": list(stats)}
    for s in stats:
        groups.setdefault(s.difficulty, []).append(s)
    out = {}
    for name, group in groups.items():

        def moments(values: list[float]) -> list[float]:
            return [float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0]

        shares = {
            "blank_position": np.array([s.blank_positions for s in group], float),
            "digits": np.array([s.digits for s in group], float),
            "operators": np.array([[s.operators.get(op, 0) for op in OPERATORS] for s in group], float),
        }
        out[name] = {"n": len(group)}
        for key, counts in shares.items():
            totals, n = counts.sum(1), len(group)
            share = counts.sum(0) / totals.sum()
            spread = ((counts - share * totals[:, None]) ** 2).sum(0) * n / max(n - 1, 1)
            out[name][key] = [int(x) for x in counts.sum(0)]
            out[name][f"{key}_se"] = [round(float(x), 5) for x in np.sqrt(spread) / totals.sum()]
        out[name] |= {
            "rows": moments([s.rows for s in group]),
            "cols": moments([s.cols for s in group]),
            "density": moments([s.filled / (s.rows * s.cols) for s in group]),
            "crossings": moments([s.crossings for s in group]),
            "rows_min": min(s.rows for s in group),
            "five_rows": sum(s.rows == 5 for s in group),
        }
    return out


def _released_shape() -> dict[str, dict]:
    path = resources.files("tokenswap") / "assets" / "crossmath" / "released_shape.json"
    return json.loads(path.read_bytes())["shape_counts"]


RELEASED_SHAPE: dict[str, dict] = _released_shape()
"""``shape_counts`` of the released test set (github ``xuyige/CrossMath`` 0e8bef7, Original file, 250 puzzles),
so that tests and the report can compare without the release at hand; kept as data in
``tokenswap/assets/crossmath/released_shape.json``."""


def proportion_z(x1: int, n1: int, x2: int, n2: int) -> float:
    """Two-sample z of ``x1/n1`` against ``x2/n2`` (pooled binomial standard error; 0.0 when both are 0 or 1).

    For independent units (puzzles); shares of cells use the puzzle-level standard errors of :func:`shape_counts`.

    >>> round(proportion_z(40, 100, 50, 100), 2)
    -1.42
    """
    pooled = (x1 + x2) / (n1 + n2)
    se = (pooled * (1 - pooled) * (1 / n1 + 1 / n2)) ** 0.5
    return (x1 / n1 - x2 / n2) / se if se else 0.0


def mean_z(moments1: list[float], n1: int, moments2: list[float], n2: int) -> float:
    """Welch z of two means from ``[mean, sample std]`` and sizes (0.0 when both spreads are 0)."""
    se = (moments1[1] ** 2 / n1 + moments2[1] ** 2 / n2) ** 0.5
    return (moments1[0] - moments2[0]) / se if se else 0.0


SHAPE_ROWS: tuple[tuple[str, str, str], ...] = (
    *((f"blank at a / b / c, % ({g})", "blank_position", g) for g in SHAPE_GROUPS),
    *((f"grid rows, mean ({g})", "rows", g) for g in SHAPE_GROUPS),
    *((f"grid columns, mean ({g})", "cols", g) for g in SHAPE_GROUPS),
    *((f"cells filled, share ({g})", "density", g) for g in SHAPE_GROUPS),
    *((f"crossings per puzzle, mean ({g})", "crossings", g) for g in SHAPE_GROUPS),
    *((f"grids only 5 rows tall, % ({g})", "five_rows", g) for g in SHAPE_GROUPS),
    *((f"numbers with 1 / 2 / 3 digits, % ({g})", "digits", g) for g in SHAPE_GROUPS),
    *((f"operators + / - / × / ÷, % ({g})", "operators", g) for g in SHAPE_GROUPS),
)
"""The shape rows of the report: ``(label, key of shape_counts, group)``."""


def shape_row(ours: dict[str, dict], released: dict[str, dict], key: str, group: str) -> tuple[str, str, float]:
    """``(released figure, our figure, largest |z| of its parts)`` for one row of :data:`SHAPE_ROWS`."""
    r, o = released[group], ours[group]
    if key in ("rows", "cols", "density", "crossings"):
        fmt = "{:.3f}" if key == "density" else "{:.2f}"
        return fmt.format(r[key][0]), fmt.format(o[key][0]), abs(mean_z(o[key], o["n"], r[key], r["n"]))
    if key == "five_rows":
        z = abs(proportion_z(o[key], o["n"], r[key], r["n"]))
        return f"{100 * r[key] / r['n']:.1f} ({r[key]})", f"{100 * o[key] / o['n']:.1f} ({o[key]})", z
    total_r, total_o = sum(r[key]), sum(o[key])
    z = max(
        abs(x_o / total_o - x_r / total_r) / math.hypot(se_o, se_r) if se_o or se_r else 0.0
        for x_o, x_r, se_o, se_r in zip(o[key], r[key], o[f"{key}_se"], r[f"{key}_se"])
    )
    show = (
        " / ".join(f"{100 * x / total_r:.1f}" for x in r[key]),
        " / ".join(f"{100 * x / total_o:.1f}" for x in o[key]),
    )
    return *show, z


def format_shape_table(ours: dict[str, dict], released: dict[str, dict]) -> str:
    """A markdown table of :data:`SHAPE_ROWS`: released, ours, and the largest two-sample ``|z|`` of each row.

    Args:
        ours: :func:`shape_counts` of our puzzles.
        released: :func:`shape_counts` of the release (or :data:`RELEASED_SHAPE`).

    Returns:
        The table; a row is left out where either side has no puzzle of its difficulty.
    """
    lines = ["| | released | ours | max abs z |", "|---|---|---|---|"]
    for label, key, group in SHAPE_ROWS:
        if group in ours and group in released:
            r, o, z = shape_row(ours, released, key, group)
            lines.append(f"| {label} | {r} | {o} | {z:.1f} |")
    return "\n".join(lines)


def hop_label_agreement(records: list[dict]) -> tuple[int, int]:
    """``(agreeing, total)`` blanks whose solver hop equals the record's ``markdown_answer_step`` label."""
    agree = total = 0
    for record in records:
        solution = solve(parse_markdown_table(record["markdown_table"]))
        labels = gold_hops(record)
        total += len(labels)
        got = [solution.hops.get(cell) for cell in solution.blanks]
        agree += sum(a == b for a, b in zip(got, labels))
    return agree, total


def record_roundtrip(path: str | os.PathLike, style: StyleName) -> tuple[int, int]:
    """``(identical, total)``: released JSONL lines that :class:`Puzzle` reads and writes back byte for byte."""
    from tokenswap.crossmath.generator import Puzzle

    lines = [line for line in Path(path).read_text(encoding="utf-8").split("\n") if line.strip()]
    same = sum(
        json.dumps(Puzzle.from_record(json.loads(line)).to_record(style), ensure_ascii=False) == line for line in lines
    )
    return same, len(lines)


def pixel_parity(records: list[dict], root: str | os.PathLike, style: StyleName, tolerance: int = 8) -> list[float]:
    """Per record, the share of pixels of our rendering within ``tolerance`` (every channel) of the released PNG.

    Args:
        records: released records of ``style`` (their ``img_blank`` relative to ``root``).
        root: the folder the records' ``img_blank`` paths are relative to (the style folder).
        style: the style to render.
        tolerance: the largest per-channel difference that still counts as equal.

    Returns:
        One fraction per record whose PNG exists; 0.0 where the image sizes differ.
    """
    out = []
    for record in records:
        if "img_blank" not in record or not (Path(root) / record["img_blank"]).is_file():
            continue  # the report shows how many were compared
        try:
            with Image.open(Path(root) / record["img_blank"]) as image:
                ref = np.asarray(image.convert("RGB"), dtype=np.int16)
        except (OSError, Image.DecompressionBombError) as e:  # a cut or overwritten PNG
            raise InputError(f"released image {str(Path(root) / record['img_blank'])!r} does not decode ({e}); restore "
                             "it from github.com/xuyige/CrossMath") from None
        # As written: the release drew puzzle 0043's "x" cells as numbers, not as × operators.
        grid = parse_markdown_table(record["markdown_table"], normalize=False)
        ours = np.asarray(render_grid(grid, style), dtype=np.int16)
        out.append(float((np.abs(ref - ours).max(-1) <= tolerance).mean()) if ref.shape == ours.shape else 0.0)
    return out


def fidelity_report(
    released: str | os.PathLike, n: int = 250, seed: int = 0, pixel_limit: int | None = None, tolerance: int = 8
) -> str:
    """The markdown report ``tokenswap crossmath fidelity`` prints.

    Args:
        released: a checkout of github ``xuyige/CrossMath`` or its ``data`` folder.
        n: puzzles to generate (``"mixed"`` difficulty, default arguments) for the statistics.
        seed: the generator seed.
        pixel_limit: compare only the first N released images per style (None: all 250).
        tolerance: per-channel difference that still counts as the same pixel.

    Returns:
        The statistics table (released vs ours), the shape table (released vs ``n`` puzzles of each difficulty,
        with the two-sample ``|z|`` of each row), the hop-label agreement and the pixel parity per style.

    Raises:
        FileNotFoundError: if a released JSONL is missing.
        InputError: see :func:`released_records`; found before anything is generated or drawn.
    """
    from tokenswap.crossmath.generator import DIFFICULTIES, generate_puzzles

    by_style = {style: released_records(released, style, pixel_limit) for style in STYLES}
    released_stats = [puzzle_stats(r) for r in by_style["original"]]
    ours = summarize([puzzle_stats(p.to_record()) for p in generate_puzzles(n, seed)])
    per_level = [puzzle_stats(p.to_record()) for level in DIFFICULTIES for p in generate_puzzles(n, seed, level)]
    lines = [
        f"## Statistics: released ({len(by_style['original'])} puzzles) vs ours ({n} puzzles, "
        f"`generate --difficulty mixed --seed {seed}`)",
        "",
        format_statistics_table(ours, summarize(released_stats)),
        "",
        f"## Shape: released vs ours ({n} puzzles of each difficulty, seed {seed})",
        "",
        "max abs z: the largest two-sample z of the parts of a row, with the puzzle as the sampled unit (a",
        "puzzle's cells share one number range and layout): ratio-estimator standard errors for shares, Welch",
        "for means, binomial over puzzles for 5-row grids. |z| <= 3 is within sampling error.",
        "",
        format_shape_table(shape_counts(per_level), shape_counts(released_stats)),
        "",
        "## Hop solver vs released markdown_answer_step",
        "",
    ]
    for style, records in by_style.items():
        agree, total = hop_label_agreement(records)
        lines.append(f"- {STYLES[style].folder}: {agree}/{total} blanks")
    lines += ["", "## Released records read and written back byte for byte", ""]
    for style in by_style:
        same, total = record_roundtrip(released_jsonl(released, style), style)
        lines.append(f"- {STYLES[style].folder}: {same}/{total} lines")
    lines += [
        "",
        f"## Pixel parity (share of pixels within {tolerance} of the released PNG, every channel)",
        "",
        "| style | font | puzzles | mean | min | puzzles >= 0.99 |",
        "|---|---|---|---|---|---|",
    ]
    for style, records in by_style.items():
        records = records[:pixel_limit]
        scores = pixel_parity(records, released_jsonl(released, style).parent, style, tolerance)
        font = font_path(style)
        lines.append(
            f"| {STYLES[style].folder} | {font.name if font else 'Pillow default'} | {len(scores)} | "
            f"{np.mean(scores):.4f} | {min(scores):.4f} | {sum(s >= 0.99 for s in scores)} |"
        )
    return "\n".join(lines)
