"""Imported first by a script run as a process (the recipes): what must hold before its other imports run.

``import tokenswap.start`` as a recipe's first import

* refuses a secret on the command line (:func:`tokenswap.redaction.command_line_secret`): one line ``error: ...``
  naming the environment variable to set instead, exit status 2, before seconds of imports, and never the value;
* puts the redacting streams in front of ``sys.stdout``/``sys.stderr`` for the rest of the process
  (:func:`tokenswap.redaction.script_streams`), so that what the imports print and the log handlers they make
  (transformers, datasets, huggingface_hub, DeepSpeed, accelerate) go out masked and in whole lines, and a reader gone
  during the imports costs no traceback.

A library never imports this module: it acts on the process, which only a script owns.
"""

from __future__ import annotations

from tokenswap.script import start_script

__all__: list[str] = []

start_script()
