"""Build a TokenSwap-Bench-format dataset from any multiple-choice source, with the paper's three filters.

Per item (TokenSwap §3.2):

1. **concepts**: any :class:`~tokenswap.concepts.ConceptExtractor` over the question and each
   choice; concepts without an image in the :class:`~tokenswap.store.image_store.ImageStore`
   are left as text (no concept with an image -> dropped, reason ``no_concepts``);
2. **validity**: a VLM judge sees the question with only the target concept as an image (all
   others stay text: one-at-a-time restoration) and answers ``{"valid": true|false}``
   (no valid concept -> ``validity``);
3. **importance**: the proxy solver must answer the text item correctly and the item with all
   valid concept spans deleted wrongly (``importance``);
4. **caption round-trip**: a captioner describes each image; with the captions in place of the
   spans the proxy must still answer correctly (``caption``).

Kept items are written in the TokenSwap-Bench schema (configs ``text`` and ``img``, image
columns ``image_N``) as parquet in the hub layout, so :func:`tokenswap.data.tokenswap_bench.load_tokenswap_bench`
and ``datasets.load_dataset(out_dir, "img", split=...)`` read them. Every item's outcome goes to
an append-only ``results.jsonl`` flushed per item (a killed build resumes without redoing
finished items); ``dropped.jsonl`` lists each dropped item with the filter that dropped it.

Items run ``concurrency`` at a time (the largest ``concurrency`` of the model sections; each client
keeps its own limit) and are committed in item order, so every file is byte-identical to a run with one
request in flight. An item whose request fails for good is not recorded: the run finishes the others,
writes ``requests.json`` (requests, tokens, retries, errors, wall time per model) and raises
:class:`BenchRequestsFailed` naming how many failed; rerunning retries exactly those.

Command line::

    tokenswap build-bench --config bench_mmlu.yaml [key=value ...]
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tokenswap.concepts import Concept, ConceptExtractor, validate_concepts
from tokenswap.config import config_to_dict
from tokenswap.errors import IncompleteRunError, InputError
from tokenswap.eval.mc import MCItem, build_conversation, evaluate, format_prompt, substitute_spans
from tokenswap.files import atomic_write_json, atomic_write_text, cut_torn_tail, read_jsonl
from tokenswap.inference import ChatModel, LLMRequestError, map_ordered
from tokenswap.inference.parsing import parse_json_response
from tokenswap.inputs import from_hub, local_or_hub
from tokenswap.redaction import redact_data
from tokenswap.store.build_config import ExtractorConfig, LLMConfig
from tokenswap.store.builders import build_chat_model, read_vocabulary_file, request_concurrency
from tokenswap.store.image_store import ImageStore
from tokenswap.swap import SwapPolicy

__all__ = [
    "BenchRequestsFailed",
    "CAPTION_PROMPT",
    "FILTERS",
    "VALIDITY_PROMPT",
    "BenchBuildConfig",
    "BenchBuilder",
    "build_bench",
    "cli_main",
]

Filter = Literal["validity", "importance", "caption"]
FILTERS: tuple[str, ...] = ("validity", "importance", "caption")

# Our prompts: the paper's are not public (SPECS §5 item 3).
VALIDITY_PROMPT = (
    "In the multiple-choice question below, the concept {concept!r} is shown as an image instead of words.\n"
    "Does the image faithfully depict {concept!r} as it is meant in this question?\n"
    'Reply with JSON only: {{"valid": true}} or {{"valid": false}}.\n\n'
)
CAPTION_PROMPT = "Name what this image shows in a short noun phrase of at most five words. Reply with the phrase only."


# ============================================================================ library


class BenchRequestsFailed(IncompleteRunError):
    """Some items' requests failed for good; they were not recorded and a rerun retries them (exit status 1)."""


class BenchBuilder:
    """Runs the filters item by item and writes the dataset (see the module docstring).

    Args:
        extractor: finds concept spans in the question and each choice.
        store: concept images (the image of concept ``k`` of an item is picked by ``policy``).
        judge: VLM for the validity filter (replies ``{"valid": bool}``).
        proxy: solver for the importance and caption filters (replies with an answer letter).
        captioner: VLM that names each image.
        out_dir: output folder (``results.jsonl``, ``dropped.jsonl``, ``text/``, ``img/``, ``summary.json``).
        filters: which filters run, in the fixed order validity, importance, caption.
        policy: picks which store image each concept gets (deterministic in the item id).
        split: split name of the written dataset.
        concurrency: items processed at once (their requests in flight together; 1 = one at a time).
    """

    def __init__(
        self,
        extractor: ConceptExtractor,
        store: ImageStore,
        judge: ChatModel | None,
        proxy: ChatModel | None,
        captioner: ChatModel | None,
        out_dir: str | os.PathLike,
        filters: Sequence[str] = FILTERS,
        policy: SwapPolicy | None = None,
        split: str = "test",
        concurrency: int = 1,
    ):
        unknown = set(filters) - set(FILTERS)
        if unknown:
            raise ValueError(f"filters must be among {FILTERS}, got unknown {sorted(unknown)}")
        for name, needed, model in (
            ("judge", "validity" in filters, judge),
            ("proxy", "importance" in filters or "caption" in filters, proxy),
            ("captioner", "caption" in filters, captioner),
        ):
            if needed and model is None:
                raise ValueError(f"`{name}` is required by the filters {list(filters)}; pass a ChatModel")
        self.extractor = extractor
        self.store = store
        self.judge = judge
        self.proxy = proxy
        self.captioner = captioner
        self.out_dir = Path(out_dir)
        self.filters = tuple(filters)
        self.policy = policy or SwapPolicy()
        self.split = split
        self.concurrency = concurrency
        self.results_path = self.out_dir / "results.jsonl"

    # -- per item ---------------------------------------------------------------------------

    def _solves(self, item: MCItem) -> bool:
        reply = self.proxy.chat([{"role": "user", "content": format_prompt(item)}])
        return evaluate(item, reply) == 1.0

    def process(self, item: MCItem) -> dict:
        """Run extraction and the filters on one text item; returns its ``results.jsonl`` record."""
        texts = [item.question, *item.choices]
        record: dict = {"id": item.id, "kept": False, "reason": None, "detail": "", "concepts": []}
        found = [Concept(m, s, e, key) for m, t in enumerate(texts) for s, e, key in self.extractor.extract(t)]
        try:
            found = validate_concepts(found, texts, item.id)
        except ValueError as e:
            record.update(reason="no_concepts", detail=f"extractor returned invalid spans: {e}")
            return record
        concepts = []
        for k, c in enumerate(found):
            images = self.store.get(c.key)
            if images:
                image = images[self.policy.pick(item.id, k, len(images))]
                concepts.append({**c.to_dict(), "text": texts[c.message][c.start : c.end], "image_id": image.image_id})
        record["concepts"] = concepts
        if not concepts:
            record.update(reason="no_concepts", detail="no concept span has an image in the store")
            return record
        images = {c["image_id"]: self._image(c["key"], c["image_id"]) for c in concepts}

        if "validity" in self.filters:
            for c in concepts:
                c["valid"] = self._valid(item, c, images[c["image_id"]])
            if not any(c["valid"] for c in concepts):
                record.update(reason="validity", detail="the judge found no image faithful to its concept")
                return record
        valid = [c for c in concepts if c.get("valid", True)]
        spans = [Concept.from_dict(c) for c in valid]

        if "importance" in self.filters or "caption" in self.filters:
            if not self._solves(item):
                record.update(reason="importance", detail="the proxy answers the text item wrongly")
                return record
        if "importance" in self.filters:
            if self._solves(substitute_spans(item, [(s, "") for s in spans])):
                record.update(reason="importance", detail="the proxy answers correctly with the concepts deleted")
                return record
        if "caption" in self.filters:
            for c in valid:
                content = [{"type": "image", "image": images[c["image_id"]]}, {"type": "text", "text": CAPTION_PROMPT}]
                reply = self.captioner.chat([{"role": "user", "content": content}]).strip()
                c["caption"] = reply.splitlines()[0].strip() if reply else ""
            if not self._solves(substitute_spans(item, [(s, c["caption"]) for s, c in zip(spans, valid)])):
                record.update(reason="caption", detail="the proxy answers wrongly with captions in place of images")
                return record
        record["kept"] = True
        return record

    def _image(self, key: str, image_id: str):
        for im in self.store.get(key):
            if im.image_id == image_id:
                return im.load()
        raise KeyError(f"image {image_id} of concept {key!r} is no longer in the store {self.store.root}")

    def _valid(self, item: MCItem, concept: dict, image) -> bool:
        one = substitute_spans(item, [(Concept.from_dict(concept), "<image 1>")], images={1: image})
        content = [{"type": "text", "text": VALIDITY_PROMPT.format(concept=concept["text"])}]
        content += build_conversation(one)[0]["content"]
        reply = self.judge.chat([{"role": "user", "content": content}])
        try:
            return parse_json_response(reply).get("valid") is True
        except ValueError:
            return False  # an unparseable verdict is not a faithful-image verdict

    # -- whole run --------------------------------------------------------------------------

    def done(self) -> dict[str, dict]:
        """Records already in ``results.jsonl`` by item id (a last line a kill left unfinished is cut off first).

        Raises:
            InputError: a line before the end that is no record (the file was edited or damaged): the builder
                cannot tell which items are done, and re-asking or dropping them silently would change the bench.
        """
        cut_torn_tail(self.results_path)
        if not self.results_path.exists():
            return {}
        fix = ("the file records which items are done: fix or delete that line (its item is asked again), or pick a "
               "new out_dir")
        out = {}
        for number, row in enumerate(read_jsonl(self.results_path, "build-bench results", fix), start=1):
            if not isinstance(row.get("id"), str):
                raise InputError(f"build-bench results {self.results_path}:{number} has no `id`; {fix}")
            out[row["id"]] = row
        return out

    def run(self, items: Sequence[MCItem], progress: bool = False) -> dict:
        """Process every item not yet in ``results.jsonl``, then write the dataset; returns the summary.

        Raises:
            BenchRequestsFailed: some items' requests failed for good (the others are recorded; rerun).
        """
        from tokenswap.inference.progress import RequestProgress

        ids = [it.id for it in items]
        if len(set(ids)) != len(ids):
            raise ValueError("item ids must be unique: results.jsonl is keyed by id for resuming")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        done = self.done()
        models = [self.judge, self.proxy, self.captioner, getattr(self.extractor, "chat_model", None)]
        bar = RequestProgress(len(items), "build-bench", progress, models)
        bar.update(sum(1 for it in items if it.id in done))
        failed: list[tuple[str, str]] = []
        todo = (it for it in items if it.id not in done)
        with open(self.results_path, "a", encoding="utf-8") as f:
            for outcome in map_ordered(self.process, todo, self.concurrency):
                bar.update(1)
                if not outcome.ok:
                    if not isinstance(outcome.error, LLMRequestError):
                        raise outcome.error
                    failed.append((outcome.item.id, str(outcome.error)[:300]))
                    continue
                record = redact_data(outcome.value)  # captions and details quote the models' replies
                done[outcome.item.id] = record
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
                f.flush()
                os.fsync(f.fileno())
        bar.close()
        names = ("judge", "proxy", "captioner", "extractor")
        requests = {n: m.stats.as_dict() for n, m in zip(names, models) if m is not None}
        requests["failed_items"] = [{"id": i, "error": e} for i, e in failed[:100]]
        atomic_write_json(self.out_dir / "requests.json", redact_data(requests))
        if failed:
            raise BenchRequestsFailed(
                f"{len(failed)} item(s) had a request that failed for good (first: {failed[0][0]}: {failed[0][1]}); "
                f"they were not recorded. Rerun the same command to retry them (answers so far are cached)"
            )
        return self.write(items, done)

    def write(self, items: Sequence[MCItem], records: dict[str, dict]) -> dict:
        """Write ``text``/``img`` parquet in the hub layout, ``dropped.jsonl``, ``README.md``, ``summary.json``."""
        from tokenswap.data.tokenswap_bench import write_tokenswap_bench

        kept_text, kept_img = [], []
        for item in items:
            rec = records[item.id]
            if not rec["kept"]:
                continue
            valid = [c for c in rec["concepts"] if c.get("valid", True)]
            tags = [(Concept.from_dict(c), f"<image {n}>") for n, c in enumerate(valid, start=1)]
            images = {n: self._image(c["key"], c["image_id"]) for n, c in enumerate(valid, start=1)}
            kept_text.append(item)
            kept_img.append(substitute_spans(item, tags, images=images))
        write_tokenswap_bench(list(zip(kept_text, kept_img)), self.out_dir, self.split)
        dropped = [
            {"id": i.id, "reason": records[i.id]["reason"], "detail": records[i.id]["detail"]}
            for i in items
            if not records[i.id]["kept"]
        ]
        atomic_write_text(self.out_dir / "dropped.jsonl", "".join(json.dumps(d, ensure_ascii=False) + "\n"
                                                                  for d in dropped))
        reasons: dict[str, int] = {}
        for d in dropped:
            reasons[d["reason"]] = reasons.get(d["reason"], 0) + 1
        summary = {
            "items": len(items),
            "kept": len(kept_text),
            "dropped": reasons,
            "swaps": sum(len(i.images) for i in kept_img),
            "filters": list(self.filters),
        }
        atomic_write_json(self.out_dir / "summary.json", summary)
        return summary


# ============================================================================ config + CLI


@dataclass(kw_only=True)
class BenchBuildConfig:
    """`tokenswap build-bench`: a TokenSwap-Bench-format dataset from an MMLU-format source."""

    out_dir: str
    """Output folder; rerunning with the same folder resumes (finished items are not redone)."""
    store: str
    """Image store folder (built with `tokenswap build-store`)."""
    source: str = "cais/mmlu"
    """MMLU-format source: hub id or local copy in the hub layout (`all/test-*.parquet`)."""
    subject: str = "all"
    """MMLU config: `all` or one subject."""
    split: str = "test"
    """Source split; also the split name written (build `dev` too for k-shot evaluation)."""
    limit: int | None = None
    """Use the first `limit` source rows (None: all)."""
    filters: list[str] = field(default_factory=lambda: list(FILTERS))
    """Filters to run: any of validity, importance, caption (the paper runs all three)."""
    extractor: ExtractorConfig = field(default_factory=ExtractorConfig)
    """Concept extraction; a lexicon extractor with an empty vocabulary uses the store's keys."""
    judge: LLMConfig | None = None
    """Validity judge (a VLM)."""
    proxy: LLMConfig | None = None
    """Proxy solver for the importance and caption filters."""
    captioner: LLMConfig | None = None
    """Image captioner for the caption round-trip (a VLM)."""
    seed: int = 0
    """Picks which store image each concept gets."""
    progress: bool = True
    """Show a progress bar."""

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"`limit` must be >= 1 or null (all rows), got {self.limit}")
        unknown = [f for f in self.filters if f not in FILTERS]
        if unknown:
            raise ValueError(f"`filters` must be among {', '.join(FILTERS)}; got unknown {unknown}")
        for section, used_by in (("judge", ["validity"]), ("proxy", ["importance", "caption"]),
                                 ("captioner", ["caption"])):
            needing = [f for f in used_by if f in self.filters]
            if needing and getattr(self, section) is None:
                raise ValueError(f"`{section}` is required by the filter {needing[0]}: add a {section} section "
                                 f"(backend, base_url, model), or drop {needing[0]} from `filters`")


def _chat_model(cfg: LLMConfig | None, cache_path: Path) -> ChatModel | None:
    return None if cfg is None else build_chat_model(cfg, cache_path)


def _extractor(cfg: ExtractorConfig, store: ImageStore, cache_path: Path) -> ConceptExtractor:
    from tokenswap.store.extract import LLMConceptExtractor, build_lexicon

    if cfg.kind == "lexicon":
        vocab = list(cfg.vocabulary) + (read_vocabulary_file(cfg.vocabulary_file) if cfg.vocabulary_file else [])
        return build_lexicon(vocab or store.keys(), aliases=cfg.aliases, plurals=cfg.plurals)
    return LLMConceptExtractor(_chat_model(cfg.llm, cache_path), max_concepts=cfg.max_concepts)


STORE_HOLDS = ("an image store folder holds store.json and its shards (`tokenswap build-store` writes one under "
               "OUTPUT_DIR/store)")
SOURCE_HOLDS = ("an MMLU-format source is a folder in the hub layout (all/test-*.parquet, as cais/mmlu), or a hub id "
                "such as cais/mmlu")


def build_bench(cfg: BenchBuildConfig) -> dict:
    """Config -> :class:`BenchBuilder` run; returns the summary."""
    from tokenswap.data.mmlu import load_mmlu

    # Both inputs are checked before any request: a missing one says so, and what a valid one holds.
    local_or_hub(cfg.store, "`store`", STORE_HOLDS, hub=False)
    local_or_hub(cfg.source, "`source`", SOURCE_HOLDS)
    out = Path(cfg.out_dir)
    cache = out / "cache"
    store = ImageStore(cfg.store)
    builder = BenchBuilder(
        extractor=_extractor(cfg.extractor, store, cache / "extract.jsonl"),
        store=store,
        judge=_chat_model(cfg.judge, cache / "judge.jsonl"),
        proxy=_chat_model(cfg.proxy, cache / "proxy.jsonl"),
        captioner=_chat_model(cfg.captioner, cache / "captioner.jsonl"),
        out_dir=out,
        filters=cfg.filters,
        policy=SwapPolicy(seed=cfg.seed),
        split=cfg.split,
        concurrency=max(request_concurrency(c) for c in (cfg.extractor.llm, cfg.judge, cfg.proxy, cfg.captioner)),
    )
    with from_hub(cfg.source, "`source`", SOURCE_HOLDS, repo_type="dataset"):
        items = load_mmlu(cfg.source, cfg.subject, cfg.split, cfg.limit)
    summary = builder.run(items, progress=cfg.progress)
    atomic_write_json(out / "config.json", config_to_dict(cfg))
    return summary


def cli_main(argv: list[str] | None = None) -> int:
    """``tokenswap build-bench --config NAME.yaml [key=value ...]``.

    Raises:
        InputError: a config problem (:class:`~tokenswap.config.ConfigError`), a store or source that does not
            read, a damaged ``results.jsonl`` (exit status 2, before any request where it can be found first).
        BenchRequestsFailed: items whose requests failed for good (exit status 1; the same command retries them).
    """
    from tokenswap.config import load_config, split_argv, usage

    if "-h" in (argv or []) or "--help" in (argv or []):
        print(usage(BenchBuildConfig, "tokenswap build-bench"))
        return 0
    cfg = load_config(BenchBuildConfig, *split_argv(argv or []))
    try:
        summary = build_bench(cfg)
    except BenchRequestsFailed as e:
        raise BenchRequestsFailed(f"{e} ({cfg.out_dir}/requests.json lists them)") from None
    print(json.dumps(summary, indent=2))
    return 0
