"""Section ``handlers`` of benchmarks/faults.py: transformers, datasets, huggingface_hub, DeepSpeed and accelerate
imported (their log handlers made on the real stderr/stdout, and a root handler by ``logging.basicConfig``) before a
recipe's entry and before ``tokenswap eval``; each logs the hub token (``HF_TOKEN``) inside the run: masked on every
line, whole lines, and every handler back on its own stream after the command.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

from ._common import ENV, PY, REPO, Tally

OUTCOME = ("a hub token logged through transformers', datasets', huggingface_hub's, DeepSpeed's and accelerate's own "
           "handlers inside a recipe run and tokenswap eval: masked on every line, handlers restored after")

SECRET = "hf_FaultsHandlers0a1b2c3d4e5f6"
NAMES = ("transformers.trainer", "datasets.x", "huggingface_hub.x", "DeepSpeed", "accelerate.x")
LIBRARIES = textwrap.dedent('''
    import logging, sys
    import deepspeed, accelerate, accelerate.logging, datasets, huggingface_hub.utils.logging as hub_logging
    import transformers
    transformers.logging.set_verbosity_warning()
    transformers.logging.get_logger("transformers").warning("made at import")
    datasets.logging.get_logger("datasets").warning("made at import")
    hub_logging.get_logger("huggingface_hub").warning("made at import")
    loggers = [transformers.logging.get_logger("transformers.trainer"), datasets.logging.get_logger("datasets.x"),
               hub_logging.get_logger("huggingface_hub.x"), logging.getLogger("DeepSpeed"),
               accelerate.logging.get_logger("accelerate.x", log_level="WARNING")]
    logging.basicConfig()
    accelerate.PartialState()
    secret = sys.argv[1]

    def log_all():
        for logger in loggers:
            logger.warning("the key is %s (from %s)", secret, logger.name)
''')
RECIPE = LIBRARIES + textwrap.dedent('''
    from dataclasses import dataclass
    from tokenswap.training import run_recipe

    @dataclass
    class Cfg:
        steps: int = 1

    sys.argv = sys.argv[:1]
    run_recipe(lambda cfg: log_all(), Cfg)
''')
EVAL = LIBRARIES + textwrap.dedent('''
    import tokenswap.eval.cli as eval_cli
    from tokenswap.cli import main
    real = eval_cli.cli_main

    def logging_cli_main(argv):
        log_all()
        return real(argv)

    eval_cli.cli_main = logging_cli_main
    try:
        code = main(["eval", "--help"])
    except SystemExit as e:
        code = e.code
    for logger in loggers:
        logger.warning("after %s", logger.name)
    sys.exit(code)
''')


def section_handlers(t: Tally, work: Path) -> None:
    for what, source in (("a recipe run (run_recipe)", RECIPE), ("tokenswap eval", EVAL)):
        script = work / f"handlers-{len(source)}.py"
        script.write_text(source)
        try:
            proc = subprocess.run([PY, str(script), SECRET], cwd=REPO, env={**ENV, "HF_TOKEN": SECRET},
                                  capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            t.add("handlers", f"{what}: every library's handler masked", False, "timed out after 600 s")
            continue
        said = proc.stdout + proc.stderr
        masked = [n for n in NAMES if f"the key is [hub token] (from {n})" in said]
        restored = "eval" not in what or all(f"after {n}" in said for n in NAMES)
        t.add("handlers", f"{what}: the hub token through {len(NAMES)} libraries' handlers, masked on every line",
              proc.returncode == 0 and SECRET not in said and SECRET[:12] not in said and len(masked) == len(NAMES)
              and restored, f"rc={proc.returncode} masked={masked} {said[-300:]}")
