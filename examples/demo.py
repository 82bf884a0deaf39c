"""The demo: a paired TokenSwap experiment on a toy concept world, end to end on a laptop CPU.

``python examples/demo.py --out demo_out`` (what ``make demo`` runs), from a checkout: it launches the
checkout's ``recipes/`` with ``configs/demo/``, so it is an example beside the package, not part of it:

1. **World.** ``--concepts`` OpenMoji pictograms (banana, cat, rocket, ...) each get three
   arbitrary facts (a zone, an owner, a number; drawn by hash, so nothing can be guessed from
   the picture). Concepts are split in two groups: TokenSwap practice uses group A's pictures;
   group B's pictures are never inside a training question (the transfer test).
2. **Continued pre-training** (``recipes/pretrain.py``, text arm, once): a random-init tiny
   Qwen2-VL-architecture model learns every fact as text (plus, as text, the multiple-choice
   questions on the training facts) and learns to name every picture.
3. **Post-training** (``recipes/post_train.py``), per seed three arms on the same samples in the
   same order: *baseline* (picture naming and identification only, the "LLaVA data"), *text*
   (+ multiple-choice questions on the training facts), *tokenswap* (+ the same questions with the
   concept word shown as its picture, group A only).
4. **Gap evaluation** in text and interleaved form, TokenSwap-Bench format, loglik scorer, on the
   facts of each group asked in ``--phrasings`` question phrasings no training sample used, with
   both recognition controls (naming form: the trained naming prompt followed by each of 4
   candidate names, scored by log-likelihood; multiple-choice form): group B in the loop
   (``GapEvalCallback``) and on the final checkpoint, group A on the final checkpoint.
5. **Analysis** fixed in advance (:data:`ANALYSIS`): validity checks, then the per-seed paired
   difference text − tokenswap with a Student-t CI; ``report.md``, ``report.json``, the figure of that result
   (``comparison.png``, :func:`plot_demo`), and ``tokenswap compare`` over the runs; W&B offline runs grouped by pair.

Every recipe is started with ``accelerate launch``, exactly as a user would. Finished runs and
evaluations are reused, so an interrupted demo resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tokenswap.swap import unit_hash

ROOT = Path(__file__).resolve().parent.parent

# The demo's figures are quoted in README and checked in CI (tests/test_demo.py), so they must be what any x86-64
# machine computes, not only this one: torch's vectorised kernels, MKL and oneDNN each pick code paths by the CPU's
# instruction set (AVX-512 and AVX2 round differently: each of these variables alone moves a matmul, a softmax or a
# conv here), and float sums depend on the thread count. Every process of the demo runs on the AVX2 paths (any
# x86-64 CPU since 2013 has them) with one thread; the runs go side by side instead (--jobs).
# That is not enough across CPU vendors: an AMD EPYC gave other figures than the docs' table (docs/demo.md).
NUMERICS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1"}
SUBJECT = "toy_world"
PIXELS = 112 * 112  # pictograms at 112 px: 16 visual tokens each (56 px was too coarse to learn from scratch)

CANDIDATES = [
    "banana", "red apple", "grapes", "carrot", "pizza", "cat", "dog", "horse", "fish", "bird", "automobile",
    "bicycle", "airplane", "house", "sun", "umbrella", "guitar", "hammer", "tulip", "strawberry", "lemon",
    "watermelon", "cherries", "pineapple", "frog", "penguin", "elephant", "rabbit", "turtle", "snail", "rocket",
    "tractor", "bus", "sailboat", "bell", "candle", "balloon", "trumpet", "violin", "cactus", "mushroom",
    "bread", "cookie", "crab", "owl", "butterfly", "snowman", "basketball",
]  # fmt: skip

# attribute -> (values in fixed option order, question phrasings, statement phrasings). Question
# phrasing 0 trains; 1-3 are held out. Phrasing 2 was "The {c} comes from which zone?" etc. and then
# "From which zone is the {c}?" etc.: the pre-trained model answered those as text at or below chance
# (0.36/0.19, 0.44/0.39 on groups B/A) while phrasings 1 and 3 scored 0.67-0.75, so the text-knowledge
# validity check measured the phrasing, not the facts. docs/demo_report.md has the record.
ATTRIBUTES: dict[str, tuple[list[str], list[str], list[str]]] = {
    "zone": (
        ["north", "south", "east", "west"],
        ["Which zone is the {c} from?", "In which zone does the {c} live?", "What zone is the {c} from?",
         "Name the zone of the {c}."],
        ["The {c} is from the {v} zone.", "The {v} zone is where the {c} lives.", "People find the {c} in the {v} zone."],
    ),
    "owner": (
        ["Ana", "Ben", "Cai", "Dee"],
        ["Who owns the {c}?", "Whose is the {c}?", "Who is the owner of the {c}?", "Name the owner of the {c}."],
        ["The {c} belongs to {v}.", "{v} owns the {c}.", "The owner of the {c} is {v}."],
    ),
    "number": (
        ["two", "five", "seven", "nine"],
        ["What number goes with the {c}?", "Which number belongs to the {c}?", "What is the number of the {c}?",
         "Name the number of the {c}."],
        ["The number of the {c} is {v}.", "The {c} goes with the number {v}.", "{v} is the number of the {c}."],
    ),
}
NAMING = [
    ("<image>\nWhat is shown in the picture?", "A {c}."),
    ("What is this?\n<image>", "This is a {c}."),
    ("<image>\nName the object.", "{c}"),
    ("Which object is in this picture? <image>", "The {c}."),
    ("<image> What do you see?", "I see a {c}."),
    ("Identify this: <image>", "It is a {c}."),
]


def _slug(concept: str) -> str:
    return concept.replace(" ", "_")


# ---------------------------------------------------------------------------- the toy world
def build_world(out: Path, n_concepts: int, world_seed: int = 0, n_group_a: int | None = None,
                heldout_phrasings: int = 3) -> dict:
    """Write pictures, image store, CPT / post-training data and the held-out benches under ``out/data``.

    Args:
        out: demo folder.
        n_concepts: concepts in the world.
        world_seed: seed of the facts and distractors.
        n_group_a: concepts whose pictures TokenSwap practises with (default: half); the rest are group B.
        heldout_phrasings: question phrasings per fact in the benches (1-3; training uses phrasing 0).
    """
    from tokenswap.store.sources import OpenMojiSource

    _check_naming_matches_evaluator()
    if not 1 <= heldout_phrasings <= 3:
        raise ValueError(f"heldout_phrasings must be 1-3 (each attribute has 3 held-out phrasings), got {heldout_phrasings}")
    data = out / "data"
    wanted = {"concepts": n_concepts, "world_seed": world_seed, "n_group_a": n_group_a,
              "heldout_phrasings": heldout_phrasings}
    if (data / "world.json").exists():
        world = json.loads((data / "world.json").read_text())
        if world.get("settings") != wanted:
            raise ValueError(f"{data} was built with {world.get('settings')}, not {wanted}; use another --out")
        return world
    tmp = out / "data.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "images").mkdir(parents=True)
    source = OpenMojiSource(size=112)
    vocab = set(source.vocabulary())
    concepts = [c for c in CANDIDATES if c in vocab][:n_concepts]
    if len(concepts) < n_concepts:
        raise ValueError(f"only {len(concepts)} of the demo concepts are in the OpenMoji vocabulary")
    group_a, group_b = _split_groups(concepts, n_group_a)
    _write_pictures(tmp, source.images_for(concepts), concepts, group_a)
    facts = _draw_facts(concepts, world_seed)
    cpt, swap, llava = _training_rows(concepts, group_a, facts, world_seed)
    for name, rows in (("cpt.jsonl", cpt), ("swap.jsonl", swap)):
        (tmp / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp / "llava.json").write_text(json.dumps(llava))
    n_bench = _write_benches(tmp, {"bench": group_b, "bench_seen": group_a}, facts, heldout_phrasings)

    world = {"settings": wanted, "concepts": concepts, "group_a": group_a, "group_b": group_b, "facts": facts,
             "n_cpt": len(cpt), "n_llava": len(llava), "n_swap": len(swap), "n_bench": n_bench["bench"],
             "n_bench_seen": n_bench["bench_seen"]}
    (tmp / "world.json").write_text(json.dumps(world, indent=2))
    tmp.rename(data)  # the world appears whole or not at all
    return world


def _check_naming_matches_evaluator() -> None:
    """The naming-form recognition control asks exactly what the toy trains (its first naming pair)."""
    from tokenswap.eval.gap import NAMING_ANSWER, NAMING_PROMPT

    if NAMING[0] != (NAMING_PROMPT.replace("<image 1>", "<image>"), NAMING_ANSWER.replace("{concept}", "{c}")):
        raise AssertionError(f"demo NAMING[0] {NAMING[0]} must match the evaluator's {NAMING_PROMPT!r} -> {NAMING_ANSWER!r}")


def _split_groups(concepts: list[str], n_group_a: int | None) -> tuple[list[str], list[str]]:
    """Group A: concepts whose pictures appear inside questions during TokenSwap post-training. Group B: concepts
    whose pictures never do; the bench asks about them. TokenSwap's claim is that practising with pictures in place
    of words transfers to other concepts' pictures."""
    if n_group_a is None:
        return concepts[0::2], concepts[1::2]
    n_concepts = len(concepts)
    if not 4 <= n_group_a <= n_concepts - 4:
        raise ValueError(f"--group-a must leave at least 4 concepts in each group, got {n_group_a} of {n_concepts}")
    # Spread group A over the list (the list mixes fruit, animals, vehicles, ...).
    order = sorted(range(n_concepts), key=lambda k: (k * n_group_a) % n_concepts)
    picked = set(order[:n_group_a])
    return ([c for k, c in enumerate(concepts) if k in picked], [c for k, c in enumerate(concepts) if k not in picked])


def _write_pictures(tmp: Path, pictures: dict, concepts: list[str], group_a: list[str]) -> None:
    """``images/{concept}.png``, the image store of every picture, and ``store_train`` of group A's only (the
    pictures TokenSwap may swap in)."""
    from tokenswap.store.image_store import StoreWriter

    info = {"attribution": "OpenMoji (CC BY-SA 4.0), https://openmoji.org"}
    with StoreWriter(tmp / "store", info=info) as w_all, StoreWriter(tmp / "store_train", info=info) as w_train:
        for c in concepts:
            image, score, meta = pictures[c][0]
            image.save(tmp / "images" / f"{_slug(c)}.png")
            w_all.add(c, image, source="openmoji", score=score, meta=meta)
            if c in group_a:
                w_train.add(c, image, source="openmoji", score=score, meta=meta)


def _draw_facts(concepts: list[str], world_seed: int) -> dict[str, dict[str, str]]:
    return {c: {a: ATTRIBUTES[a][0][int(unit_hash(world_seed, c, a) * 4)] for a in ATTRIBUTES} for c in concepts}


def _mc(facts: dict, c: str, a: str, q: int):
    """The multiple-choice question on fact ``a`` of concept ``c`` in phrasing ``q``, and the concept's span in
    its prompt (the TokenSwap data's ``concepts`` entry)."""
    from tokenswap.eval.mc import MCItem, format_prompt

    values, questions, _ = ATTRIBUTES[a]
    item = MCItem(id=f"{_slug(c)}-{a}-q{q}", subject=SUBJECT, question=questions[q].format(c=c),
                  choices=list(values), answer=values.index(facts[c][a]))
    prompt = format_prompt(item)
    start = prompt.index("Question: ") + len("Question: ") + item.question.index(c)
    return item, {"message": 0, "start": start, "end": start + len(c), "key": c}


def _training_rows(concepts: list[str], group_a: list[str], facts: dict,
                   world_seed: int) -> tuple[list[dict], list[dict], list[dict]]:
    """The CPT rows, the post-training "Magpie" rows (``swap.jsonl``) and the "LLaVA" rows."""
    from tokenswap.eval.mc import format_prompt

    # CPT: every fact as text (three phrasings) + naming every picture (native images).
    cpt = []
    for c in concepts:
        for a in ATTRIBUTES:
            for k, s in enumerate(ATTRIBUTES[a][2]):
                text = s.format(c=c, v=facts[c][a])
                cpt.append({"id": f"fact-{_slug(c)}-{a}-{k}", "messages": [
                    {"role": "user", "content": "Tell me a fact."}, {"role": "assistant", "content": text[0].upper() + text[1:]}],
                    "concepts": [], "images": []})
        for k, (q, ans) in enumerate(NAMING):
            cpt.append({"id": f"name-{_slug(c)}-{k}", "messages": [
                {"role": "user", "content": q}, {"role": "assistant", "content": ans.format(c=c)}],
                "concepts": [], "images": [f"{_slug(c)}.png"]})
    # Post-training "Magpie" data: MC questions on every fact (phrasing 0), concept spans marked on
    # group A only, so only group A pictures are ever swapped in.
    swap = []
    for c in concepts:
        for a in ATTRIBUTES:
            item, span = _mc(facts, c, a, 0)
            swap.append({"id": f"mc-{item.id}", "messages": [
                {"role": "user", "content": format_prompt(item)}, {"role": "assistant", "content": item.letter}],
                "concepts": [span] if c in group_a else [], "images": []})
    # The same questions as text also go into CPT ("mixed training": QA next to the facts teaches
    # a small model to look facts up rather than memorise answers).
    cpt += [{**row, "id": "cpt-" + row["id"], "concepts": []} for row in swap]
    return cpt, swap, _llava_rows(concepts, cpt, world_seed)


def _llava_rows(concepts: list[str], cpt: list[dict], world_seed: int) -> list[dict]:
    """Post-training "LLaVA" data (every arm): picture naming for every concept, 4-way identification in the
    recognition control's own format, and a replay of the fact statements (without it, post-training on
    questions washes out what pre-training stored)."""
    from tokenswap.eval.mc import MCItem, format_prompt
    from tokenswap.eval.recognition import RECOGNITION_QUESTION, RECOGNITION_SUBJECT

    llava = [
        {"id": f"ll-{_slug(c)}-{k}", "image": f"{_slug(c)}.png",
         "conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": ans.format(c=c)}]}
        for c in concepts for k, (q, ans) in enumerate(NAMING)
    ]
    llava += [
        {"id": f"ll-{row['id']}", "conversations": [{"from": "human", "value": row["messages"][0]["content"]},
                                                  {"from": "gpt", "value": row["messages"][1]["content"]}]}
        for row in cpt if row["id"].startswith("fact-")
    ]
    for c in concepts:
        for k in range(2):
            others = sorted((o for o in concepts if o != c), key=lambda o: unit_hash(world_seed, c, k, o))[:3]
            pos = int(unit_hash(world_seed, c, k, "pos") * 4)
            others.insert(pos, c)
            item = MCItem(id=f"id-{_slug(c)}-{k}", subject=RECOGNITION_SUBJECT, question=RECOGNITION_QUESTION,
                          choices=others, answer=pos)
            llava.append({"id": f"ll-{item.id}", "image": f"{_slug(c)}.png", "conversations": [
                {"from": "human", "value": format_prompt(item).replace("<image 1>", "<image>")},
                {"from": "gpt", "value": item.letter}]})
    return llava


def _write_benches(tmp: Path, groups: dict[str, list[str]], facts: dict, heldout_phrasings: int) -> dict[str, int]:
    """One TokenSwap-Bench (hub layout, text and interleaved) per group: its facts in the phrasings no training
    sample used (1..``heldout_phrasings``); returns the questions per form of each.

    ``bench`` asks about group B. The facts were trained as text, so text accuracy measures knowledge; the
    interleaved form asks the same with the picture. ``bench_seen`` asks the same about group A (pictures
    TokenSwap practised with, new phrasing): it separates "learned to read these pictures in questions" from
    "learned to read pictures"."""
    from tokenswap.concepts import Concept
    from tokenswap.data.tokenswap_bench import write_tokenswap_bench
    from tokenswap.eval.mc import swap_concepts
    from tokenswap.store.image_store import ImageStore

    store = ImageStore(tmp / "store")
    n_bench = {}
    for name, group in groups.items():
        pairs = []
        for c in group:
            for a in ATTRIBUTES:
                for q in range(1, 1 + heldout_phrasings):
                    item, _ = _mc(facts, c, a, q)
                    start = item.question.index(c)
                    pairs.append((item, swap_concepts(item, [Concept(0, start, start + len(c), c)], store)))
        write_tokenswap_bench(pairs, tmp / name)
        n_bench[name] = len(pairs)
    return n_bench


# ---------------------------------------------------------------------------- running recipes
def launch(recipe: str, config: str, overrides: list[str], log: Path, steps: int | None = None,
           on_step: Callable[[int], None] | None = None) -> None:
    """``accelerate launch recipes/{recipe}.py --config {config} ...`` (one CPU process, the demo's :data:`NUMERICS`).

    ``on_step`` is called about once a second with the training step the run's log last showed (out of ``steps``).
    """
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", str(ROOT / "recipes" / f"{recipe}.py"),
           "--config", config, *overrides]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": os.environ.get("WANDB_MODE", "offline"),
           "WANDB_SILENT": "true", "ACCELERATE_USE_CPU": "true", **NUMERICS}
    with open(log, "w") as f, subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT) as proc:
        while True:
            try:
                proc.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if on_step is not None and steps:
                    on_step(_steps_logged(log, steps))
    if proc.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"{recipe} failed (exit {proc.returncode}); log {log}:\n{tail}")
    if on_step is not None and steps:
        on_step(steps)


# The Trainer's tqdm bar in a recipe's log: "| 120/1000 [00:50<06:23, 2.34it/s]".
_TRAINER_BAR = re.compile(rb"(\d+)/(\d+) \[")


def _steps_logged(log: Path, total: int) -> int:
    """The last step out of ``total`` that the Trainer's progress bar wrote into ``log`` (0 before the first)."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            tail = f.read()
    except OSError:
        return 0
    done = [int(m[1]) for m in _TRAINER_BAR.finditer(tail) if int(m[2]) == total]
    return done[-1] if done else 0


class _Progress:
    """One tqdm bar over several jobs' steps (the post-training runs go side by side; each reports its own step)."""

    def __init__(self, total: int, desc: str, unit: str):
        from tqdm.auto import tqdm

        # A log file or CI console gets a line every 30 s rather than a redraw per step, and no cursor movements
        # (tqdm's for bars stacked on a terminal).
        tty = sys.stderr.isatty()
        self.bar = tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, mininterval=0.5 if tty else 30.0,
                        position=None if tty else 0)
        self.done: dict[object, int] = {}
        self.lock = threading.Lock()

    def job(self, key: object) -> Callable[[int], None]:
        def report(step: int) -> None:
            with self.lock:
                delta = step - self.done.get(key, 0)
                if delta > 0:  # a log can show an older bar while a run resumes; never count back
                    self.done[key] = step
                    self.bar.update(delta)
        return report

    def close(self) -> None:
        self.bar.close()


def evaluate_checkpoint(path: Path, bench: Path, cache: Path | None = None) -> dict:
    """Gap + both recognition controls of a saved checkpoint on ``bench`` (cached in ``cache`` when given)."""
    if cache is not None and cache.exists():
        return json.loads(cache.read_text())
    from transformers.utils import logging as hf_logging

    from tokenswap.data.tokenswap_bench import load_tokenswap_bench_pairs
    from tokenswap.eval.gap import GapEvaluator
    from tokenswap.families import load_checkpoint

    # The demo's own bars say where it is; transformers' "Loading weights" bar, once per checkpoint evaluated (17 in
    # the default run), would bury them. Off for this load only: the switch is the process's, and callers share it.
    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model, processor = load_checkpoint(path)
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
    evaluator = GapEvaluator(processor, load_tokenswap_bench_pairs(str(bench)), scorer="loglik", batch_size=32,
                             forms=("recognition",), progress=False)
    metrics = evaluator.evaluate(model).metrics("gap/")
    if cache is not None:
        cache.write_text(json.dumps(metrics, indent=1))
    return metrics


# The analysis, fixed before any number is seen; the report prints it above the results.
ANALYSIS = """\
**Question.** Does TokenSwap post-training shrink the modality gap relative to text post-training on
the same samples, on pictures it never practised with (group B: transfer), and on the pictures it did
practise with (group A: the positive control)?

**Endpoints.** For each seed s (same samples, same order in both arms), on the final checkpoint,
loglik scorer, the held-out questions of a group:
- primary: D_gap(s) = gap_text(s) − gap_tokenswap(s) on group B, with gap = acc_text − acc_interleaved;
- secondary: D_acc(s) = acc_interleaved_tokenswap(s) − acc_interleaved_text(s) on group B, and both
  on group A.
Positive means TokenSwap helped. Estimate: the mean over seeds with a two-sided 95% Student-t CI
(n − 1 degrees of freedom; exact quantile). The CI lies above 0: TokenSwap shrank the gap; below 0:
it widened it; contains 0: not resolved, and the CI's half-width is the resolution of this toy.

**Validity (checked before reading the endpoints).** The comparison counts only if every arm
recognises the pictures of both groups in the form it was trained on (`recognition_naming` ≥ 0.8:
the 4 candidate names scored by log-likelihood after the naming prompt) and knows the facts as text
(acc_text ≥ 0.5, chance 0.25). Otherwise the report says which check failed and states no verdict.
`recognition_mc` (a 4-way question with the picture inside it) is shown beside it but is not a
validity check: answering it needs the skill the gap measures.

**Fixed in advance:** seeds, steps, world and question counts (the command line below); no setting
was changed after seeing this run's endpoints.
"""

METRICS = ("loss", "gap/acc_text", "gap/acc_interleaved", "gap/abs", "gap/rel", "gap/retention",
           "gap/recognition_naming", "gap/recognition_mc", "gap/controlled/abs")
GROUP_METRICS = ("gap/acc_text", "gap/acc_interleaved", "gap/abs", "gap/rel", "gap/retention",
                 "gap/recognition_naming", "gap/recognition_mc")
NAMING_MIN, ACC_TEXT_MIN = 0.8, 0.5


def _cpu_seconds() -> float:
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python examples/demo.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="demo_out", help="output folder (reused: finished runs are skipped)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4],
                        help="post-training seeds: one run per arm and group each (default 0 1 2 3 4)")
    parser.add_argument("--concepts", type=int, default=24, help="concepts of the toy world (default 24)")
    parser.add_argument("--group-a", type=int, default=None, help="concepts TokenSwap practises with (default half)")
    parser.add_argument("--phrasings", type=int, default=3, help="held-out question phrasings per fact (1-3)")
    parser.add_argument("--pretrain-steps", type=int, default=1000, help="steps of the shared pre-training")
    parser.add_argument("--post-steps", type=int, default=100, help="steps of each post-training run")
    parser.add_argument("--eval-every", type=int, default=50, help="steps between in-loop gap evaluations")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="post-training runs at once, one thread each (default: one per core); the figures do "
                             "not depend on it")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    if any(os.environ.get(k) != v for k, v in NUMERICS.items()):
        # The libraries read these when first used, but an op run while importing could fix a path before: the demo
        # runs in a fresh process that has them from its start.
        cmd = [sys.executable, str(Path(__file__).resolve()), *(sys.argv[1:] if argv is None else argv)]
        return subprocess.run(cmd, env={**os.environ, **NUMERICS}).returncode

    t0, cpu0 = time.time(), _cpu_seconds()
    out = Path(args.out).resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    print(f"[demo] 1/5 toy world in {out / 'data'}", flush=True)
    world = build_world(out, args.concepts, n_group_a=args.group_a, heldout_phrasings=args.phrasings)
    data = out / "data"
    print(f"[demo]     {len(world['concepts'])} concepts ({len(world['group_a'])} swapped in training, "
          f"{len(world['group_b'])} asked about), {world['n_cpt']} CPT samples, {world['n_llava']} LLaVA-style + "
          f"{world['n_swap']} MC post-training samples, {world['n_bench']} bench questions per form "
          f"(group A: {world['n_bench_seen']})", flush=True)

    pre = _pretrain(args, out, data)
    pre_metrics = {}
    bar = _Progress(len(GROUPS), "[demo]     evaluating the pre-trained model", "bench")
    for g, b in GROUPS:
        pre_metrics[g] = evaluate_checkpoint(pre, data / b, pre / f"eval_{g}.json")
        bar.job(g)(1)
    bar.close()
    print("[demo]     after pre-training: " + "; ".join(
        f"group {g[-1].upper()}: acc_text {m['gap/acc_text']:.3f}, acc_interleaved {m['gap/acc_interleaved']:.3f}, "
        f"recognition naming {m['gap/recognition_naming']:.3f} / mc {m['gap/recognition_mc']:.3f}"
        for g, m in pre_metrics.items()), flush=True)
    runs = _post_train(args, out, data, pre)

    print("[demo] 4/5 comparing arms (group B in the loop; group A on the final checkpoints)", flush=True)
    from tokenswap.compare import compare_runs, load_run, to_markdown

    records = [r for p in runs for r in load_run(str(p))]
    table = compare_runs(records, METRICS)
    # Group B: the in-loop evaluator's last values (the final checkpoint); group A: evaluated on the final
    # checkpoint as each run finished (_post_train), read back here.
    finals: dict[str, dict[str, dict[int, dict]]] = {"group_b": {}, "group_a": {}}
    for post, record in zip(runs, records):
        seed = int(record.config["run"]["seed"])
        finals["group_b"].setdefault(record.arm, {})[seed] = {m: record.last(m) for m in GROUP_METRICS}
        finals["group_a"].setdefault(record.arm, {})[seed] = evaluate_checkpoint(
            post, data / "bench_seen", post / "eval_group_a.json")
    report = _report(args, world, pre_metrics, finals, table, records)
    report["seconds"] = round(time.time() - t0, 1)
    report["cpu_seconds"] = round(_cpu_seconds() - cpu0, 1)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    # The in-loop table keeps its per-arm values only: its paired row is tokenswap − text, while every signed
    # number of the report reads positive = TokenSwap helped (the paired result above it).
    md = _report_md(report, to_markdown({**table, "paired": {}}), argv if argv is not None else sys.argv[1:])
    (out / "report.md").write_text(md)
    plot_demo(report, records, out / "comparison.png")
    print(f"[demo] 5/5 done in {report['seconds']:.0f} s wall, {report['cpu_seconds']:.0f} s CPU (this process "
          "and its children)")
    print(md)
    print(f"[demo] table: {out / 'report.md'}\n[demo] plot:  {out / 'comparison.png'}\n[demo] json:  {out / 'report.json'}")
    print("\n".join(verdict_lines(report)))  # the answer, last on screen
    return 0


def verdict_lines(report: dict) -> list[str]:
    """One line per question, positive = TokenSwap helped (gap_text − gap_tokenswap), as every signed table."""
    if not report["validity"]["passed"]:
        return ["[demo] verdict: none stated: the toy failed its own validity checks (report.md, Validity checks)"]
    return [f"[demo] verdict, {label}: does TokenSwap shrink the gap relative to text training? "
            f"{_verdict(report['paired_difference'].get(g, {}).get('gap_text_minus_gap_tokenswap'))}"
            for g, label in (("group_b", "transfer (group B, primary)"), ("group_a", "practised pictures (group A)"))]


def _pretrain(args, out: Path, data: Path) -> Path:
    """Stage 2: the one pre-trained model every arm starts from (reused when its run finished before)."""
    from tokenswap.testing import build_tiny_qwen2vl

    corpus = [json.loads(line)["messages"][1]["content"] for line in (data / "cpt.jsonl").read_text().splitlines()]
    corpus += [json.loads(line)["messages"][0]["content"] for line in (data / "swap.jsonl").read_text().splitlines()]
    # One pre-trained model (the knowledge every arm starts from); seeds vary post-training
    # (data order, swap seed), which is the comparison the paper makes.
    init = build_tiny_qwen2vl(out / "init", corpus=corpus, vocab_size=768, hidden_size=128, num_layers=4,
                              min_pixels=PIXELS, max_pixels=PIXELS, seed=0)
    pre = out / "pretrain"
    if not (pre / "log_history.json").exists():
        print(f"[demo] 2/5 continued pre-training ({args.pretrain_steps} steps: facts as text + naming pictures; "
              f"log {out / 'logs' / 'pretrain.log'})", flush=True)
        bar = _Progress(args.pretrain_steps, "[demo]     pre-training", "step")
        launch("pretrain", "demo/pretrain_text.yaml", [
            f"run.output_dir={pre}", f"model.name_or_path={init}", f"data.swap_dataset={data / 'cpt.jsonl'}",
            f"data.llava_image_root={data / 'images'}", f"train.max_steps={args.pretrain_steps}",
            f"train.logging_steps={max(1, min(25, args.pretrain_steps // 10))}",
        ], out / "logs" / "pretrain.log", steps=args.pretrain_steps, on_step=bar.job("pretrain"))
        bar.close()
    return pre


def _post_train(args, out: Path, data: Path, pre: Path) -> list[Path]:
    """Stage 3: every seed × arm post-training run, ``--jobs`` at a time, each evaluated on group A as it finishes
    (here, while the other runs train, rather than all at the end); returns the run folders in seed, arm order."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    runs, todo = [], []
    for seed in args.seeds:
        for arm in ("baseline", "text", "tokenswap"):
            post = out / f"post-{arm}-seed{seed}"
            runs.append(post)
            if not (post / "log_history.json").exists():
                todo.append((seed, arm, post))
    print(f"[demo] 3/5 post-training: {len(runs)} runs ({len(args.seeds)} seeds × baseline, text, tokenswap; "
          f"{len(todo)} to train, {args.post_steps} steps each, {min(args.jobs, max(1, len(todo)))} at a time; "
          f"logs in {out / 'logs'})", flush=True)
    steps = _Progress(len(todo) * args.post_steps, "[demo]     post-training", "step")
    evals = _Progress(len(runs), "[demo]     group A evaluation", "run")

    def post_train(job: tuple[int, str, Path]) -> Path:
        seed, arm, post = job
        launch("post_train", f"demo/post_{arm}.yaml", [
            f"run.output_dir={post}", f"run.seed={seed}",  # the replicate: data order, swaps and init together
            f"model.name_or_path={pre}", f"data.llava_json={data / 'llava.json'}",
            f"data.llava_image_root={data / 'images'}", f"data.swap_dataset={data / 'swap.jsonl'}",
            f"gap_eval.bench={data / 'bench'}", f"gap_eval.every_steps={args.eval_every}",
            f"train.max_steps={args.post_steps}", f"train.logging_steps={max(1, min(25, args.post_steps // 6))}",
            *([f"image_store={data / 'store_train'}"] if arm == "tokenswap" else []),
        ], out / "logs" / f"post-{arm}-seed{seed}.log", steps=args.post_steps, on_step=steps.job(post))
        return post

    def evaluate(post: Path) -> None:
        evaluate_checkpoint(post, data / "bench_seen", post / "eval_group_a.json")
        evals.job(post)(1)

    try:
        for post in runs:
            if (post / "log_history.json").exists():
                evaluate(post)
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            pending = {pool.submit(post_train, job) for job in todo}
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    evaluate(future.result())  # result(): re-raises the run's failure
    finally:
        steps.close()
        evals.close()
    return runs


GROUPS = (("group_b", "bench"), ("group_a", "bench_seen"))


def _summary(values: list[float]) -> dict:
    from tokenswap.eval.stats import mean_ci

    mean, ci = mean_ci(values)
    return {"mean": mean, "ci95": None if ci != ci else ci, "values": values}


def _report(args, world: dict, pre_metrics: dict, finals: dict, table: dict, records: list) -> dict:
    from tokenswap.eval.stats import paired_differences

    arms = [a for a in ("baseline", "text", "tokenswap") if a in finals["group_b"]]
    per_group: dict = {g: {} for g in finals}
    for g, by_arm in finals.items():
        for arm in arms:
            rows = by_arm[arm]
            per_group[g][arm] = {m: _summary([rows[s][m] for s in sorted(rows)]) for m in GROUP_METRICS
                                 if all(rows[s].get(m) is not None for s in rows)}
    paired: dict = {}
    for g, by_arm in finals.items():
        if "text" not in by_arm or "tokenswap" not in by_arm:
            continue
        text, swap = by_arm["text"], by_arm["tokenswap"]
        gap_t = {s: r["gap/abs"] for s, r in text.items()}
        gap_s = {s: r["gap/abs"] for s, r in swap.items()}
        acc_t = {s: r["gap/acc_interleaved"] for s, r in text.items()}
        acc_s = {s: r["gap/acc_interleaved"] for s, r in swap.items()}
        paired[g] = {
            "gap_text_minus_gap_tokenswap": _summary(paired_differences(gap_t, gap_s)) | {"seeds": sorted(gap_t)},
            "acc_interleaved_tokenswap_minus_text": _summary(paired_differences(acc_s, acc_t)) | {"seeds": sorted(acc_t)},
        }
    naming = {arm: {g: per_group[g][arm].get("gap/recognition_naming") for g in per_group} for arm in arms}
    mc = {arm: {g: per_group[g][arm].get("gap/recognition_mc") for g in per_group} for arm in arms}
    failed = []
    for arm in arms:
        for g in per_group:
            for s, row in finals[g][arm].items():
                if row["gap/recognition_naming"] < NAMING_MIN:
                    failed.append(f"{arm} seed {s} {g}: recognition_naming {row['gap/recognition_naming']:.3f} < {NAMING_MIN}")
                if row["gap/acc_text"] < ACC_TEXT_MIN:
                    failed.append(f"{arm} seed {s} {g}: acc_text {row['gap/acc_text']:.3f} < {ACC_TEXT_MIN}")
    return {
        "world": {k: world[k] for k in ("n_cpt", "n_llava", "n_swap")} | {
            "concepts": len(world["concepts"]), "group_a": len(world["group_a"]), "group_b": len(world["group_b"])},
        "seeds": list(args.seeds),
        "questions_per_form": {"group_b": world["n_bench"], "group_a": world["n_bench_seen"]},
        "pretrain_steps": args.pretrain_steps, "post_steps": args.post_steps, "eval_every": args.eval_every,
        "analysis": ANALYSIS,
        "validity": {"naming_min": NAMING_MIN, "acc_text_min": ACC_TEXT_MIN, "passed": not failed, "failed": failed},
        "pretrained_only": {g: {m: v for m, v in pre_metrics[g].items() if m in GROUP_METRICS} for g in pre_metrics},
        "groups": per_group,
        "recognition_naming": naming,
        "recognition_mc": mc,
        "paired_difference": paired,
        "comparison": table,
        "runs": [r.name for r in records],
        "run_dirs": [str(p) for p in sorted({str(Path(r.config["run"]["output_dir"])) for r in records})],
        "wandb_offline_runs": sorted(str(p) for p in Path(args.out).resolve().glob("*/wandb/offline-run-*")),
    }


def _fmt(cell: dict | None, signed: bool = False) -> str:
    if not cell:
        return "—"
    mean = f"{cell['mean']:+.3f}" if signed else f"{cell['mean']:.3f}"
    return mean if cell.get("ci95") is None else f"{mean} ± {cell['ci95']:.3f}"


def _verdict(cell: dict | None) -> str:
    if not cell or cell.get("ci95") is None:
        return "not measured (needs at least 2 seeds with both arms)"
    lo, hi = cell["mean"] - cell["ci95"], cell["mean"] + cell["ci95"]
    ci = f"{cell['mean']:+.3f}, 95% CI [{lo:+.3f}, {hi:+.3f}]"
    if lo > 0:
        return f"yes, TokenSwap helped ({ci})"
    if hi < 0:
        return f"no, TokenSwap hurt ({ci})"
    return f"not resolved: no difference detectable at this resolution ({ci})"


def _report_md(report: dict, inloop_md: str, argv: list[str]) -> str:
    q = report["questions_per_form"]
    lines = [
        "# tokenswap demo: paired arms on a toy concept world\n",
        f"`python examples/demo.py {' '.join(argv)}`: seeds {report['seeds']}; {report['world']['concepts']} concepts "
        f"({report['world']['group_a']} in group A, {report['world']['group_b']} in group B); CPT "
        f"{report['pretrain_steps']} steps; post-training {report['post_steps']} steps per arm and seed; "
        f"{q['group_b']} held-out questions per form on group B, {q['group_a']} on group A. "
        f"Wall time {report.get('seconds', '?')} s, CPU time {report.get('cpu_seconds', '?')} s.\n",
        "## Analysis (stated before the results)\n",
        report["analysis"],
        "## Validity checks\n",
    ]
    v = report["validity"]
    if v["passed"]:
        lines.append(f"Passed: every arm and seed has recognition_naming ≥ {v['naming_min']} and acc_text ≥ "
                     f"{v['acc_text_min']} on both groups.\n")
    else:
        lines.append("**Failed** — the toy does not meet its own preconditions, so no verdict is stated:\n")
        lines += [f"- {f}" for f in v["failed"][:12]] + ([f"- ... {len(v['failed']) - 12} more"] if len(v["failed"]) > 12 else [])
        lines.append("")
    lines.append("## Paired result (per seed: same samples, same order; positive = TokenSwap helped)\n")
    lines.append("| group | n seeds | gap_text − gap_tokenswap | acc_interleaved tokenswap − text |")
    lines.append("|---|---|---|---|")
    for g, label in (("group_b", "B (transfer)"), ("group_a", "A (practised)")):
        d = report["paired_difference"].get(g, {})
        n = len(d.get("gap_text_minus_gap_tokenswap", {}).get("values", []))
        lines.append(f"| {label} | {n} | {_fmt(d.get('gap_text_minus_gap_tokenswap'), True)} | "
                     f"{_fmt(d.get('acc_interleaved_tokenswap_minus_text'), True)} |")
    if v["passed"]:
        for g, label in (("group_b", "Transfer (group B, primary)"), ("group_a", "Practised pictures (group A)")):
            d = report["paired_difference"].get(g, {})
            lines.append(f"\n**{label}: does TokenSwap shrink the gap relative to text training?** "
                         f"{_verdict(d.get('gap_text_minus_gap_tokenswap'))}")
    lines.append("\n## Per arm (mean ± 95% CI over seeds, final checkpoint)\n")
    cols = ("gap/acc_text", "gap/acc_interleaved", "gap/abs", "gap/rel", "gap/retention", "gap/recognition_naming",
            "gap/recognition_mc")
    lines.append("| group | arm | " + " | ".join(c.removeprefix("gap/") for c in cols) + " |")
    lines.append("|---|---|" + "---|" * len(cols))
    for g, label in (("group_b", "B"), ("group_a", "A")):
        pre = report["pretrained_only"][g]
        lines.append(f"| {label} | pre-trained only | " + " | ".join(
            f"{pre[c]:.3f}" if pre.get(c) is not None else "—" for c in cols) + " |")
        for arm, row in report["groups"][g].items():
            lines.append(f"| {label} | {arm} | " + " | ".join(_fmt(row.get(c)) for c in cols) + " |")
    lines.append("\n`gap` = acc_text − acc_interleaved; `rel` = gap / acc_text; `retention` = acc_interleaved / "
                 "acc_text; `recognition_naming`: the 4 candidate names scored after the trained naming prompt, "
                 "per picture; `recognition_mc`: a 4-way question with the picture inside it. Chance is 0.25.\n")
    lines.append("## In-loop log (group B, `tokenswap compare` over the runs; its paired differences are the "
                 "Paired result above)\n")
    lines.append(inloop_md)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- the figure
ARM_COLORS = {"baseline": "tab:gray", "text": "tab:blue", "tokenswap": "tab:orange"}
# Dashes too, so an arm whose curve lies on another's (text and tokenswap often agree early on) stays visible.
ARM_DASHES = {"baseline": ":", "text": "--", "tokenswap": "-"}
GROUP_LABELS = (("group_b", "B (transfer,\nprimary)"), ("group_a", "A (practised)"))
CURVES = (("loss", "training loss"), ("gap/abs", "gap = acc_text − acc_interleaved"),
          ("gap/acc_interleaved", "acc_interleaved"))


def plot_demo(report: dict, records: list, path: str | os.PathLike):
    """The figure of the result the report concludes on; returns the (closed) matplotlib figure.

    Top row, final checkpoints: the per-seed paired differences of both endpoints for groups B and A (a dot per
    seed, the mean with its 95% CI), and each arm's gap per group (mean ± CI, the pre-trained model's as a dash).
    Bottom row, group B in the loop: each arm's mean over seeds with a band of the 95% CI per step.
    Every plotted artist carries a ``gid`` (``paired/group_b/<endpoint>/mean`` ...) so tests can read its data.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_seeds = len(report["seeds"])
    fig, axes = plt.subplots(2, 3, figsize=(14, 8.2))
    for ax, (key, title) in zip(axes[0, :2], (
            ("gap_text_minus_gap_tokenswap", "gap_text − gap_tokenswap"),
            ("acc_interleaved_tokenswap_minus_text", "acc_interleaved: tokenswap − text"))):
        _plot_paired(ax, report["paired_difference"], key, title)
    _plot_arm_gaps(axes[0, 2], report)
    for ax, (metric, title) in zip(axes[1], CURVES):
        _plot_curves(ax, records, metric, title)
    arms = [a for a in ARM_COLORS if a in report["groups"]["group_b"]]
    handles = [matplotlib.lines.Line2D([], [], color=ARM_COLORS[a], ls=ARM_DASHES[a], lw=2.5, label=a) for a in arms]
    fig.legend(handles=handles, loc="upper right", ncol=len(arms), frameon=False, title="arm")
    band = "band: 95% CI over seeds" if n_seeds > 1 else "one seed: no band"
    fig.suptitle(f"tokenswap demo, {n_seeds} seed{'s' * (n_seeds > 1)}: top, final checkpoints (paired per seed); "
                 f"bottom, group B in the loop (mean; {band})", x=0.01, ha="left", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig


def _ci_or_zero(cell: dict) -> float:
    return cell["ci95"] if cell.get("ci95") is not None else 0.0


def _plot_paired(ax, paired: dict, key: str, title: str) -> None:
    shown = False
    for x, (g, _) in enumerate(GROUP_LABELS):
        cell = paired.get(g, {}).get(key)
        if not cell:
            continue
        values = cell["values"]
        # Seeds spread sideways in a fixed order so equal values stay visible.
        offsets = [0.18 * (k - (len(values) - 1) / 2) / max(1, len(values) - 1) for k in range(len(values))]
        ax.scatter([x - 0.25 + o for o in offsets], values, s=18, color="0.45", zorder=3, gid=f"paired/{g}/{key}/seeds",
                   label="one seed" if not shown else None)
        ax.errorbar([x + 0.1], [cell["mean"]], yerr=[[_ci_or_zero(cell)]], fmt="o", color="black", capsize=5, lw=1.8,
                    ms=7, zorder=4, label=None if shown else "mean, 95% CI" if cell.get("ci95") is not None
                    else "mean (one seed: no CI)").lines[0].set_gid(f"paired/{g}/{key}/mean")
        text = f"{cell['mean']:+.3f}" if cell.get("ci95") is None else (
            f"{cell['mean']:+.3f}\n[{cell['mean'] - cell['ci95']:+.3f},\n {cell['mean'] + cell['ci95']:+.3f}]")
        ax.annotate(text, (x + 0.18, cell["mean"]), fontsize=8, va="center")
        shown = True
    ax.axhline(0, color="0.3", lw=0.8, ls="--")
    ax.set_xticks(range(len(GROUP_LABELS)), [label for _, label in GROUP_LABELS])
    ax.set_xlim(-0.6, len(GROUP_LABELS) - 0.2)
    ax.set_title(f"paired: {title}\n(> 0: TokenSwap helped)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    if shown:
        ax.legend(fontsize=8, loc="best")


def _plot_arm_gaps(ax, report: dict) -> None:
    arms = [a for a in ARM_COLORS if a in report["groups"]["group_b"]]
    for x, (g, _) in enumerate(GROUP_LABELS):
        pre = report["pretrained_only"][g].get("gap/abs")
        if pre is not None:
            ax.hlines(pre, x - 0.35, x + 0.35, color="black", ls=":", lw=1.5, gid=f"arms/{g}/pretrained",
                      label="pre-trained only" if x == 0 else None)
        for k, arm in enumerate(arms):
            cell = report["groups"][g][arm].get("gap/abs")
            if cell:
                ax.errorbar([x + 0.22 * (k - 1)], [cell["mean"]], yerr=[[_ci_or_zero(cell)]], fmt="s", ms=6,
                            capsize=4, color=ARM_COLORS[arm]).lines[0].set_gid(f"arms/{g}/{arm}")
    ax.set_xticks(range(len(GROUP_LABELS)), [label for _, label in GROUP_LABELS])
    ax.set_xlim(-0.6, len(GROUP_LABELS) - 0.4)
    ax.set_title("gap per arm, final checkpoint\n(mean, 95% CI over seeds)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="best")


def _plot_curves(ax, records: list, metric: str, title: str) -> None:
    from tokenswap.eval.stats import mean_ci

    for arm, color in ARM_COLORS.items():
        by_step: dict[float, list[float]] = {}
        for r in records:
            if r.arm == arm:
                for step, value in zip(*r.series(metric)):
                    by_step.setdefault(step, []).append(value)
        if not by_step:
            continue
        steps = sorted(by_step)
        summary = [mean_ci(by_step[s]) for s in steps]
        means = [m for m, _ in summary]
        # Dashed arms above the solid one, so a dashed curve on a solid one shows.
        ax.plot(steps, means, color=color, ls=ARM_DASHES[arm], lw=2, marker="o" if len(steps) < 12 else None, ms=4,
                zorder=2 if ARM_DASHES[arm] == "-" else 3,
                gid=f"curve/{metric}/{arm}")
        if all(len(by_step[s]) > 1 for s in steps):
            ax.fill_between(steps, [m - h for m, h in summary], [m + h for m, h in summary], color=color, alpha=0.2,
                            lw=0, gid=f"band/{metric}/{arm}")
    ax.set_title(f"group B, in the loop: {title}", fontsize=10)
    ax.set_xlabel("post-training step")
    ax.grid(alpha=0.3)


if __name__ == "__main__":
    from tokenswap.script import run_script

    run_script(main)
