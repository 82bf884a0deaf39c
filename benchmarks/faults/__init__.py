"""The sections of ``benchmarks/faults.py``, one module each; run them through that script (its docstring lists
what each section injects and what counts as handled). ``_common`` holds what more than one section uses."""
