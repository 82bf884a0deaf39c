"""The figures of ``tokenswap leaderboard``, drawn from the board :func:`~tokenswap.eval.leaderboard.build_leaderboard`
returns.

* ``leaderboard.png`` (:func:`plot_gaps`): the gap per model as horizontal bars with interval whiskers and a marker at
  each gap (a zero gap has no bar to see), largest gap on top; on the right of each bar its counts (n scored,
  skipped, failed).
* ``leaderboard_by_images.png`` (:func:`plot_by_images`): the gap by number of images sent, one line per model
  with interval whiskers (models dodged sideways so their whiskers do not hide each other).
* ``leaderboard_components.png`` (:func:`plot_components`): per model its gap split into load / recognition /
  rest as one stacked bar from 0 (a negative part drawn left of 0, stacked apart from the positive ones), the
  gap itself as a black diamond with its interval; the parts add up to the diamond.

Each ``draw_*`` function draws on a given axes (tests read the artists back); each ``plot_*`` makes the figure,
saves it and returns what it drew, read back from the axes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tokenswap.files import atomic_write_figure

__all__ = ["PARTS", "draw_by_images", "draw_components", "draw_gaps", "plot_by_images", "plot_components",
           "plot_gaps"]

# The split of a gap, in stacking order, with its colour and legend text.
PARTS = {
    "load": ("#dd8452", "load: text − both (showing the pictures, every word kept)"),
    "recognition": ("#c44e52", "recognition: added by items with an unidentified picture"),
    "rest": ("#4c72b0", "rest: left on items whose pictures were all identified"),
}
_BAR = "#4c72b0"


def _plain(text) -> str:
    """Text matplotlib draws as it is: escapes for unprintable characters, ``$`` not read as mathtext."""
    text = str(text).encode("utf-8", "backslashreplace").decode("utf-8")
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return text.replace("$", r"\$")


def _counts(r: dict) -> str:
    words = [f"n {r['n']}", f"skipped {r['skipped']}", f"failed {r['failed']}"]
    if r.get("unpaired"):
        words.append(f"unpaired {r['unpaired']}")
    return ", ".join(words)


def _room(ax, values: np.ndarray) -> None:
    # Bars are sticky at 0, so matplotlib leaves no margin there and a marker at 0 (a zero gap) sits on the spine.
    lo, hi = min(0.0, float(np.min(values))), max(0.0, float(np.max(values)))
    pad = 0.05 * ((hi - lo) or 1.0)
    ax.set_xlim(lo - pad, hi + pad)


def _figure(**kw):
    """A figure of its own (the object API): no pyplot state, no backend switched for the caller."""
    from matplotlib.figure import Figure

    return Figure(**kw)


def _whiskers(gaps: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> list[np.ndarray]:
    """``errorbar``'s ``xerr`` for intervals ``[lo, hi]`` around ``gaps``. A percentile interval need not hold its
    point (always so with a handful of resamples, ``--resamples 1``): its near whisker is then drawn as zero instead of
    a negative length matplotlib refuses; the interval itself stays in the table and the JSON."""
    return [np.clip(gaps - lo, 0, None), np.clip(hi - gaps, 0, None)]


def draw_gaps(ax, board: dict) -> None:
    """Bars of the gap (%) per model, whiskers, a diamond at each gap, counts on a right-hand axis."""
    from matplotlib import colormaps
    from matplotlib.patches import Patch

    rows = board["rows"]
    tags = list(board["groups"])
    colors = dict(zip(tags, colormaps["tab10"].colors))
    ys = np.arange(len(rows))[::-1]  # row 0 (largest gap) at the top
    gaps = np.array([100 * r["gap"] for r in rows])
    lo = np.array([100 * r["gap_ci"][0] for r in rows])
    hi = np.array([100 * r["gap_ci"][1] for r in rows])
    ax.barh(ys, gaps, color=[colors.get(r["group"], _BAR) for r in rows], height=0.7)
    ax.errorbar(gaps, ys, xerr=_whiskers(gaps, lo, hi), fmt="none", ecolor="black", capsize=2, linewidth=0.8)
    ax.plot(gaps, ys, linestyle="none", marker="D", markersize=4, color="black", zorder=3)
    _room(ax, np.r_[lo, hi, gaps])
    ax.set_yticks(ys, [_plain(r["label"]) for r in rows], fontsize=8)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.axvline(0, color="black", linewidth=0.6)
    ax.set_xlabel(f"modality gap: acc {board['forms'][0]} − acc {board['forms'][1]} (%), 95% paired-bootstrap CI")
    ax.set_title(f"{board['title']}: modality gap per model")
    ax.grid(axis="x", alpha=0.3)
    counts = ax.twinx()
    counts.set_ylim(ax.get_ylim())
    counts.set_yticks(ys, [_counts(r) for r in rows], fontsize=7)
    counts.tick_params(axis="y", length=0)
    if tags:
        ax.legend(handles=[Patch(color=colors[t], label=_plain(t)) for t in tags], fontsize=8, loc="lower right")


def plot_gaps(board: dict, path: Path) -> list[str]:
    """Horizontal bars of the gap (%) per model with interval whiskers, largest gap on top, saved to ``path``.

    Returns:
        The model names as drawn, top to bottom (read back from the figure's axis).
    """
    fig = _figure(figsize=(8.5, 1.3 + 0.32 * len(board["rows"])))
    ax = fig.subplots()
    draw_gaps(ax, board)
    fig.tight_layout()
    atomic_write_figure(path, fig, dpi=120)
    ticks = sorted(zip(ax.get_yticks(), (t.get_text() for t in ax.get_yticklabels())), reverse=True)
    return [label for _, label in ticks]


def _curve_rows(board: dict) -> list[dict]:
    return [r for r in board["rows"] if r.get("by_images_sent")]


def draw_by_images(ax, board: dict) -> None:
    """One line per model: the gap (%) at each number of images sent, with 95% whiskers."""
    rows = _curve_rows(board)
    ks = sorted({int(k) for r in rows for k in r["by_images_sent"]})
    step = min(0.08, 0.6 / max(len(rows), 1))
    for j, r in enumerate(rows):
        groups = sorted((int(k), g) for k, g in r["by_images_sent"].items())
        x = np.array([k for k, _ in groups]) + (j - (len(rows) - 1) / 2) * step
        y = np.array([100 * g["gap"]["value"] for _, g in groups])
        ci = [g["gap"]["ci"] or [g["gap"]["value"]] * 2 for _, g in groups]
        err = np.array(_whiskers(y, np.array([100 * c[0] for c in ci]), np.array([100 * c[1] for c in ci])))
        ax.errorbar(x, y, yerr=err, marker="o", markersize=4, capsize=2, linewidth=1.2, label=_plain(r["label"]))
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xticks(ks)
    ax.set_xlabel("images sent (image parts in the interleaved request)")
    ax.set_ylabel(f"gap: acc {board['forms'][0]} − acc {board['forms'][1]} (%)")
    ax.set_title(f"{board['title']}: gap by images sent (95% bootstrap CI per group)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def plot_by_images(board: dict, path: Path) -> dict[str, dict] | None:
    """The gap-by-images-sent curves of all models in one figure, saved to ``path``; None when no run has them.

    Returns:
        ``{label: {"x": [...], "y": [...], "lo": [...], "hi": [...]}}`` in percent, read back from the axes
        (``x`` as drawn, dodged by up to ±0.3 around the number of images).
    """
    if not _curve_rows(board):
        return None
    fig = _figure(figsize=(9, 4.5))
    ax = fig.subplots()
    draw_by_images(ax, board)
    fig.tight_layout()
    atomic_write_figure(path, fig, dpi=120)
    drawn = {}
    for container in ax.containers:
        line, _, (bars,) = container.lines
        segments = bars.get_segments()
        drawn[container.get_label()] = {"x": list(line.get_xdata()), "y": list(line.get_ydata()),
                                        "lo": [s[0][1] for s in segments], "hi": [s[1][1] for s in segments]}
    return drawn


def _split_rows(board: dict) -> list[dict]:
    return [r for r in board["rows"] if any(r.get(f"split_{p}") is not None for p in PARTS)]


def _split_note(r: dict) -> str:
    ran = set(r.get("controls") or ())
    if {"both", "recognition"} <= ran:
        note = "load + recognition + rest"
    elif "both" in ran:
        note = "no recognition control: rest = both − interleaved"
    else:
        note = "no both form: rest = recognised-only gap"
    return note + (" (rest n/a: no item recognised)" if r.get("split_rest") is None else "")


def draw_components(ax, board: dict) -> None:
    """Per model a stacked bar of its gap's parts (negative parts left of 0) and a diamond at its gap."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    rows = _split_rows(board)
    ys = np.arange(len(rows))[::-1]
    pos, neg = np.zeros(len(rows)), np.zeros(len(rows))
    values = {p: [r.get(f"split_{p}") for r in rows] for p in PARTS}
    span = max([abs(100 * v) for vs in values.values() for v in vs if v is not None] + [100 * abs(r["gap"]) for r in rows]
               + [1.0])
    for part, (color, _) in PARTS.items():
        for i, v in enumerate(values[part]):
            if v is None:
                continue
            width = 100 * v
            left = pos[i] if width >= 0 else neg[i] + width
            if width >= 0:
                pos[i] += width
            else:
                neg[i] += width
            # A part without the control that splits it off is hatched: it holds what was not split.
            whole = {"both", "recognition"} <= set(rows[i].get("controls") or ())
            ax.barh(ys[i] + 0.12, abs(width), left=left, height=0.5, color=color, edgecolor="white", linewidth=0.5,
                    hatch=None if whole or part != "rest" else "//", gid=f"{part}|{i}")
            if abs(width) >= 0.08 * span:
                ax.text(left + abs(width) / 2, ys[i] + 0.12, f"{width:+.1f}", ha="center", va="center", fontsize=7,
                        color="white")
    gaps = np.array([100 * r["gap"] for r in rows])
    lo = np.array([100 * r["gap_ci"][0] for r in rows])
    hi = np.array([100 * r["gap_ci"][1] for r in rows])
    # The gap just under its bar, so the marker hides no part's label.
    ax.errorbar(gaps, ys - 0.25, xerr=_whiskers(gaps, lo, hi), fmt="none", ecolor="black", capsize=2,
                linewidth=0.9)
    ax.plot(gaps, ys - 0.25, linestyle="none", marker="D", markersize=5, color="black", zorder=3, gid="gap")
    _room(ax, np.r_[lo, hi, gaps, pos, neg])
    ax.axvline(0, color="black", linewidth=0.6)
    ax.set_yticks(ys, [_plain(r["label"]) for r in rows], fontsize=8)
    ax.set_ylim(-0.6, len(rows) - 0.3)
    ax.set_xlabel("points of accuracy (%): the parts (bar; a negative one left of 0) add up to the gap ◆")
    ax.set_title(f"{board['title']}: what each gap is made of")
    ax.grid(axis="x", alpha=0.3)
    notes = ax.twinx()
    notes.set_ylim(ax.get_ylim())
    notes.set_yticks(ys, [_split_note(r) for r in rows], fontsize=7)
    notes.tick_params(axis="y", length=0)
    handles = [Patch(color=c, label=text) for c, text in PARTS.values()]
    if any(not {"both", "recognition"} <= set(r.get("controls") or ()) for r in rows):
        handles.append(Patch(facecolor=PARTS["rest"][0], hatch="//", edgecolor="white",
                             label="rest with a control missing (holds the unsplit part)"))
    handles.append(Line2D([], [], color="black", marker="D", linestyle="none", label="gap = text − interleaved (95% CI)"))
    ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, frameon=False)


def plot_components(board: dict, path: Path) -> dict[str, dict] | None:
    """Per model its gap split into load / recognition / rest, saved to ``path``; None when no run has a split.

    Returns:
        ``{label: {part: (left, right), ..., "gap": x}}`` in percent, read back from the bars and the markers.
    """
    rows = _split_rows(board)
    if not rows:
        return None
    fig = _figure(figsize=(9, 2.4 + 0.4 * len(rows)))
    ax = fig.subplots()
    draw_components(ax, board)
    fig.tight_layout()
    atomic_write_figure(path, fig, dpi=120)
    labels = [_plain(r["label"]) for r in rows]
    drawn: dict[str, dict] = {label: {} for label in labels}
    for patch in ax.patches:
        part, i = patch.get_gid().split("|")
        drawn[labels[int(i)]][part] = (patch.get_x(), patch.get_x() + patch.get_width())
    (marker,) = [line for line in ax.lines if line.get_gid() == "gap"]
    for label, x in zip(labels, marker.get_xdata()):
        drawn[label]["gap"] = float(x)
    return drawn
