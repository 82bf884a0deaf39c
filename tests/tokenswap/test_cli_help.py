"""Help as users expect it (issue 39 item 7): every subcommand's usage names `tokenswap <cmd>`, every flag has help,
no reStructuredText markup reaches the terminal, `tokenswap --version`, and `tokenswap --help` says where training
runs from."""

from __future__ import annotations

import argparse
import importlib
import re

import pytest

import tokenswap
from tokenswap.cli import COMMANDS, main

CONFIG_COMMANDS = ("build-store", "build-bench")  # YAML-config commands: no argparse parser, a usage of their own
MARKUP = re.compile(r"``|:(?:class|func|mod|meth|attr|data):`")


class _Captured(Exception):
    def __init__(self, parser):
        self.parser = parser


def parser_of(name: str) -> argparse.ArgumentParser:
    """The parser `tokenswap NAME` parses its arguments with, caught as it starts parsing."""
    module = importlib.import_module(COMMANDS[name][0])
    saved = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args

    def capture(self, *a, **k):
        raise _Captured(self)

    argparse.ArgumentParser.parse_args = argparse.ArgumentParser.parse_known_args = capture
    try:
        module.cli_main([])
    except _Captured as e:
        return e.parser
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = saved
    raise AssertionError(f"tokenswap {name} parsed no arguments with argparse")


def walk(parser: argparse.ArgumentParser, prog: str):
    """(prog, parser) of the parser and of each of its subcommands."""
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                yield from walk(subparser, f"{prog} {sub}")


@pytest.mark.parametrize("name", [n for n in COMMANDS if n not in CONFIG_COMMANDS])
def test_every_flag_has_help_and_every_usage_names_the_command(name):
    problems = []
    for prog, parser in walk(parser_of(name), f"tokenswap {name}"):
        if not parser.format_usage().startswith(f"usage: {prog}"):
            problems.append(f"{prog}: usage reads {parser.format_usage().splitlines()[0]!r}")
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not (action.help or "").strip() or action.help == argparse.SUPPRESS:
                problems.append(f"{prog} {'/'.join(action.option_strings) or action.dest}: no help")
        if found := MARKUP.findall(parser.format_help()):
            problems.append(f"{prog} --help shows markup {sorted(set(found))}")
    assert problems == []


@pytest.mark.parametrize("name", CONFIG_COMMANDS)
def test_config_commands_name_themselves_in_their_usage(name, capsys):
    assert main([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: tokenswap {name} [--config NAME.yaml]"), out[:200]
    assert not MARKUP.findall(out)


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"tokenswap {tokenswap.__version__}"


def test_top_level_help_points_to_the_recipes_for_training(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "recipes/post_train.py" in out and "--version" in out
