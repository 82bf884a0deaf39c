"""YAML configs mapped onto typed dataclasses, with dotted command-line overrides.

``parse_config(PostTrainConfig)`` reads ``--config NAME.yaml`` (a bare name resolves inside
``configs/``) and any ``section.key=value`` overrides, checks every key and type against the
dataclass tree, collects all problems and raises one :class:`ConfigError` that names each key
and how to fix it. :func:`usage` (a recipe's ``--help``) lists every field with the docstring written under
it, so the CLI is derived from the dataclasses and never mirrored by hand.

A section whose class takes seconds to import (the Trainer's arguments: ``transformers`` and ``peft`` load with
them) is a :class:`DeferredSection`: :func:`check_config_early` checks everything else, and that section's key
names, before the import, so a recipe answers a typo at once; :func:`parse_config` builds it in full.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import enum
import inspect
import math
import os
import sys
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import yaml

from tokenswap.errors import InputError

# Masking by field name lives in the one redaction every sink uses; kept importable here.
from tokenswap.redaction import command_line_secret, mask_secrets, redact_argv

__all__ = ["ConfigError", "DeferredSection", "check_config_early", "config_to_dict", "field_docs", "flatten_dict",
           "load_config", "parse_config", "resolve_config_path", "split_argv", "usage"]

T = TypeVar("T")
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


class ConfigError(InputError):
    """One or more configuration problems; the message lists each with its fix (one line when there is one)."""

    def __init__(self, problems: list[str], source: str = "config"):
        self.problems = problems
        if len(problems) == 1:
            super().__init__(f"1 problem in {source}: {problems[0]}")
        else:
            super().__init__(f"{len(problems)} problems in {source}:\n" + "\n".join(f"  - {p}" for p in problems))


def resolve_config_path(name: str | os.PathLike) -> Path:
    """``post_generate.yaml`` -> ``<repo>/configs/post_generate.yaml`` unless the path exists as given."""
    path = Path(name)
    if path.exists():
        return path
    for candidate in (Path.cwd() / "configs" / path, CONFIG_DIR / path):
        if candidate.exists():
            return candidate
    available = sorted(str(p.relative_to(CONFIG_DIR)) for p in CONFIG_DIR.glob("**/*.yaml"))
    import difflib

    close = difflib.get_close_matches(str(name), available, n=1, cutoff=0.6)
    guess = f"did you mean {close[0]!r}? " if close else ""
    raise FileNotFoundError(
        f"config {str(name)!r} not found as a path, in ./configs/ or in {CONFIG_DIR}; {guess}available: {available}"
    )


class DeferredSection:
    """A config section whose dataclass is built on first use, from a module that takes seconds to import.

    Used as a field's type and its ``default_factory`` (``train: PairedTrainConfig = field(default_factory=
    PairedTrainConfig)``); :meth:`resolve` gives the real dataclass, which :func:`parse_config` and :func:`usage`
    use. :func:`check_config_early` needs only :meth:`known_keys` and :attr:`owned`, which read no heavy module.
    """

    def __init__(self, name: str, owned: dict[str, str] | None = None):
        self.__name__ = name
        self.owned = owned or {}

    def resolve(self) -> type:
        raise NotImplementedError

    def known_keys(self) -> frozenset[str] | None:
        """The section's keys read without the import, or None when they cannot be (then only the full parse
        checks them)."""
        return None

    # Where a program used the section as its class (``PairedTrainConfig(hub_token=...)``,
    # ``dataclasses.fields(TrainConfig)``, ``isinstance(cfg.train, PairedTrainConfig)``, ``TrainConfig.OWNED``), the
    # stand-in answers as the class does, building it first.
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    @property
    def __dataclass_fields__(self) -> dict:
        return self.resolve().__dataclass_fields__

    def __instancecheck__(self, obj: Any) -> bool:
        return isinstance(obj, self.resolve())

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # the stand-in's own state, looked up before it exists
            raise AttributeError(name)
        return getattr(self.resolve(), name)

    def __repr__(self) -> str:
        return f"<deferred section {self.__name__}>"


def _raw_hints(cls: type) -> dict[str, Any]:
    module = sys.modules[cls.__module__]
    return typing.get_type_hints(cls, globalns=vars(module))


def _hints(cls: type) -> dict[str, Any]:
    return {k: v.resolve() if isinstance(v, DeferredSection) else v for k, v in _raw_hints(cls).items()}


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return " | ".join(repr(m.value) for m in tp)
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


class _YamlBool(str):
    """A plain YAML scalar that YAML 1.1 reads as a boolean (``no``, ``on``, ``True``, ...), as written.

    ``save_strategy: no`` documents the string "no"; ``bf16: no`` means False. The loader cannot tell the two
    apart, the field's declared type can: :func:`_coerce` gives a string-valued field the word and any other
    field the boolean.
    """

    value: bool

    def __new__(cls, text: str, value: bool) -> _YamlBool:
        obj = super().__new__(cls, text)
        obj.value = value
        return obj


MAX_ALIASES = 100
"""Aliases (``*name``) one YAML document may use: enough to share a section, far from an alias bomb."""
MAX_NODES = 100_000
"""Nodes one YAML document may hold with every alias expanded (a config has hundreds)."""


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that keeps the word of YAML 1.1 booleans (:class:`_YamlBool`) and refuses what a config
    never needs but an accident or an attack can hold: a duplicate key (PyYAML keeps the last value silently),
    more than :data:`MAX_ALIASES` aliases or :data:`MAX_NODES` expanded nodes (an alias bomb, which the checks on
    the expanded values would grow until memory runs out) and an anchor used inside itself (recursion)."""

    def __init__(self, stream):
        super().__init__(stream)
        self._aliases = 0

    def construct_yaml_bool(self, node):
        return _YamlBool(node.value, super().construct_yaml_bool(node))

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise yaml.composer.ComposerError(
                    None, None, f"more than {MAX_ALIASES} aliases (*name) in one document (an alias bomb?); "
                    "write the repeated values out", self.peek_event().start_mark)
        return super().compose_node(parent, index)

    def compose_document(self):
        # As yaml.composer.Composer.compose_document, keeping the anchors until the node graph is checked.
        self.get_event()
        node = self.compose_node(None, None)
        self.get_event()
        anchors, self.anchors = self.anchors, {}
        _check_nodes(node, {id(n): (name, n) for name, n in anchors.items()})
        return node

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first: dict = {}
            for key_node, _ in node.value:  # explicit keys only: a merged `<<: *base` key may be overridden
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node)
                if key in first:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {str(key)!r} (first at line {first[key].line + 1}); keep one",
                        key_node.start_mark)
                first[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def _check_nodes(root: yaml.Node, anchors: dict[int, tuple[str, yaml.Node]]) -> None:
    """Refuse a node graph with a cycle (a recursive anchor) or more than :data:`MAX_NODES` nodes once expanded.

    Iterative: a cycle or a deep nesting must give this message, not a RecursionError.
    """
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, Any]] = []

    def children(node):
        if isinstance(node, yaml.MappingNode):
            return iter([n for pair in node.value for n in pair])
        return iter(node.value if isinstance(node, yaml.SequenceNode) else ())

    stack.append((root, children(root)))
    on_path.add(id(root))
    while stack:
        node, todo = stack[-1]
        child = next(todo, None)
        if child is None:
            stack.pop()
            on_path.discard(id(node))
            total = 1 + sum(size[id(c)] for c in children(node))
            if total > MAX_NODES:
                raise yaml.composer.ComposerError(
                    None, None, f"more than {MAX_NODES:,} values once its aliases are expanded (an alias bomb?); "
                    "write the values out or use fewer aliases", node.start_mark)
            size[id(node)] = total
            continue
        if id(child) in on_path:
            name = anchors.get(id(child), ("?", child))[0]
            raise yaml.composer.ComposerError(
                None, None, f"the anchor &{name} (line {child.start_mark.line + 1}) is used inside itself, a "
                "recursive value no config can hold; write the value out", node.start_mark)
        if id(child) not in size:
            on_path.add(id(child))
            stack.append((child, children(child)))


_Loader.add_constructor("tag:yaml.org,2002:bool", _Loader.construct_yaml_bool)


def _plain(value: Any) -> Any:
    """``value`` with every :class:`_YamlBool` read as YAML 1.1 reads it (for untyped values: ``Any``, bare dicts)."""
    if isinstance(value, _YamlBool):
        return value.value
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _coerce(value: Any, tp: Any, key: str, problems: list[str]) -> Any:
    """Convert a YAML value to ``tp`` or record why it cannot be."""
    origin = get_origin(tp)
    if tp in (dict, list, tuple):  # a bare `dict` (TrainingArguments' `lr_scheduler_kwargs: dict | str`) is checked too
        origin = tp
    if tp is Any:
        return _plain(value)
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        if isinstance(value, _YamlBool) and bool in args:  # `str | bool` fields: `no` keeps its YAML meaning
            value = value.value
        real = [a for a in args if a is not type(None)]
        if len(real) == 1 and dataclasses.is_dataclass(real[0]) and isinstance(value, dict):
            return _coerce(value, real[0], key, problems)  # an optional section: report its own field checks
        for arg in args:
            if arg is type(None):
                continue
            trial: list[str] = []
            out = _coerce(value, arg, key, trial)
            if not trial:
                return out
        problems.append(f"`{key}` must be {_type_name(tp)}, got {value!r}")
        return value
    if origin is Literal:
        if isinstance(value, _YamlBool):
            value = str(value) if str(value) in get_args(tp) else value.value
        if value not in get_args(tp):
            problems.append(f"`{key}` must be one of {list(get_args(tp))}, got {value!r}")
        return value
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        choices = [m.value for m in tp]
        if isinstance(value, _YamlBool):
            value = str(value) if str(value) in choices else value.value
        if value not in choices:
            close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"`{key}` must be one of {choices}, got {value!r}{hint}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            problems.append(f"`{key}` must be a mapping of {tp.__name__} fields, got {value!r}")
            return value
        return _build(tp, value, key + ".", problems)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            problems.append(f"`{key}` must be a list, got {value!r}")
            return value
        args = get_args(tp)
        item_tp = args[0] if args else Any
        items = [_coerce(v, item_tp, f"{key}[{i}]", problems) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            problems.append(f"`{key}` must be a mapping, got {_plain(value)!r}")
            return value
        key_tp, value_tp = get_args(tp) or (Any, Any)
        return {_coerce(k, key_tp, f"{key} key {k!r}", problems): _coerce(v, value_tp, f"{key}.{k}", problems)
                for k, v in value.items()}
    if tp is str:
        if not isinstance(value, str):
            problems.append(f"`{key}` must be a string, got {value!r}")
        return str(value) if isinstance(value, str) else value
    if isinstance(value, _YamlBool):  # every other type takes the boolean YAML 1.1 reads
        value = value.value
    if tp is bool:
        if not isinstance(value, bool):
            problems.append(f"`{key}` must be true or false, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool):  # float(True) is 1.0: `lr: yes` must not train at 1.0
            problems.append(f"`{key}` must be a number, got {value!r}")
            return value
        if not isinstance(value, (int, float)):
            # YAML reads 1e-5 as a string (no dot); accept numeric strings.
            try:
                value = float(value)
            except (TypeError, ValueError):
                problems.append(f"`{key}` must be a number, got {value!r}")
                return value
        if math.isnan(value):
            # NaN compares false with every bound, so range checks downstream would all pass.
            problems.append(f"`{key}` must be a number, got NaN")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"`{key}` must be an integer, got {value!r}")
        return value
    return _plain(value)


def _build(cls: type[T], data: dict, prefix: str, problems: list[str]) -> T:
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = _hints(cls)
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            problems.append(_unknown_key(key, fields, prefix, cls.__name__, getattr(cls, "OWNED", {}),
                                         getattr(cls, "RETIRED", {})))
            continue
        kwargs[key] = _coerce(value, hints[key], prefix + key, problems)
    problems += _missing(fields, kwargs, hints, prefix)
    if problems:
        return None  # type: ignore[return-value]
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:
        problems.append(f"{prefix.rstrip('.') or cls.__name__}: {e}")
        return None  # type: ignore[return-value]


def _unknown_key(key: str, fields, prefix: str, class_name: str, owned: dict, retired: dict) -> str:
    """The one line for a key that is not a field: set by the recipe, retired, or a typo (with a guess)."""
    if key in owned:
        return f"`{prefix}{key}` is set by the recipe: {owned[key]}"
    if key in retired:  # a key that was removed: one line pointing to what replaced it
        return f"`{prefix}{key}` is gone: {retired[key]}"
    close = difflib.get_close_matches(key, fields, n=1)
    hint = f"; did you mean `{prefix}{close[0]}`?" if close else ""
    valid = ", ".join(fields) if len(fields) <= 30 else "see --help for all of them"
    return f"unknown key `{prefix}{key}` for {class_name}{hint} (valid: {valid})"


def _missing(fields: dict, given, hints: dict, prefix: str) -> list[str]:
    return [f"`{prefix}{name}` is required ({_type_name(hints[name])})" for name, f in fields.items()
            if name not in given and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]


def _set_dotted(data: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[parts[-1]] = value


def load_config(cls: type[T], path: str | os.PathLike | None = None, overrides: list[str] | tuple = ()) -> T:
    """Build ``cls`` from a YAML file and ``key.sub=value`` overrides.

    Raises:
        ConfigError: every unknown key, wrong type, missing required field and failed
            ``__post_init__`` check, in one message.
    """
    data, source = _config_data(path, overrides)
    problems: list[str] = []
    cfg = _build(cls, data, "", problems)
    if problems:
        raise ConfigError(problems, source)
    return cfg


def _config_data(path: str | os.PathLike | None, overrides: list[str] | tuple) -> tuple[dict, str]:
    """The YAML file's mapping with the overrides set into it, and the name problems are reported under."""
    data: dict = {}
    source = "overrides"
    if path is not None:
        resolved = resolve_config_path(path)
        source = str(resolved)
        data = _read_yaml(resolved)
        mask_secrets(data)  # remembered before any check: a problem found below may quote a secret of the file
    problems: list[str] = []
    for item in overrides:
        if "=" not in item:
            problems.append(f"override {item!r} must look like `section.key=value`")
            continue
        key, raw = item.split("=", 1)
        if not key.strip() or any(not part for part in key.strip().split(".")):
            problems.append(f"override {item!r}: the key must look like `section.key`")
            continue
        try:
            value = yaml.load(raw, Loader=_Loader) if raw != "" else ""
        except yaml.YAMLError as e:
            problems.append(f"override {item[:200]!r}: the value is not valid YAML ({_yaml_problem(e)}); quote it")
            continue
        except RecursionError:
            problems.append(f"override {item[:200]!r}: the value is nested too deeply; quote it")
            continue
        _set_dotted(data, key.strip(), value)
    if problems:
        raise ConfigError(problems, source)
    return data, source


def _yaml_problem(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}{getattr(e, 'problem', None) or e}"


def _read_yaml(path: Path) -> dict:
    """A config file's top-level mapping, or a ConfigError that says what is wrong with the file."""
    if path.is_dir():
        raise ConfigError([f"{path} is a directory; pass a YAML file (e.g. {path}/post_generate.yaml)"], str(path))
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError([f"the file is not UTF-8 text (byte {e.start}); save it as UTF-8"], str(path)) from None
    except OSError as e:
        raise ConfigError([f"cannot read the file: {e.strerror or e}"], str(path)) from None
    try:
        loaded = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        raise ConfigError([f"YAML error at {_yaml_problem(e)}" if getattr(e, "problem_mark", None) else f"YAML error: {e}"], str(path)) from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise ConfigError(["YAML nested too deeply (thousands of levels); a config has a few"], str(path)) from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError([f"the top level must be a mapping, got {type(_plain(loaded)).__name__}"], str(path))
    return loaded


def flatten_dict(d: dict, prefix: str = "") -> dict:
    """Nested dicts as one level of dotted keys, the way settings are named in overrides and messages.

    >>> flatten_dict({"collator": {"swap_prob": 1.0}, "run": {}})
    {'collator.swap_prob': 1.0, 'run': {}}
    """
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten_dict(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_to_dict(cfg: Any) -> dict:
    """Plain nested dict, credentials masked (:func:`mask_secrets`): what tokenswap writes anywhere (the run's
    ``tokenswap_config.json``, the W&B run config, logs). The typed config itself keeps the real values."""
    return mask_secrets(dataclasses.asdict(cfg))


def field_docs(cls: type) -> dict[str, str]:
    """Docstrings written under dataclass fields (``x: int = 1`` followed by ``\"\"\"doc\"\"\"``)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _help(cls: type, prefix: str = "") -> list[str]:
    lines = []
    docs = field_docs(cls)
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            lines.append(f"  {prefix}{f.name}:  ({tp.__name__}) {docs.get(f.name, '')}")
            lines += _help(tp, prefix + f.name + ".")
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING and not dataclasses.is_dataclass(tp):
            default = f.default_factory()
        else:
            default = "<required>"
        # transformers writes its help for argparse, which reads "%%" as "%".
        doc = docs.get(f.name) or " ".join(str(f.metadata.get("help", "")).replace("%%", "%").split())
        lines.append(f"  {prefix}{f.name}={default!r}  [{_type_name(tp)}]  {doc}")
    return lines


def usage(cls: type, prog: str | None = None) -> str:
    """The ``--help`` text of a config class: the command-line form and every field with its docstring.

    ``prog`` is the command as typed (``tokenswap build-store``); by default the running script, as
    ``python recipes/post_train.py``.
    """
    if prog is None:
        script = sys.argv[0] if sys.argv and sys.argv[0] else "RECIPE.py"
        rel = os.path.relpath(script) if os.path.isabs(script) else script
        prog = f"python {script if rel.startswith('..') else rel}"
    return f"usage: {prog} [--config NAME.yaml] [key.sub=value ...]\n\n{cls.__name__} fields:\n" + "\n".join(_help(cls))


def parse_config(cls: type[T], argv: list[str] | None = None) -> T:
    """Command line -> config: ``[--config PATH_OR_NAME] [section.key=value ...]``, for the recipes.

    Every problem is raised at once as one :class:`ConfigError` (an :class:`~tokenswap.errors.InputError`), a
    config file that is not found as a ``FileNotFoundError``; the recipes' entry
    (:func:`tokenswap.training.run_recipe`) prints it and exits 2, as ``tokenswap.cli.main`` does for the
    subcommands, and answers ``--help`` with :func:`usage` before this is called. A secret on the command line
    (a secret-named override, a URL carrying a password) is refused first, its value remembered for redaction and
    never printed (:func:`tokenswap.redaction.command_line_secret`): secrets come from the environment or the YAML.
    """
    path, overrides = _command_line(argv)
    return load_config(cls, path, overrides)


def _command_line(argv: list[str] | None) -> tuple[str | None, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    why = command_line_secret(argv)
    if why is not None:
        raise ConfigError([why], "command line")
    redact_argv(argv)
    return split_argv(argv)


def check_config_early(cls: type, argv: list[str] | None = None) -> None:
    """Raise the :class:`ConfigError` (or ``FileNotFoundError``) :func:`parse_config` would, for everything that
    needs no :class:`DeferredSection` built: the command line, the config name, every section name, every key and
    value of the other sections (their own checks included) and the deferred sections' key names.

    A recipe calls it before the imports that take seconds, so a typo is answered at once; what it cannot see (a
    deferred section's values, the whole config's cross-section checks) :func:`parse_config` reports after them.
    """
    path, overrides = _command_line(argv)
    data, source = _config_data(path, overrides)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = _raw_hints(cls)
    problems: list[str] = []
    for key, value in data.items():
        if key not in fields:
            problems.append(_unknown_key(key, fields, "", cls.__name__, getattr(cls, "OWNED", {}),
                                         getattr(cls, "RETIRED", {})))
            continue
        tp = hints[key]
        if isinstance(tp, DeferredSection):
            keys = tp.known_keys()
            for sub in value if isinstance(value, dict) else ():
                if sub in tp.owned or (keys is not None and sub not in keys):
                    problems.append(_unknown_key(sub, sorted(keys or ()), f"{key}.", tp.__name__, tp.owned, {}))
        elif not any(isinstance(a, DeferredSection) for a in (tp, *get_args(tp))):
            _coerce(value, tp, key, problems)
    problems += _missing(fields, data, hints, "")
    if problems:
        raise ConfigError(problems, source)


def split_argv(argv: list[str]) -> tuple[str | None, list[str]]:
    """``[--config PATH] [key=value ...]`` -> ``(path or None, overrides)``; a stray ``--flag`` is a ConfigError."""
    path = None
    overrides = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config":
            if i + 1 >= len(argv):
                raise ConfigError(["--config needs a file name"], "command line")
            path = argv[i + 1]
            i += 2
            continue
        if arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        elif arg.startswith("--"):
            raise ConfigError(
                [f"unknown flag {arg!r}: pass options as `section.key=value` overrides (see --help)"], "command line"
            )
        else:
            overrides.append(arg)
        i += 1
    return path, overrides
