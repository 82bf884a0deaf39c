"""benchmarks/gpu_check.sh's Python steps: preflight, assets, parsing each step's output, the summary table.

    python benchmarks/gpu_report.py plan --device cuda|cpu                       # the timeouts; 2 if the plan breaks a rule
    python benchmarks/gpu_report.py install-plan --wheels DIR --scratch DIR   # pip's plan: 2 replaces, 3 unresolved
    python benchmarks/gpu_report.py preflight --part 1|2|all --report DIR --scratch DIR --device cuda|cpu [--carried FILE]
    python benchmarks/gpu_report.py assets    --report DIR --scratch DIR --device cuda|cpu
    python benchmarks/gpu_report.py run NAME RC --report DIR --scratch DIR      # after each recipe run
    python benchmarks/gpu_report.py tests RC --report DIR --scratch DIR         # after the packing exactness tests
    python benchmarks/gpu_report.py bench NAME RC --report DIR --scratch DIR    # after a gpu_packing.py run
    python benchmarks/gpu_report.py skip NAME REASON --report DIR
    python benchmarks/gpu_report.py summary --report DIR

Each step appends one record to ``DIR/results.jsonl`` and rewrites ``DIR/summary.txt`` (and prints it), so a
stall or a timeout later keeps every figure already measured. The same code runs on the GPU and in the CPU
twin (``gpu_check.sh --dry-run``): only the device differs.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import re
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Packages whose tokenswap range (pyproject.toml) the runs depend on.
RANGED = ["torch", "transformers", "accelerate", "peft", "trl", "datasets", "deepspeed"]
KERNELS = ["flash_attention_2", "tokenswap_varlen", "tokenswap_flex", "tokenswap_varlen_sdpa"]

# ---------------------------------------------------------------------------- the lease, step by step
# The GPU lease (15 minutes of device time, the machine's start included; one command at most 600 s), planned so that
# part 1 can run twice in it: the machine's start (about 120 s: "a minute or more", the device README) + 2 x (part 1's
# 330 s + ~15 s of transfers) = 810 s of 900. Per step on the H200: (part, estimate s, timeout s, what the estimate
# rests on). No step has been timed on a GPU yet: each summary line ends with its wall seconds, so the first lease
# replaces these estimates with measurements. Every timeout is at least 1.5x its estimate, and part 1's timeouts sum
# to at most PART1_BUDGET, so part 1 ends within it even when every step runs to its timeout.
PLAN = {
    "install": (1, 10, 15, "pip's plan, then 25 wheels, ~34 MB, into the image's environment from the folder (no index)"),
    "preflight": (1, 10, 15, "imports torch, transformers, peft, pytest and what part 1 runs; CUDA's first context"),
    "exactness": (1, 150, 225, "24 bf16 CUDA tests (8 more skip: no flash-attn); FlexAttention's compiles are the "
                  "least certain part (issue 38 puts the step at 90-155 s)"),
    "gpu_packing_2b": (1, 22, 33, "imports ~5 s, a random 2.2B model built on the GPU ~3 s, 8 steps per arm at ~0.5 s"),
    "gpu_packing_7b": (1, 22, 33, "imports ~5 s, a random 8.3B model built on the GPU ~4 s, 5 LoRA steps per arm at ~1 s"),
    "reports": (1, 4, 6, "gpu_report.py and the archive after each of the 4 steps"),
    "preflight_2": (2, 15, 25, "imports the recipe, accelerate, trl, datasets, deepspeed and bitsandbytes"),
    "configs": (2, 8, 15, "every run's YAML and overrides against PostTrainConfig, one process"),
    "assets": (2, 20, 30, "the 75M-parameter tiny Qwen2-VL and image store, and the 4-bit parameter count"),
    "run": (2, 45, 90, "accelerate launch: ~10 s imports, ~5 s start, 20 steps of a 75M model; ZeRO-3's the longest"),
}
PART1_BUDGET = 330
LEASE_RESERVE = 60  # part 2 keeps this of the lease for the transfer back and the give-back
RERUN_MARGIN = PLAN["run"][2] + 10  # and this, so one failed run can be rerun (--only NAME) in the same lease
# The timeouts a user may set instead of the plan's.
OVERRIDES = {"exactness": ("TEST_TIMEOUT",), "gpu_packing_2b": ("BENCH_TIMEOUT",),
             "gpu_packing_7b": ("SEVEN_B_TIMEOUT", "BENCH_TIMEOUT"), "run": ("RUN_TIMEOUT",)}
_FIXED = ("install", "preflight", "reports", "preflight_2", "configs", "assets")

# What each step imports: a step whose package is missing or unmet is skipped, and said; only the packages of the
# part's own steps are checked (part 1 never asks for datasets' pyarrow, say). "recipe" is recipes/post_train.py.
_PACKED = ["torch", "pytest", "transformers", "tokenswap.attention", "tokenswap.collator", "tokenswap.packing",
           "tokenswap.swap"]
_BENCH = ["torch", "transformers", "PIL", "tokenswap.attention", "tokenswap.collator", "tokenswap.throughput",
          "tokenswap.training", "tokenswap.testing"]
_RUN = ["torch", "transformers", "accelerate", "peft", "trl", "datasets", "yaml", "PIL", "recipe"]
STEP_IMPORTS = {
    "1": {"exactness": _PACKED, "gpu_packing_2b": _BENCH, "gpu_packing_7b": [*_BENCH, "peft"],
          "gpu_packing_tiny": _BENCH},
    "2": {"tokenswap_packed": _RUN, "one_gpu_tokenswap": _RUN, "tokenswap": _RUN, "text": _RUN, "tokenswap_zero3": [*_RUN, "deepspeed"],
          "tokenswap_qlora": [*_RUN, "bitsandbytes"], "tokenswap_liger": _RUN},
}
# Runs left out of the check, with the reason printed in their place.
DROPPED = {
    "tokenswap_liger": "liger-kernel 0.8.5, its newest release, builds its Qwen2-VL output on transformers' "
                       "Qwen2VLCausalLMOutputWithPast, which the pinned transformers 5.24 no longer has "
                       "(MultimodalCausalLMOutputWithPast replaced it), so no release can patch the model; not carried",
}


def plan_timeouts(device: str) -> dict[str, int]:
    """Each step's timeout: the plan's on cuda; on the CPU twin 600 s a step (STEP_TIMEOUT; a 2-core CPU is far
    slower) and minutes for the fixed steps. TEST_TIMEOUT, BENCH_TIMEOUT, SEVEN_B_TIMEOUT, RUN_TIMEOUT override."""
    out = {}
    for name, (_, _, timeout, _) in PLAN.items():
        if device != "cuda":
            timeout = 300 if name in _FIXED else int(os.environ.get("STEP_TIMEOUT") or 600)
        for var in OVERRIDES.get(name, ()):
            if os.environ.get(var, "").isdigit():
                timeout = int(os.environ[var])
                break
        out[name] = timeout
    return out


def plan_problems() -> list[str]:
    """The GPU plan's broken rules: a timeout under 1.5x its estimate, part 1's timeouts over PART1_BUDGET."""
    timeouts = plan_timeouts("cuda")
    problems = [f"{name}: timeout {timeouts[name]} s is under 1.5x its estimate of {est} s (at least "
                f"{math.ceil(1.5 * est)} s)" for name, (_, est, _, _) in PLAN.items() if timeouts[name] < 1.5 * est]
    part1 = sum(t for name, t in timeouts.items() if PLAN[name][0] == 1)
    if part1 > PART1_BUDGET:
        problems.append(f"part 1's timeouts sum to {part1} s, over its {PART1_BUDGET} s")
    return problems


def plan(args) -> int:
    """Shell lines for gpu_check.sh: ``T_<step>=<s>`` for ``--device``, the margins, and the GPU plan said; exit 2
    (with every broken rule said) when the GPU plan breaks one, on the twin too."""
    for name, timeout in plan_timeouts(args.device).items():
        print(f"T_{name}={timeout}")
    print(f"RERUN_MARGIN={int(os.environ.get('RERUN_MARGIN') or RERUN_MARGIN)}")
    print(f"LEASE_RESERVE={int(os.environ.get('LEASE_RESERVE') or LEASE_RESERVE)}")
    timeouts = plan_timeouts("cuda")
    part1 = [n for n in PLAN if PLAN[n][0] == 1]
    steps = ", ".join(f"{n} {PLAN[n][1]}/{timeouts[n]}" for n in part1)
    print(f"echo 'gpu_check: part 1 on the GPU (estimate/timeout s): {steps}; timeouts {sum(timeouts[n] for n in part1)}"
          f" s of {PART1_BUDGET}'")
    problems = plan_problems()
    for p in problems:
        print(f"echo 'gpu_check: plan broken: {p}' >&2")
    return 2 if problems else 0


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def _record(report: Path, row: dict) -> None:
    if os.environ.get("GPU_CHECK_STEP_S", "").isdigit() and not row.get("status", "").startswith("skipped"):
        row["seconds"] = int(os.environ["GPU_CHECK_STEP_S"])  # the step's wall time, to size the next lease's parts
    with open(report / "results.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    summary(report)


def _device_name(device: str) -> str:
    if device != "cuda":
        return "cpu"
    import torch

    return torch.cuda.get_device_name(0)


# ---------------------------------------------------------------------------- preflight
def _import(name: str):
    if name == "recipe":  # what recipes/post_train.py imports, as accelerate launch will run it
        spec = importlib.util.spec_from_file_location("post_train", REPO / "recipes" / "post_train.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["post_train"] = module  # dataclasses resolve annotations through sys.modules
        try:
            spec.loader.exec_module(module)
        except SystemExit as e:  # its first lines refuse a missing package of the train extra: one line, exit 2
            raise ImportError(f"recipes/post_train.py exits {e.code} on import (a package of the train extra is "
                              "missing)") from None
        return module
    return importlib.import_module(name)


def _owner(module: str) -> str:
    from packaging.utils import canonicalize_name as canon

    return "recipe" if module == "recipe" else canon(module.split(".")[0])


def _requirement_problems(carried: set[str], used: set[str], checked: set[str]) -> list[tuple[str, str]]:
    """``(distribution, problem)`` for the requirements of the carried distributions this part imported and for
    tokenswap's ranges of them, against what this interpreter sees; ``checked``: what an earlier part checked."""
    import importlib.metadata as md

    import tomllib
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name as canon
    from packaging.version import Version

    problems = []

    def check(owner: str, label: str, raw: str) -> None:
        r = Requirement(raw)
        if r.marker and not r.marker.evaluate({"extra": ""}):
            return
        try:
            found = md.distribution(r.name)  # the first on sys.path: the one that imports
        except md.PackageNotFoundError:
            problems.append((owner, f"{label} needs {r}: not installed"))
            return
        if not r.specifier.contains(Version(found.version), prereleases=True):
            problems.append((owner, f"{label} needs {r}: found {found.version} in {found.locate_file('')}"))

    for name in sorted(carried & (used - checked)):
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        for raw in dist.requires or []:
            check(name, f"carried {dist.metadata['Name']} {dist.version}", raw)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = [r for rs in project.get("optional-dependencies", {}).values() for r in rs]
    for raw in dict.fromkeys([*project["dependencies"], *extras]):
        name = canon(Requirement(raw).name)
        if name in RANGED and name in used - checked:
            check(name, "tokenswap", raw)
    return problems


def _carried(path: Path) -> list[str]:
    """The canonical names of the carried distributions, from ``carried.txt`` (``name==version`` a line)."""
    return [line.split("==")[0] for line in path.read_text().split()] if path.exists() else []


def install_plan(args) -> int:
    """pip's plan for the carried wheels in this interpreter's environment, without the index: one line and exit 2
    when it would replace a package the environment (the image) already has, exit 3 when pip cannot resolve it (a
    requirement that neither the image nor the wheels meet); else ``carried.txt`` (what to ask pip for)."""
    import importlib.metadata as md
    import subprocess

    from packaging.utils import canonicalize_name as canon
    from packaging.utils import parse_wheel_filename

    wheels, scratch = Path(args.wheels), Path(args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    specs = sorted(f"{canon(n)}=={v}" for n, v, *_ in map(parse_wheel_filename, (w.name for w in wheels.glob("*.whl"))))
    plan_path = scratch / "pip_plan.json"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--disable-pip-version-check",
                           "--no-index", "--find-links", str(wheels), "--report", str(plan_path), *specs],
                          capture_output=True, text=True)
    if done.returncode != 0:
        lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip() and "is ignored: it is neither" not in ln]
        why = [ln for ln in lines if ln.startswith("ERROR:") or " depends on " in ln or ln.startswith("The user")]
        print("gpu_check: pip cannot install the carried wheels into this environment without an index: "
              + "; ".join(why or lines[-3:])[:600], file=sys.stderr)
        return 3
    replaced = []
    for item in json.loads(plan_path.read_text()).get("install", []):
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        try:
            replaced.append(f"{name} {md.version(name)} with {version}")
        except md.PackageNotFoundError:
            pass
    if replaced:
        print(f"gpu_check: installing the carried wheels would replace the image's {', '.join(replaced)}: carry "
              "only what the image lacks (benchmarks/gpu_wheels.sh) and widen the range that asks for more",
              file=sys.stderr)
        return 2
    (scratch / "carried.txt").write_text("".join(f"{spec}\n" for spec in specs))
    print(f"gpu_check: install plan: {len(specs)} carried packages, none of the image's replaced")
    return 0


def _used_distributions() -> set[str]:
    """The distributions whose modules this process has imported."""
    import importlib.metadata as md

    from packaging.utils import canonicalize_name as canon

    owners = md.packages_distributions()
    return {canon(d) for m in list(sys.modules) if "." not in m for d in owners.get(m, ())}


def preflight(args) -> int:
    """Import what this part's steps import, check the requirements of what that loaded (less what an earlier part
    of this lease checked on the same wheels), and skip, with the reason, every step whose package is missing or
    unmet. Exit 0: a skipped step is said in the summary, not a failure of the part."""
    report, scratch = Path(args.report), Path(args.scratch)
    carried = set(_carried(Path(args.carried))) if args.carried else set()
    part_steps = {name: modules for part in (["1", "2"] if args.part == "all" else [args.part])
                  for name, modules in STEP_IMPORTS[part].items()}
    record_path = scratch / "preflight_checked.json"  # gpu_check.sh removes it whenever it (re)installs the wheels
    record = json.loads(record_path.read_text()) if record_path.exists() else {"checked": [], "broken": {}}
    checked, broken = set(record["checked"]), dict(record["broken"])
    lines, missing = [], []
    for module in dict.fromkeys(m for modules in part_steps.values() for m in modules):
        if _owner(module) in broken:
            continue
        try:
            loaded = _import(module)
        except Exception as e:  # a broken install fails differently from a missing one; both skip its steps
            broken[_owner(module)] = f"{module}: {_first_line(e)}"
            missing.append(broken[_owner(module)])
            continue
        if module != "recipe" and "." not in module and _owner(module) not in checked:
            where = "carried" if _owner(module) in carried else "machine"
            lines.append(f"ok {module} {getattr(loaded, '__version__', '')} ({where})")
    used = _used_distributions()
    problems = _requirement_problems(carried, used, checked)
    for owner, problem in problems:
        broken.setdefault(owner, problem)
    skips = {}
    for step, modules in part_steps.items():
        why = [broken[o] for o in dict.fromkeys(map(_owner, modules)) if o in broken]
        if step in DROPPED:
            skips[step] = f"dropped from the check: {DROPPED[step]}"
        elif why:
            skips[step] = "package: " + "; ".join(why)[:300]
    info = {"device": args.device, "part": args.part}
    if "torch" not in broken:
        import torch

        info["device_name"], info["torch"] = _device_name(args.device), torch.__version__
        if "tokenswap" not in broken:
            from tokenswap.attention import packed_attention_choice
            from tokenswap.training import resolve_attn_implementation

            info["padded_attention"] = resolve_attn_implementation("auto")
            info["packed_attention"] = " ".join(packed_attention_choice("auto", args.device))
    for line in lines:
        print(f"gpu_check: {line}")
    for m in missing:
        print(f"gpu_check: missing {m}")
    for _, p in problems:
        print(f"gpu_check: requirement not met: {p}")
    for step, reason in skips.items():
        print(f"gpu_check: {step} will be skipped: {reason}")
    (scratch / "skips.txt").write_text("".join(f"{step}\t{reason}\n" for step, reason in skips.items()))
    record_path.write_text(json.dumps({"checked": sorted(checked | used), "broken": broken}))
    name = "preflight" if args.part in ("1", "all") else f"preflight_{args.part}"
    (report / f"{name}.json").write_text(json.dumps(
        {**info, "packages": lines, "missing": missing, "problems": [p for _, p in problems], "skips": skips,
         "checked_by_an_earlier_part": sorted(checked)}, indent=2))
    if "torch" in broken:
        status = f"ok, every step skipped ({broken['torch']})"
    else:
        status = f"ok ({info['device_name']}, torch {info['torch']}" + (
            f", packed attention: {info['packed_attention']})" if "packed_attention" in info else ")")
    unmet = len(missing) + len(problems)
    if unmet:
        status += f"; {unmet} unmet, {len([s for s in skips if s not in DROPPED])} step(s) skipped"
    _record(report, {"kind": "step", "name": name, "status": status})
    return 0


# ---------------------------------------------------------------------------- assets
def assets(args) -> int:
    from tokenswap.testing import build_tiny_qwen2vl, build_tiny_store

    scratch, report = Path(args.scratch), Path(args.report)
    root = REPO / "tests" / "assets"
    corpus = [m["content"] for line in (root / "swap_tiny.jsonl").read_text().splitlines()
              for m in json.loads(line)["messages"]]
    corpus += [t["value"] for r in json.loads((root / "llava_tiny.json").read_text()) for t in r["conversations"]]
    # GPU: real Qwen2-VL architecture at ~75M language-model parameters (kernels, bf16 and ZeRO-3 do real work,
    # built in seconds). CPU twin: the same code at toy width, one step a run.
    width, layers = (1024, 8) if args.device == "cuda" else (64, 2)
    model = build_tiny_qwen2vl(scratch / "model", corpus=corpus, vocab_size=2048, hidden_size=width, num_layers=layers)
    build_tiny_store(scratch / "store")
    print(f"gpu_check: model {model} (hidden {width}, {layers} layers), store {scratch / 'store'}")
    status = 0
    try:
        importlib.import_module("bitsandbytes")
    except Exception:
        return status
    # MFU of the QLoRA run rests on this: 4-bit weights counted at their true size (Params4bit stores two per byte).
    from tokenswap.throughput import model_flop_counts
    from tokenswap.training import LoraConfig, ModelConfig, load_model_and_processor

    counts = {}
    for four_bit in (False, True):
        cfg = ModelConfig(name_or_path=str(model), dtype="bfloat16", attn_implementation="sdpa",
                          lora=LoraConfig(r=16), load_in_4bit=four_bit)
        loaded, _ = load_model_and_processor(cfg, seed=0)
        if args.device == "cuda" and not four_bit:
            loaded = loaded.cuda()
        counts[four_bit] = model_flop_counts(loaded)["n_llm"]
        del loaded
    same = counts[True] == counts[False]
    status = 0 if same else 1
    _record(report, {"kind": "step", "name": "4-bit param count",
                     "status": ("ok" if same else "FAILED") + f" (4-bit {counts[True]:.0f} vs bf16 {counts[False]:.0f}"
                               " language-model parameters)"})
    return status


# ---------------------------------------------------------------------------- runs
def _attention(log: str) -> str:
    m = re.findall(r"\[tokenswap\] packed attention: (\S+) \((\S+) on", log)
    if not m:
        m2 = re.findall(r"padded batches use (\w+) attention", log)
        return f"padded: {m2[-1]}" if m2 else "padded: flash_attention_2" if "flash_attention_2" in log else "padded"
    name = f"packed: {m[-1][0]}"
    fell = re.findall(r"varlen attention cannot run these batches \(([^)]*)\); using FlexAttention", log)
    return name + (f" -> flex_attention for {fell[-1]} queries (fallback)" if fell else "")


def run(args) -> int:
    report, scratch = Path(args.report), Path(args.scratch)
    name, rc = args.name, int(args.rc)
    runs = report / "runs"
    runs.mkdir(exist_ok=True)
    log_path = scratch / "runs" / f"{name}.log"
    log = log_path.read_text(errors="replace") if log_path.exists() else ""
    if log_path.exists():
        shutil.copy(log_path, runs / f"{name}.log")
    row = {"kind": "run", "name": name, "attention": _attention(log)}
    if rc != 0:
        row["status"] = "FAILED (timed out)" if rc in (124, 137) else f"FAILED (exit {rc})"
        _record(report, row)
        return 1
    try:
        history = json.loads((scratch / "runs" / name / "log_history.json").read_text())
        mem = json.loads((scratch / "runs" / f"{name}.mem.json").read_text())
    except (OSError, ValueError) as e:
        row["status"] = f"FAILED (no log_history/peak memory: {_first_line(e)})"
        _record(report, row)
        return 1
    shutil.copy(scratch / "runs" / name / "log_history.json", runs / f"{name}.log_history.json")
    shutil.copy(scratch / "runs" / f"{name}.mem.json", runs / f"{name}.mem.json")
    summary_row = [h for h in history if "train_samples_per_second" in h][-1]
    losses = [h["loss"] for h in history if "loss" in h]
    smi_path = scratch / "runs" / f"{name}.smi"
    smi = [int(x) for x in smi_path.read_text().split() if x.strip().isdigit()] if smi_path.exists() else []
    perf = [h for h in history if "perf/tokens_per_s" in h]
    # part 2 in a call of its own (the lease's second command) has only its own preflight
    info = json.loads(next(p for p in (report / "preflight.json", report / "preflight_2.json") if p.exists()).read_text())
    row.update(status="ok", samples_per_s=summary_row["train_samples_per_second"],
               alloc_gib=mem.get("max_memory_allocated_gib"), rss_gib=mem.get("max_rss_gib"),
               smi_gib=max(smi) / 1024 if smi else None,
               loss=f"{losses[0]:.3f} -> {losses[-1]:.3f}" if losses else "no loss logged")
    if perf:
        from tokenswap.throughput import no_peak_reason

        h = perf[-1]
        row.update(tokens_per_s=h["perf/tokens_per_s"], padding=h["perf/padding"], tflops=h.get("perf/tflops"))
        row["mfu"] = (f"{100 * h['perf/mfu']:.1f}%" if "perf/mfu" in h else
                      f"n/a ({no_peak_reason(info.get('device_name') if info['device'] == 'cuda' else None)})")
    _record(report, row)
    return 0


def skip(args) -> int:
    _record(Path(args.report), {"kind": args.kind, "name": args.name, "status": f"skipped ({args.rc})"})
    return 0


# ---------------------------------------------------------------------------- packing exactness tests
def tests(args) -> int:
    report, scratch = Path(args.report), Path(args.scratch)
    xml_path = scratch / "packing_test.xml"
    shutil.copy(scratch / "packing_test.log", report / "packing_test.log")
    by_kernel: dict[str, dict[str, int]] = {k: {} for k in KERNELS}
    reasons: dict[str, set[str]] = {k: set() for k in KERNELS}

    def kernel_of(test_id: str) -> str | None:
        return next((k for k in sorted(KERNELS, key=len, reverse=True) if f"-{k}-" in test_id), None)

    if xml_path.exists():
        for case in ET.parse(xml_path).iter("testcase"):
            kernel = kernel_of(case.get("name", ""))
            if kernel is None:
                continue
            outcome = "passed"
            for child in case:
                if child.tag in ("failure", "error"):
                    outcome = "failed"
                elif child.tag == "skipped":
                    outcome = "skipped"
                    reasons[kernel].add((child.get("message") or "").removeprefix("could not import 'flash_attn': "))
            by_kernel[kernel][outcome] = by_kernel[kernel].get(outcome, 0) + 1
    else:  # stopped before pytest wrote its XML (a timeout): the verbose lines of the tests that did run
        log = (scratch / "packing_test.log").read_text(errors="replace")
        for test_id, outcome in re.findall(r"::\w+\[([^\]]+)\] (PASSED|FAILED|SKIPPED|ERROR)", log):
            kernel = kernel_of(f"-{test_id}-")
            if kernel is not None:
                outcome = {"ERROR": "failed"}.get(outcome, outcome.lower())
                by_kernel[kernel][outcome] = by_kernel[kernel].get(outcome, 0) + 1
    status = 0 if int(args.rc) in (0, 5) else 1
    for kernel, counts in by_kernel.items():
        if not counts:
            text = f"FAILED (no result; pytest exit {args.rc})"
            status = 1
        elif counts.get("failed"):
            text = f"FAILED ({counts['failed']} failed, {counts.get('passed', 0)} passed)"
            status = 1
        elif counts.get("passed"):
            text = f"ok ({counts['passed']} passed" + (f", {counts['skipped']} skipped" if counts.get("skipped") else "") + ")"
        else:
            text = f"skipped ({'; '.join(sorted(reasons[kernel]))})"
        _record(report, {"kind": "exactness", "name": kernel, "status": text})
    return status


# ---------------------------------------------------------------------------- gpu_packing.py
def bench(args) -> int:
    report, scratch = Path(args.report), Path(args.scratch)
    name, rc = args.name, int(args.rc)
    log = scratch / f"{name}.log"
    if log.exists():
        shutil.copy(log, report / f"{name}.log")
    if rc != 0:
        status = "FAILED (timed out)" if rc in (124, 137) else f"FAILED (exit {rc})"
        _record(report, {"kind": "bench", "name": name, "status": status})
        return 1
    data = json.loads((scratch / f"{name}.json").read_text())
    shutil.copy(scratch / f"{name}.json", report / f"{name}.json")
    from tokenswap.throughput import no_peak_reason

    for arm, r in data["arms"].items():
        mfu = (f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else
               f"n/a ({no_peak_reason(data['device'] if data['device'] != 'cpu' else None)})")
        _record(report, {"kind": "bench", "name": f"{name} {arm}", "status": "ok", "attention": r["attention"],
                         "tokens_per_s": r["tokens_per_s"], "padding": r["padding"], "tflops": r["tflops"],
                         "mfu": mfu, "alloc_gib": r["peak_gib"], "shape": data["shape"], "lora": data["lora"]})
    return 0


# ---------------------------------------------------------------------------- summary
def _f(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def summary(report: Path | str) -> str:
    report = Path(report)
    rows = [json.loads(line) for line in (report / "results.jsonl").read_text().splitlines() if line.strip()]
    out = [f"{'step':<26} {'status':<8} {'samples/s':>9} {'tokens/s':>9} {'pad':>6} {'TFLOP/s':>8} {'peak GiB':>9} "
           f"{'smi GiB':>8} {'loss first -> last':>20}  attention / MFU"]
    for r in rows:
        took = f"  ({r['seconds']} s)" if r.get("seconds") is not None else ""
        if r.get("status") != "ok" or r["kind"] in ("step", "exactness"):
            out.append(f"{r['kind'] + ' ' + r['name']:<26} {r['status']}"
                       + (f"  [{r['attention']}]" if r.get("attention") else "") + took)
            continue
        peak = r.get("alloc_gib") if r.get("alloc_gib") is not None else r.get("rss_gib")
        out.append(f"{r['kind'] + ' ' + r['name']:<26} {'ok':<8} {_f(r.get('samples_per_s'), '.2f'):>9} "
                   f"{_f(r.get('tokens_per_s'), '.0f'):>9} "
                   f"{_f(None if r.get('padding') is None else 100 * r['padding'], '.1f'):>5}% "
                   f"{_f(r.get('tflops'), '.1f'):>8} {_f(peak, '.2f'):>9} {_f(r.get('smi_gib'), '.2f'):>8} "
                   f"{r.get('loss', '-'):>20}  {r.get('attention', '-')}; MFU {r.get('mfu', '-')}{took}")
    failed = [r["name"] for r in rows if r["status"].startswith("FAILED")]
    late = [r["name"] for r in rows if r["status"].startswith(("skipped (lease:", "skipped (part budget:"))]
    unmet = [r["name"] for r in rows if r["status"].startswith("skipped (package:")]
    dropped = [r["name"] for r in rows if r["status"].startswith("skipped (dropped")]
    out.append(f"gpu_check: {len(rows)} results, {len(failed)} failed" + (f" ({', '.join(failed)})" if failed else "")
               + (f", {len(late)} skipped for time ({', '.join(late)})" if late else "")
               + (f", {len(unmet)} skipped for a package ({', '.join(unmet)})" if unmet else "")
               + (f", {len(dropped)} dropped ({', '.join(dropped)})" if dropped else ""))
    text = "\n".join(out) + "\n"
    (report / "summary.txt").write_text(text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("step", choices=["plan", "install-plan", "preflight", "assets", "run", "tests", "bench", "skip", "summary"])
    parser.add_argument("name", nargs="?")
    parser.add_argument("rc", nargs="?", default="0")
    parser.add_argument("--report", default=None)
    parser.add_argument("--scratch", default=None)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--carried", default=None)
    parser.add_argument("--wheels", default=None)
    parser.add_argument("--kind", default="run")
    parser.add_argument("--part", choices=["1", "2", "all"], default="all")
    args = parser.parse_args()
    if args.step == "plan":
        return plan(args)
    if args.step == "install-plan":
        return install_plan(args)
    if args.report is None:
        parser.error("--report is required")
    if args.step == "summary":
        print(summary(args.report), end="")
        return 0
    status = {"preflight": preflight, "assets": assets, "run": run, "tests": tests, "bench": bench,
              "skip": skip}[args.step](args)
    if args.step != "preflight":
        print((Path(args.report) / "summary.txt").read_text(), end="")
    return status


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
