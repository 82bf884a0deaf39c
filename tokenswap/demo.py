"""The demo: a paired TokenSwap experiment on a toy concept world, end to end on a laptop CPU.

``python -m tokenswap.demo --out demo_out`` (what ``make demo`` runs):

1. **World.** ``--concepts`` OpenMoji pictograms (banana, cat, rocket, ...) each get three
   arbitrary facts (a zone, an owner, a number; drawn by hash, so nothing can be guessed from
   the picture). Concepts are split in two groups: TokenSwap practice uses group A's pictures,
   the bench asks about group B's facts with group B's pictures (which no question ever showed).
2. **Continued pre-training** (``recipes/pretrain.py``, text arm, once): a random-init tiny
   Qwen2-VL-architecture model learns every fact as text (plus, as text, the multiple-choice
   questions on the training facts) and learns to name every picture.
3. **Post-training** (``recipes/post_train.py``), per seed three arms on the same samples in the
   same order: *baseline* (picture naming and identification only, the "LLaVA data"), *text*
   (+ multiple-choice questions on the training facts), *tokenswap* (+ the same questions with the
   concept word shown as its picture).
4. **Gap evaluation** of each arm on group B's facts (a question phrasing no sample used), in
   text and interleaved form, in the
   TokenSwap-Bench format with the loglik scorer, plus the recognition control; in the loop
   (``GapEvalCallback``) and at the end.
5. **Comparison**: ``tokenswap compare`` over all arms and seeds (mean ± 95% CI), a table and
   a plot in ``--out``; W&B offline runs grouped by pair.

Every recipe is started with ``accelerate launch``, exactly as a user would.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tokenswap.swap import unit_hash

ROOT = Path(__file__).resolve().parent.parent
SUBJECT = "toy_world"
PIXELS = 112 * 112  # pictograms at 112 px: 16 visual tokens each (56 px was too coarse to learn from scratch)

CANDIDATES = [
    "banana", "red apple", "grapes", "carrot", "pizza", "cat", "dog", "horse", "fish", "bird", "automobile",
    "bicycle", "airplane", "house", "sun", "umbrella", "guitar", "hammer", "tulip", "strawberry", "lemon",
    "watermelon", "cherries", "pineapple", "frog", "penguin", "elephant", "rabbit", "turtle", "snail", "rocket",
    "tractor", "bus", "sailboat", "bell", "candle", "balloon", "trumpet", "violin", "cactus", "mushroom",
    "bread", "cookie", "crab", "owl", "butterfly", "snowman", "basketball",
]  # fmt: skip

# attribute -> (values in fixed option order, question phrasings, statement phrasings)
ATTRIBUTES: dict[str, tuple[list[str], list[str], list[str]]] = {
    "zone": (
        ["north", "south", "east", "west"],
        ["Which zone is the {c} from?", "In which zone does the {c} live?"],
        ["The {c} is from the {v} zone.", "The {v} zone is where the {c} lives.", "People find the {c} in the {v} zone."],
    ),
    "owner": (
        ["Ana", "Ben", "Cai", "Dee"],
        ["Who owns the {c}?", "Whose is the {c}?"],
        ["The {c} belongs to {v}.", "{v} owns the {c}.", "The owner of the {c} is {v}."],
    ),
    "number": (
        ["two", "five", "seven", "nine"],
        ["What number goes with the {c}?", "Which number belongs to the {c}?"],
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
def build_world(out: Path, n_concepts: int, world_seed: int = 0) -> dict:
    """Write pictures, image store, CPT / post-training data and the held-out bench under ``out/data``."""
    from tokenswap.concepts import Concept
    from tokenswap.data.tokenswap_bench import write_tokenswap_bench
    from tokenswap.eval.mc import MCItem, format_prompt, swap_concepts
    from tokenswap.eval.recognition import RECOGNITION_QUESTION, RECOGNITION_SUBJECT
    from tokenswap.store.image_store import ImageStore, StoreWriter
    from tokenswap.store.sources import OpenMojiSource

    data = out / "data"
    if (data / "world.json").exists():
        return json.loads((data / "world.json").read_text())
    tmp = out / "data.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "images").mkdir(parents=True)
    source = OpenMojiSource(size=112)
    vocab = set(source.vocabulary())
    concepts = [c for c in CANDIDATES if c in vocab][:n_concepts]
    if len(concepts) < n_concepts:
        raise ValueError(f"only {len(concepts)} of the demo concepts are in the OpenMoji vocabulary")
    pictures = source.images_for(concepts)
    # Group A: concepts whose pictures appear inside questions during TokenSwap post-training.
    # Group B: concepts whose pictures never do; the bench asks about them. TokenSwap's claim is
    # that practising with pictures in place of words transfers to other concepts' pictures.
    group_a, group_b = concepts[0::2], concepts[1::2]
    info = {"attribution": "OpenMoji (CC BY-SA 4.0), https://openmoji.org"}
    with StoreWriter(tmp / "store", info=info) as w_all, StoreWriter(tmp / "store_train", info=info) as w_train:
        for c in concepts:
            image, score, meta = pictures[c][0]
            image.save(tmp / "images" / f"{_slug(c)}.png")
            w_all.add(c, image, source="openmoji", score=score, meta=meta)
            if c in group_a:
                w_train.add(c, image, source="openmoji", score=score, meta=meta)

    attrs = list(ATTRIBUTES)
    facts = {c: {a: ATTRIBUTES[a][0][int(unit_hash(world_seed, c, a) * 4)] for a in attrs} for c in concepts}

    def mc(c: str, a: str, q: int) -> tuple[MCItem, dict]:
        values, questions, _ = ATTRIBUTES[a]
        item = MCItem(id=f"{_slug(c)}-{a}-q{q}", subject=SUBJECT, question=questions[q].format(c=c),
                      choices=list(values), answer=values.index(facts[c][a]))
        prompt = format_prompt(item)
        start = prompt.index("Question: ") + len("Question: ") + item.question.index(c)
        return item, {"message": 0, "start": start, "end": start + len(c), "key": c}

    # CPT: every fact as text (three phrasings) + naming every picture (native images).
    cpt = []
    for c in concepts:
        for a in attrs:
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
        for a in attrs:
            item, span = mc(c, a, 0)
            swap.append({"id": f"mc-{item.id}", "messages": [
                {"role": "user", "content": format_prompt(item)}, {"role": "assistant", "content": item.letter}],
                "concepts": [span] if c in group_a else [], "images": []})
    # The same questions as text also go into CPT ("mixed training": QA next to the facts teaches
    # a small model to look facts up rather than memorise answers).
    cpt += [{**row, "id": "cpt-" + row["id"], "concepts": []} for row in swap]
    # Post-training "LLaVA" data (every arm): picture naming for every concept, 4-way identification
    # in the recognition control's own format, and a replay of the fact statements (without it,
    # post-training on questions washes out what pre-training stored).
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
    for name, rows in (("cpt.jsonl", cpt), ("swap.jsonl", swap)):
        (tmp / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp / "llava.json").write_text(json.dumps(llava))

    # The bench: group B's facts in a phrasing no training sample used (phrasing 1), text and
    # interleaved, in the TokenSwap-Bench hub layout. The facts were trained as text, so text
    # accuracy measures knowledge; the interleaved form asks the same with the picture.
    # A second bench asks the same about group A (pictures TokenSwap practised with, new phrasing):
    # it separates "learned to read these pictures in questions" from "learned to read pictures".
    store = ImageStore(tmp / "store")
    for name, group in (("bench", group_b), ("bench_seen", group_a)):
        pairs = []
        for c in group:
            for a in attrs:
                item, _ = mc(c, a, 1)
                start = item.question.index(c)
                pairs.append((item, swap_concepts(item, [Concept(0, start, start + len(c), c)], store)))
        write_tokenswap_bench(pairs, tmp / name)

    world = {"concepts": concepts, "group_a": group_a, "group_b": group_b, "facts": facts, "n_cpt": len(cpt),
             "n_llava": len(llava), "n_swap": len(swap), "n_bench": len(pairs)}
    (tmp / "world.json").write_text(json.dumps(world, indent=2))
    tmp.rename(data)  # the world appears whole or not at all
    return world


# ---------------------------------------------------------------------------- running recipes
def launch(recipe: str, config: str, overrides: list[str], log: Path) -> None:
    """``accelerate launch recipes/{recipe}.py --config {config} ...`` (one CPU process)."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", str(ROOT / "recipes" / f"{recipe}.py"),
           "--config", config, *overrides]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": os.environ.get("WANDB_MODE", "offline"),
           "WANDB_SILENT": "true", "ACCELERATE_USE_CPU": "true"}
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"{recipe} failed (exit {proc.returncode}); log {log}:\n{tail}")


def evaluate_checkpoint(path: Path, bench: Path) -> dict:
    """Gap + recognition of a saved checkpoint (used for the pre-trained model before post-training)."""
    from tokenswap.data.tokenswap_bench import load_tokenswap_bench_pairs
    from tokenswap.eval.gap import GapEvaluator
    from tokenswap.testing import load_qwen2vl

    model, processor = load_qwen2vl(path)
    evaluator = GapEvaluator(processor, load_tokenswap_bench_pairs(str(bench)), scorer="loglik", batch_size=32,
                             recognition=True, progress=False)
    return evaluator.evaluate(model).metrics("gap/")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tokenswap.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="demo_out", help="output folder (reused: finished runs are skipped)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--concepts", type=int, default=24)
    parser.add_argument("--pretrain-steps", type=int, default=1000)
    parser.add_argument("--post-steps", type=int, default=120)
    parser.add_argument("--eval-every", type=int, default=40)
    args = parser.parse_args(argv)

    t0 = time.time()
    out = Path(args.out).resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    print(f"[demo] 1/5 toy world in {out / 'data'}", flush=True)
    world = build_world(out, args.concepts)
    data = out / "data"
    print(f"[demo]     {len(world['concepts'])} concepts ({len(world['group_a'])} swapped in training, "
          f"{len(world['group_b'])} asked about), {world['n_cpt']} CPT samples, {world['n_llava']} LLaVA-style + "
          f"{world['n_swap']} MC post-training samples, {world['n_bench']} bench questions per form", flush=True)

    from tokenswap.testing import build_tiny_qwen2vl

    corpus = [json.loads(line)["messages"][1]["content"] for line in (data / "cpt.jsonl").read_text().splitlines()]
    corpus += [json.loads(line)["messages"][0]["content"] for line in (data / "swap.jsonl").read_text().splitlines()]
    # One pre-trained model (the knowledge every arm starts from); seeds vary post-training
    # (data order, swap seed), which is the comparison the paper makes.
    init = build_tiny_qwen2vl(out / "init", corpus=corpus, vocab_size=768, hidden_size=128, num_layers=4,
                              min_pixels=PIXELS, max_pixels=PIXELS, seed=0)
    pre = out / "pretrain"
    if not (pre / "log_history.json").exists():
        print(f"[demo] 2/5 continued pre-training ({args.pretrain_steps} steps: facts as text + naming pictures)", flush=True)
        launch("pretrain", "demo/pretrain_text.yaml", [
            f"run.output_dir={pre}", f"model.name_or_path={init}", f"data.swap_dataset={data / 'cpt.jsonl'}",
            f"data.llava_image_root={data / 'images'}", f"train.max_steps={args.pretrain_steps}",
            f"train.logging_steps={max(1, min(25, args.pretrain_steps // 10))}",
        ], out / "logs" / "pretrain.log")
    pre_metrics = evaluate_checkpoint(pre, data / "bench")
    print(f"[demo]     after pre-training: acc_text {pre_metrics['gap/acc_text']:.3f}, acc_interleaved "
          f"{pre_metrics['gap/acc_interleaved']:.3f}, recognition {pre_metrics['gap/recognition_acc']:.3f}", flush=True)
    runs = []
    for seed in args.seeds:
        for arm in ("baseline", "text", "tokenswap"):
            post = out / f"post-{arm}-seed{seed}"
            if not (post / "log_history.json").exists():
                print(f"[demo] 3/5 seed {seed}: post-training, {arm} arm ({args.post_steps} steps)", flush=True)
                launch("post_train", f"demo/post_{arm}.yaml", [
                    f"run.output_dir={post}", f"run.seed={seed}", f"data.seed={seed}", f"collator.swap_seed={seed}",
                    f"model.name_or_path={pre}", f"data.llava_json={data / 'llava.json'}",
                    f"data.llava_image_root={data / 'images'}", f"data.swap_dataset={data / 'swap.jsonl'}",
                    f"gap_eval.bench={data / 'bench'}", f"gap_eval.every_steps={args.eval_every}",
                    f"train.max_steps={args.post_steps}", f"train.logging_steps={max(1, min(25, args.post_steps // 6))}",
                    *([f"image_store={data / 'store_train'}"] if arm == "tokenswap" else []),
                ], out / "logs" / f"post-{arm}-seed{seed}.log")
            runs.append(post)

    print("[demo] 4/5 comparing arms", flush=True)
    from tokenswap.compare import compare_runs, load_run, mean_ci, plot_runs, to_markdown

    metrics = ("loss", "gap/acc_text", "gap/acc_interleaved", "gap/abs", "gap/rel", "gap/recognition_acc",
               "gap/controlled/abs")
    records = [r for p in runs for r in load_run(str(p))]
    table = compare_runs(records, metrics)
    seen: dict[str, list[dict]] = {}
    for post, record in zip(runs, records):
        seen.setdefault(record.arm, []).append(evaluate_checkpoint(post, data / "bench_seen"))
    seen_table = {
        arm: {m: dict(zip(("mean", "ci95"), mean_ci([r[m] for r in rows]))) for m in metrics[1:5]
              if all(r.get(m) is not None for r in rows)}
        for arm, rows in seen.items()
    }
    pre_row = {m: v for m, v in pre_metrics.items() if m in metrics}
    report = {
        "world": {k: world[k] for k in ("n_cpt", "n_llava", "n_swap", "n_bench")} | {"concepts": len(world["concepts"])},
        "seeds": args.seeds, "pretrain_steps": args.pretrain_steps, "post_steps": args.post_steps,
        "pretrained_only": pre_row, "comparison": table, "seen_concepts": seen_table, "runs": [str(p) for p in runs],
        "wandb_offline_runs": sorted(str(p) for p in out.glob("*/wandb/offline-run-*")),
        "seconds": round(time.time() - t0, 1),
    }
    md = to_markdown(table)
    md_pre = "| pre-trained only (before post-training) | 1 | " + " | ".join(
        f"{pre_row[m]:.4f}" if m in pre_row else "—" for m in metrics) + " |\n"
    (out / "report.json").write_text(json.dumps(report, indent=2))
    (out / "report.md").write_text(_report_md(md + md_pre, report, table) + _seen_md(seen_table))
    plot_runs(records, metrics[:6], out / "comparison.png")
    print(f"[demo] 5/5 done in {report['seconds']:.0f} s")
    print(md + md_pre)
    print(f"[demo] table: {out / 'report.md'}\n[demo] plot:  {out / 'comparison.png'}\n[demo] json:  {out / 'report.json'}")
    return 0


def _seen_md(seen: dict) -> str:
    lines = [
        "\n## Concepts whose pictures TokenSwap practised with (group A, unseen phrasing)\n",
        "| arm | gap/acc_text | gap/acc_interleaved | gap/abs | gap/rel |",
        "|---|---|---|---|---|",
    ]
    for arm, row in seen.items():
        cells = ["—" if m not in row else f"{row[m]['mean']:.4f}" + (
            "" if row[m]["ci95"] != row[m]["ci95"] else f" ± {row[m]['ci95']:.4f}")
            for m in ("gap/acc_text", "gap/acc_interleaved", "gap/abs", "gap/rel")]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _report_md(table_md: str, report: dict, table: dict) -> str:
    arms = table["arms"]
    verdict = "not measured (missing arms)"
    if "text" in arms and "tokenswap" in arms and "gap/abs" in arms["text"] and "gap/abs" in arms["tokenswap"]:
        t, s = arms["text"]["gap/abs"], arms["tokenswap"]["gap/abs"]
        diff = t["mean"] - s["mean"]
        ci = (t["ci95"] ** 2 + s["ci95"] ** 2) ** 0.5 if t["ci95"] == t["ci95"] and s["ci95"] == s["ci95"] else float("nan")
        if ci == ci and abs(diff) > ci:
            verdict = f"{'yes' if diff > 0 else 'no, it grew'}: gap text − gap tokenswap = {diff:+.3f} (±{ci:.3f}, 95%)"
        else:
            verdict = f"not resolved at this scale: gap text − gap tokenswap = {diff:+.3f} (±{ci:.3f}, 95%)"
    caveat = ""
    rec = [arms[a]["gap/recognition_acc"] for a in arms if "gap/recognition_acc" in arms[a]]
    if rec and all(r["mean"] - (r["ci95"] if r["ci95"] == r["ci95"] else 0.0) <= 0.25 for r in rec):
        caveat = (
            "\n**Caveat (from the recognition control):** no arm identifies the held-out pictures better than "
            "chance (0.25, 4-way) at this scale, so interleaved accuracy here mostly reflects answer-letter priors, "
            "not reasoning over recognised concepts; the comparison above does not test the paper's claim.\n"
        )
    return (
        "# tokenswap demo: paired arms on a toy concept world\n\n"
        f"Seeds {report['seeds']}; {report['world']['concepts']} concepts; CPT {report['pretrain_steps']} steps; "
        f"post-training {report['post_steps']} steps; {report['world']['n_bench']} held-out questions per form. "
        f"Wall time {report['seconds']} s.\n\n"
        "Final values per arm (mean ± 95% CI over seeds). `gap/abs` = acc_text − acc_interleaved; "
        "`gap/recognition_acc` = share of held-out pictures the model identifies (4-way); "
        "`gap/controlled/abs` = gap on the items whose pictures it identified.\n\n"
        + table_md
        + f"\n**Does TokenSwap training shrink the gap relative to text training?** {verdict}\n"
        + caveat
    )


if __name__ == "__main__":
    raise SystemExit(main())
