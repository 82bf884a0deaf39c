"""Rank and world size have one home, :mod:`tokenswap.ranks`: no other module reads them from the environment."""

import re
from pathlib import Path

import tokenswap
from tokenswap.ranks import print0, rank_and_world

PACKAGE = Path(tokenswap.__file__).parent
# A read of the launcher's variables: os.environ["RANK"], os.environ.get("WORLD_SIZE"), os.getenv("LOCAL_RANK").
READ = re.compile(r"""(environ(\.get)?\s*[\[(]|getenv\s*\()\s*["'](RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE)["']""")


def test_only_ranks_reads_rank_and_world_size_from_the_environment():
    readers = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if READ.search(p.read_text(encoding="utf-8"))}
    assert readers == {"ranks.py"}


def test_print0_prints_on_rank_0_only(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    print0("hidden")
    assert rank_and_world() == (1, 2) and capsys.readouterr().out == ""
    monkeypatch.setenv("RANK", "0")
    print0("shown")
    assert capsys.readouterr().out == "shown\n"
