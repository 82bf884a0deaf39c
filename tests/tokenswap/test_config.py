"""YAML -> typed dataclasses: every problem named with its fix, in one ConfigError; dotted overrides; the CLI."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

import pytest

from tokenswap.config import CONFIG_DIR, ConfigError, field_docs, load_config, parse_config, resolve_config_path


def run_recipe(main, cls, argv):
    """A recipe's ``__main__`` entry (imported here only: it loads the training room, torch included)."""
    from tokenswap.training.entry import run_recipe

    run_recipe(main, cls, argv)


@dataclass(kw_only=True)
class Optim:
    lr: float = 1e-3
    """Peak learning rate."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """Adam betas."""

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"`lr` must be > 0, got {self.lr}")


@dataclass(kw_only=True)
class Extra:
    depth: int = 1
    """Nesting depth."""


@dataclass(kw_only=True)
class Toy:
    name: str
    """Run name (required)."""
    steps: int = 10
    """Optimizer steps."""
    mode: Literal["text", "tokenswap"] = "text"
    """Which arm."""
    limit: int | None = None
    """Optional cap."""
    tags: list[str] = field(default_factory=list)
    """Free-form tags."""
    use_cpu: bool = False
    """Force CPU."""
    optim: Optim = field(default_factory=Optim)
    """Optimizer settings."""
    extra: Extra | None = None
    """Optional section."""


def write(tmp_path, text: str, name: str = "toy.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def problems_of(excinfo) -> list[str]:
    return excinfo.value.problems


# ---------------------------------------------------------------------------- happy paths
def test_nested_optional_and_coerced_values(tmp_path):
    path = write(tmp_path, "name: r\nsteps: 3\nmode: tokenswap\nlimit: 5\noptim:\n  lr: 1e-5\nextra:\n  depth: 2\n")
    cfg = load_config(Toy, path)
    assert cfg == Toy(name="r", steps=3, mode="tokenswap", limit=5, optim=Optim(lr=1e-5), extra=Extra(depth=2))
    assert isinstance(cfg.optim.lr, float)  # YAML reads 1e-5 (no dot) as a string


def test_optional_accepts_null_and_defaults_fill_the_rest(tmp_path):
    cfg = load_config(Toy, write(tmp_path, "name: r\nlimit: null\nextra: null\n"))
    assert cfg.limit is None and cfg.extra is None and cfg.optim == Optim() and cfg.tags == []


def test_dotted_overrides_win_and_create_nested_sections(tmp_path):
    path = write(tmp_path, "name: r\noptim:\n  lr: 0.1\n")
    cfg = load_config(Toy, path, ["optim.lr=0.5", "extra.depth=4", "tags=[a, b]", "use_cpu=true", "name=other"])
    assert cfg.optim.lr == 0.5 and cfg.extra == Extra(depth=4)
    assert cfg.tags == ["a", "b"] and cfg.use_cpu is True and cfg.name == "other"
    assert load_config(Toy, None, ["name=x", "limit=null"]).limit is None


def test_empty_file_uses_defaults_plus_overrides(tmp_path):
    assert load_config(Toy, write(tmp_path, ""), ["name=x"]).name == "x"


# ---------------------------------------------------------------------------- errors
def test_unknown_key_suggests_the_closest_field(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(Toy, write(tmp_path, "name: r\nstep: 3\noptim:\n  lrr: 0.1\n"))
    assert any("unknown key `step` for Toy; did you mean `steps`?" in p for p in problems_of(e))
    assert any("unknown key `optim.lrr` for Optim; did you mean `optim.lr`?" in p for p in problems_of(e))


@pytest.mark.parametrize(
    "yaml_text, expected",
    [
        ("steps: ten", "`steps` must be an integer, got 'ten'"),
        ("steps: 1.5", "`steps` must be an integer, got 1.5"),
        ("steps: true", "`steps` must be an integer, got True"),
        ("optim:\n  lr: abc", "`optim.lr` must be a number, got 'abc'"),
        ("steps: [1, 2]", "`steps` must be an integer, got [1, 2]"),
        ("tags: solo", "`tags` must be a list, got 'solo'"),
        ("tags: [a, 3]", "`tags[1]` must be a string, got 3"),
        ("use_cpu: 'yes'", "`use_cpu` must be true or false, got 'yes'"),
        ("mode: image", "`mode` must be one of ['text', 'tokenswap'], got 'image'"),
        ("limit: many", "`limit` must be int | None, got 'many'"),
        ("optim: 3", "`optim` must be a mapping of Optim fields, got 3"),
        ("name: 5", "`name` must be a string, got 5"),
    ],
)
def test_wrong_types_name_key_type_and_value(tmp_path, yaml_text, expected):
    text = yaml_text if yaml_text.startswith("name") else "name: r\n" + yaml_text
    with pytest.raises(ConfigError) as e:
        load_config(Toy, write(tmp_path, text))
    assert problems_of(e) == [expected]


def test_missing_required_field():
    with pytest.raises(ConfigError) as e:
        load_config(Toy, None, ["steps=3"])
    assert problems_of(e) == ["`name` is required (str)"]


def test_every_problem_is_reported_in_one_error(tmp_path):
    path = write(tmp_path, "stepz: 1\nmode: image\noptim:\n  lr: abc\ntags: x\n")
    with pytest.raises(ConfigError) as e:
        load_config(Toy, path, ["use_cpu=maybe"])
    assert len(problems_of(e)) == 6, problems_of(e)
    message = str(e.value)
    assert message.startswith(f"6 problems in {path}:\n  - ")
    for needle in ("stepz", "`mode`", "`optim.lr`", "`tags`", "`use_cpu`", "`name` is required"):
        assert needle in message


def test_post_init_error_is_surfaced_with_its_section(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(Toy, write(tmp_path, "name: r\noptim:\n  lr: -1\n"))
    assert problems_of(e) == ["optim: `lr` must be > 0, got -1.0"]


def test_override_without_equals_and_non_mapping_top_level(tmp_path):
    with pytest.raises(ConfigError, match="override 'optim.lr' must look like `section.key=value`"):
        load_config(Toy, None, ["name=x", "optim.lr"])
    with pytest.raises(ConfigError, match="the top level must be a mapping, got list"):
        load_config(Toy, write(tmp_path, "- a\n- b\n"))


# ---------------------------------------------------------------------------- paths and CLI
def test_bare_name_resolves_in_configs(tmp_path, monkeypatch):
    (tmp_path / "configs").mkdir()
    write(tmp_path / "configs", "name: from-configs\n", "mine.yaml")
    monkeypatch.chdir(tmp_path)
    assert parse_config(Toy, ["--config", "mine.yaml"]).name == "from-configs"
    assert parse_config(Toy, ["--config=mine.yaml", "steps=2"]).steps == 2


def test_repo_configs_resolve_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_config_path("tiny/post_text.yaml") == CONFIG_DIR / "tiny" / "post_text.yaml"
    with pytest.raises(FileNotFoundError, match="not found as a path.*available: "):
        resolve_config_path("no_such_config.yaml")
    with pytest.raises(FileNotFoundError, match=r"did you mean 'tiny/post_text\.yaml'\?"):  # a typo gets a guess
        resolve_config_path("tiny/post_txet.yaml")


def test_help_lists_field_docstrings(capsys):
    with pytest.raises(SystemExit) as e:  # a recipe's entry answers --help without running the recipe
        run_recipe(lambda cfg: pytest.fail("--help ran the recipe"), Toy, ["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "Toy fields:" in out
    assert "steps=10  [int]  Optimizer steps." in out
    assert "name='<required>'" in out and "Run name (required)." in out
    assert "optim.lr=0.001  [float]  Peak learning rate." in out  # nested fields carry their dotted path
    assert "'text' | 'tokenswap'" in out
    assert field_docs(Optim) == {"lr": "Peak learning rate.", "betas": "Adam betas."}


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--lr", "3"], "unknown flag '--lr': pass options as `section.key=value`"),
        (["--config"], "--config needs a file name"),
    ],
)
def test_cli_errors(argv, match, capsys):
    with pytest.raises(ConfigError, match=re.escape(match)):
        parse_config(Toy, argv)
    with pytest.raises(SystemExit) as e:  # through a recipe's entry: one line, exit 2
        run_recipe(lambda cfg: pytest.fail("ran on a bad command line"), Toy, argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: 1 problem in command line: {match}") and err.count("\n") == 1


def test_cli_reports_every_config_problem_and_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        run_recipe(lambda cfg: pytest.fail("ran on a bad config"), Toy, ["steps=abc", "nmae=x"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: 3 problems in ") and "`steps` must be an integer" in err
    assert "did you mean `name`" in err and "`name` is required" in err and "problem(s)" not in err


def test_a_config_error_counts_its_problems_in_words():
    assert str(ConfigError(["`a` is wrong"], "c.yaml")) == "1 problem in c.yaml: `a` is wrong"
    assert str(ConfigError(["`a` is wrong", "`b` is wrong"], "c.yaml")) == \
        "2 problems in c.yaml:\n  - `a` is wrong\n  - `b` is wrong"


# ---------------------------------------------------------------------------- YAML 1.1 booleans
@dataclass(kw_only=True)
class Words:
    strategy: Literal["no", "steps", "epoch"] = "steps"
    """A choice whose documented value is a YAML 1.1 boolean word."""
    label: str = "x"
    """Free text."""
    labels: list[str] = field(default_factory=list)
    """Free texts."""
    aliases: dict[str, str] = field(default_factory=dict)
    """Surface form -> key."""
    flag: bool = True
    """A real boolean."""
    either: str | bool = "all"
    """Like TrainingArguments.include_num_input_tokens_seen: a word or a boolean."""
    free: dict = field(default_factory=dict)
    """Untyped (a Trainer kwargs dict)."""


@pytest.mark.parametrize("word", ["no", "off", "yes", "on", "No", "OFF"])
def test_yaml_boolean_words_are_the_word_for_string_keys_and_the_boolean_for_the_rest(tmp_path, word):
    as_bool = word.lower() in ("yes", "on")
    text = f"label: {word}\nlabels: [{word}]\naliases: {{{word}: {word}}}\nflag: {word}\neither: {word}\nfree: {{k: {word}}}\n"
    for cfg in (load_config(Words, write(tmp_path, text)),
                load_config(Words, None, [f"label={word}", f"labels=[{word}]", f"aliases={{{word}: {word}}}",
                                          f"flag={word}", f"either={word}", f"free={{k: {word}}}"])):
        assert cfg.label == word and type(cfg.label) is str and cfg.labels == [word]
        assert cfg.aliases == {word: word}
        assert cfg.flag is as_bool and cfg.either is as_bool and cfg.free == {"k": as_bool}


def test_a_choice_written_as_a_yaml_boolean_word_is_that_choice(tmp_path):
    assert load_config(Words, write(tmp_path, "strategy: no\n")).strategy == "no"
    assert load_config(Words, None, ["strategy=no"]).strategy == "no"
    with pytest.raises(ConfigError) as e:
        load_config(Words, None, ["strategy=yes"])
    assert problems_of(e) == ["`strategy` must be one of ['no', 'steps', 'epoch'], got True"]


@pytest.mark.parametrize(
    "override, expected",
    [
        ("optim.lr=yes", "`optim.lr` must be a number, got True"),  # float(True) would have trained at 1.0
        ("aliases={kitty: 5}", "`aliases.kitty` must be a string, got 5"),
        ("aliases={3: cat}", "`aliases key 3` must be a string, got 3"),
    ],
)
def test_booleans_and_mistyped_mapping_entries_are_refused_by_name(override, expected):
    cls = Toy if override.startswith("optim") else Words
    with pytest.raises(ConfigError) as e:
        load_config(cls, None, ["name=x", override] if cls is Toy else [override])
    assert problems_of(e) == [expected]


# ---------------------------------------------------------------------------- hostile YAML
def _laughs(levels: int) -> str:
    """The billion-laughs bomb: each level is 9 aliases of the one below (9**levels values expanded)."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "free:\n" + "".join(f"  {line}\n" for line in lines)


def test_an_alias_bomb_is_refused_at_once(tmp_path):
    import time

    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"toy\.yaml: YAML error at line 7, column 7: more than 100,000 values "
                                          r"once its aliases are expanded \(an alias bomb\?\)"):
        load_config(Words, write(tmp_path, _laughs(8)))  # 81 aliases, 387 million values: ran out of memory
    with pytest.raises(ConfigError, match="more than 100 aliases"):
        load_config(Words, write(tmp_path, "free:\n  a: &a 1\n  b: [" + ", ".join(["*a"] * 101) + "]\n"))
    with pytest.raises(ConfigError, match="override 'free=.*more than 100,000 values"):
        load_config(Words, None, ["free=" + _laughs(8).replace("\n  ", ", ").replace("free:, ", "{")[:-1] + "}"])
    assert time.monotonic() - start < 5
    # What a config uses anchors for still works: a shared section, merged and overridden.
    cfg = load_config(Words, write(tmp_path, "free:\n  base: &b {k: 1, j: 2}\n  run: {<<: *b, k: 3}\n"))
    assert cfg.free == {"base": {"k": 1, "j": 2}, "run": {"k": 3, "j": 2}}


@pytest.mark.parametrize("text", ["free: &r {x: *r}\n", "labels: &r [a, *r]\n", "free: {a: &r [{b: [*r]}]}\n"],
                         ids=["mapping", "list", "nested"])
def test_a_recursive_anchor_is_refused_by_name(tmp_path, text):
    with pytest.raises(ConfigError, match=r"YAML error at line 1, column \d+: the anchor &r \(line 1\) is used inside "
                                          "itself, a recursive value no config can hold"):
        load_config(Words, write(tmp_path, text))


def test_a_duplicate_key_is_refused_naming_the_key_and_both_lines(tmp_path):
    text = "name: run\noptim:\n  lr: 1.0e-4\n  betas: [0.9, 0.99]\n  lr: 10.0\n"
    with pytest.raises(ConfigError) as e:
        load_config(Toy, write(tmp_path, text))  # trained at 10.0 before: PyYAML keeps the last value
    assert problems_of(e) == ["YAML error at line 5, column 3: duplicate key 'lr' (first at line 3); keep one"]
    with pytest.raises(ConfigError, match=r"line 1, column 8: duplicate key 'k' \(first at line 1\)"):
        load_config(Words, None, ["free={k: 1, k: 2}"])
    assert load_config(Words, write(tmp_path, "label: no\nfree: {no: 1, off: 2}\n")).label == "no"  # two words


def test_deep_nesting_is_a_config_error_not_a_recursion_error(tmp_path):
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_config(Words, write(tmp_path, "free: " + "[" * 5000 + "]" * 5000 + "\n"))
