"""The one entry of a recipe run as a script: ``run_recipe(main, PostTrainConfig)`` is its whole ``__main__`` block.

The recipes never pass through ``tokenswap.cli.main``, so this is their ``cli.main``: the command line parsed into
the recipe's config, ``--help`` answered, the errors every room raises (``InputError``, ``IncompleteRunError``,
``BusyError``, ``PreemptedError``) mapped to one line and an exit status by the same
:func:`tokenswap.errors.exit_status` the subcommands use, and all of it inside the same redacting output streams
(:func:`tokenswap.redaction.redacting_std_streams`), through :func:`tokenswap.script.run_script`. The training room
raises; only ``tokenswap.script`` and ``cli.main`` exit.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NoReturn

from tokenswap import config
from tokenswap.script import run_script
from tokenswap.training.distributed import end_script

__all__ = ["run_recipe"]

# A run's progress lives in its checkpoints (one being written at the Ctrl-C has no tokenswap record and is skipped).
RECIPE_INTERRUPTED = ("interrupted (Ctrl-C): the run's complete checkpoints are kept; relaunch the same command with "
                      "train.resume_from_checkpoint=latest to continue from the newest")


def run_recipe(main: Callable[[Any], object], config_cls: type, argv: list[str] | None = None) -> NoReturn:
    """Run a recipe's ``main`` on the config of ``argv`` (``sys.argv[1:]``) and end the process as a script does.

    ``[--config PATH_OR_NAME] [section.key=value ...]`` becomes ``config_cls``
    (:func:`tokenswap.config.parse_config`, after :func:`~tokenswap.config.check_config_early` answered what it can
    without importing the Trainer's arguments); ``-h`` / ``--help`` prints every field (:func:`tokenswap.config.usage`)
    and exits 0. An error is one line ``error: ...`` on stderr and the status of :func:`~tokenswap.errors.exit_status`
    (2 for an input to fix, 1 for a run left incomplete or a folder in use, 143 after a SIGTERM stop), raised as
    ``SystemExit`` so that each rank of a launch ends with it and the launcher ends the run. A run that finished
    ends with :func:`~tokenswap.training.distributed.end_script` (after a gloo group, without finalizing).
    """
    argv = list(sys.argv[1:] if argv is None else argv)

    def run() -> int:
        if "-h" in argv or "--help" in argv:
            print(config.usage(config_cls))
            return 0
        # A typo is answered before the Trainer's section is built (its import takes seconds); the recipes import
        # what they train with inside main, after this.
        config.check_config_early(config_cls, argv)
        # config.parse_config looked up at the call, not imported by name: the docs harness replaces it to stop
        # a documented command right after its arguments parsed (tests/docs_harness.py).
        try:
            main(config.parse_config(config_cls, argv))
        except KeyboardInterrupt:
            raise KeyboardInterrupt(RECIPE_INTERRUPTED) from None
        end_script()
        return 0

    run_script(run)
