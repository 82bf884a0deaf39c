"""A library call leaves the process as it found it: the excepthook of whoever called ``tokenswap.cli.main`` and
the matplotlib backend of a notebook (docs/architecture.md lists what stays global, and why)."""

from __future__ import annotations

import sys
import types

import pytest

from tokenswap import cli


def _hook(*_):
    pass


@pytest.fixture
def own_hook(monkeypatch):
    monkeypatch.setattr(sys, "excepthook", _hook)
    return _hook


def _command(monkeypatch, run):
    module = types.ModuleType("fake_command")
    module.cli_main = run
    monkeypatch.setitem(sys.modules, "fake_command", module)
    monkeypatch.setitem(cli.COMMANDS, "fake", ("fake_command", "a test command"))


@pytest.mark.parametrize("outcome", [0, 2])
def test_a_command_that_ends_gives_the_callers_excepthook_back(monkeypatch, own_hook, outcome):
    def run(argv):
        if outcome:
            from tokenswap.errors import InputError

            raise InputError("bad flag")
        return 0

    _command(monkeypatch, run)
    assert cli.main(["fake"]) == outcome
    assert sys.excepthook is own_hook


def test_a_bug_is_printed_masked_once_then_the_callers_hook_is_back(monkeypatch, own_hook, capsys):
    import tokenswap.redaction as redaction

    monkeypatch.setitem(redaction._values, "sk-not-for-eyes", "secret")

    def run(argv):
        raise RuntimeError("boom sk-not-for-eyes")

    _command(monkeypatch, run)
    with pytest.raises(RuntimeError) as err:
        cli.main(["fake"])
    # the interpreter prints an uncaught bug after main has returned: through the masking hook, once
    assert sys.excepthook is not own_hook
    sys.excepthook(err.type, err.value, err.tb)
    printed = capsys.readouterr().err
    assert "RuntimeError: boom" in printed and "sk-not-for-eyes" not in printed
    assert sys.excepthook is own_hook


def test_writing_a_figure_leaves_the_matplotlib_backend_alone(tmp_path):
    import matplotlib

    from tokenswap.compare import RunRecord, plot_runs

    before = matplotlib.get_backend()
    matplotlib.use("svg")  # stands for a notebook's inline backend
    try:
        run = RunRecord(name="a", group="g", arm="text", history=[{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5}])
        plot_runs([run], ("loss",), tmp_path / "plot.png")
        assert matplotlib.get_backend() == "svg"
        assert (tmp_path / "plot.png").read_bytes().startswith(b"\x89PNG")
    finally:
        matplotlib.use(before)
