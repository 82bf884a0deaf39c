"""benchmarks/gpu_check.sh's Python steps: preflight, assets, parsing each step's output, the summary table.

    python benchmarks/gpu_report.py preflight --report DIR --scratch DIR --device cuda|cpu
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
import json
import os
import re
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REQUIRED = ["torch", "transformers", "accelerate", "peft", "datasets", "trl", "deepspeed", "PIL", "yaml", "tokenswap"]
# Packages whose tokenswap range (pyproject.toml) the runs depend on.
RANGED = ["torch", "transformers", "accelerate", "peft", "trl", "datasets", "deepspeed"]
KERNELS = ["flash_attention_2", "tokenswap_varlen", "tokenswap_flex", "tokenswap_varlen_sdpa"]


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
def _requirement_problems(site: Path | None) -> list[str]:
    """Requirements of the carried distributions and tokenswap's ranges, against what this interpreter sees."""
    import importlib.metadata as md

    import tomllib
    from packaging.requirements import Requirement
    from packaging.version import Version

    problems = []

    def check(owner: str, raw: str) -> None:
        r = Requirement(raw)
        if r.marker and not r.marker.evaluate({"extra": ""}):
            return
        try:
            found = md.distribution(r.name)  # the first on sys.path: the one that imports
        except md.PackageNotFoundError:
            problems.append(f"{owner} needs {r}: not installed")
            return
        if not r.specifier.contains(Version(found.version), prereleases=True):
            problems.append(f"{owner} needs {r}: found {found.version} in {found.locate_file('')}")

    if site is not None and site.is_dir():
        for dist in md.distributions(path=[str(site)]):
            for raw in dist.requires or []:
                check(f"carried {dist.metadata['Name']} {dist.version}", raw)
    own = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for raw in own:
        if Requirement(raw).name in RANGED:
            check("tokenswap", raw)
    return problems


def _liger_applies() -> str | None:
    """None when liger-kernel patches a tiny Qwen2-VL as the Trainer would (train.use_liger_kernel), else why not."""
    try:
        import torch
        from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
        from transformers.integrations.liger import apply_liger_kernel

        config = Qwen2VLConfig(text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                                num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                                rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                                 "mrope_section": [4, 2, 2]}),
                               vision_config=dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2))
        torch.manual_seed(0)
        model = Qwen2VLForConditionalGeneration(config)  # real (tiny) weights: the patch may touch them
        apply_liger_kernel(model, None)
    except Exception as e:  # whatever stops the patch stops the run: a skip with the reason
        version = _version("liger_kernel", "liger-kernel")
        return f"liger-kernel {version}: {_first_line(e)}"
    return None


def _version(module: str, dist: str | None = None) -> str:
    import importlib.metadata as md

    try:
        return md.version(dist or module)
    except md.PackageNotFoundError:
        return "?"


def preflight(args) -> int:
    report, scratch = Path(args.report), Path(args.scratch)
    site = Path(args.site) if args.site else None
    lines, missing, skips = [], [], {}
    for name in REQUIRED:
        try:
            module = importlib.import_module(name)
            where = "carried" if site and str(site) in str(getattr(module, "__file__", "")) else "machine"
            lines.append(f"ok {name} {getattr(module, '__version__', '')} ({where})")
        except Exception as e:  # a broken install fails differently from a missing one; both stop the check
            missing.append(f"{name}: {_first_line(e)}")
    problems = [] if missing else _requirement_problems(site)
    try:
        importlib.import_module("bitsandbytes")
    except Exception as e:
        skips["tokenswap_qlora"] = f"bitsandbytes: {_first_line(e)}"
    why = _liger_applies() if not missing else "required packages missing"
    if why is None and args.device != "cuda":
        why = "liger's kernels are Triton, CUDA only (the patch applied)"
    if why is not None:
        skips["tokenswap_liger"] = why
    info = {"device": args.device}
    if not missing:
        from tokenswap.attention import packed_attention_choice
        from tokenswap.training import resolve_attn_implementation

        info["device_name"] = _device_name(args.device)
        info["padded_attention"] = resolve_attn_implementation("auto")
        info["packed_attention"] = " ".join(packed_attention_choice("auto", args.device))
        import torch

        info["torch"] = torch.__version__
    for line in lines:
        print(f"gpu_check: {line}")
    for m in missing:
        print(f"gpu_check: missing {m}")
    for p in problems:
        print(f"gpu_check: requirement not met: {p}")
    for run, reason in skips.items():
        print(f"gpu_check: {run} will be skipped: {reason}")
    (scratch / "skips.txt").write_text("".join(f"{run}\t{reason}\n" for run, reason in skips.items()))
    (report / "preflight.json").write_text(json.dumps({**info, "packages": lines, "missing": missing,
                                                        "problems": problems, "skips": skips}, indent=2))
    if missing or problems:
        _record(report, {"kind": "step", "name": "preflight", "status": "FAILED (" + "; ".join(missing + problems)[:400]
                         + ")"})
        return 2
    _record(report, {"kind": "step", "name": "preflight", "status": f"ok ({info['device_name']}, torch "
                     f"{info['torch']}, packed attention: {info['packed_attention']})"})
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
    info = json.loads((report / "preflight.json").read_text())
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
    out.append(f"gpu_check: {len(rows)} results, {len(failed)} failed" + (f" ({', '.join(failed)})" if failed else "")
               + (f", {len(late)} skipped for time ({', '.join(late)})" if late else ""))
    text = "\n".join(out) + "\n"
    (report / "summary.txt").write_text(text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("step", choices=["preflight", "assets", "run", "tests", "bench", "skip", "summary"])
    parser.add_argument("name", nargs="?")
    parser.add_argument("rc", nargs="?", default="0")
    parser.add_argument("--report", required=True)
    parser.add_argument("--scratch", default=None)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--site", default=None)
    parser.add_argument("--kind", default="run")
    args = parser.parse_args()
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
