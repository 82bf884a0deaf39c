"""The docs' shell blocks, found, checked and run: the machinery behind tests/test_docs.py.

Every fenced block of README.md and docs/*.md names its language, and every shell block (bash, sh, shell)
carries a mark on the line right before its fence (docs/contributing.md, "Writing docs"):

    <!-- run -->                              executed, offline, in a folder holding only what the page made
    <!-- check: syntax -->                    each command's arguments parsed by the command's own parser
    <!-- check: none (the reason) -->         nothing checked; the reason is required

Runnable blocks of one page run in document order in one scratch folder (a later block may use what an
earlier one wrote), through real bash. ``tokenswap`` and ``python`` are on its PATH as shims that hand the
command to a fork server holding torch, transformers and tokenswap imported: each command still runs in a
fresh process (a fork, with the shell's working folder, environment and file descriptors), as the console
script or ``python recipes/X.py`` would, without paying ~8 s of imports per command.

This file is also the fork server (``python tests/docs_harness.py serve SOCKET``) and its client (``client
SOCKET PROGRAM ARGS...``); its top level imports the standard library only, so the client starts in ~30 ms.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHELL_LANGS = {"bash", "sh", "shell"}
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
MARK = re.compile(r"^\s*<!--\s*(?P<body>(?:run|check)\b.*?)\s*-->\s*$")


def doc_pages() -> list[Path]:
    """README.md, CHANGELOG.md and docs/*.md."""
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]


# ---------------------------------------------------------------------------------------------------------------
# Blocks and marks
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    mark: str | None  # "run", "syntax", "none" or None (unmarked)
    reason: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def parse_mark(body: str) -> tuple[str | None, str, list[str]]:
    """``run`` / ``check: syntax`` / ``check: none (reason)`` -> (mark, reason, problems)."""
    if body == "run":
        return "run", "", []
    if re.fullmatch(r"run:\s*fixtures\s*=.*", body):
        # A block given test fixtures passes where a user on a fresh clone fails: the page must make what it uses.
        return "run", "", [f"<!-- {body} -->: blocks get no fixtures; make them on the page first (`python -m "
                           "tokenswap.testing .cache` writes .cache/tiny-qwen2vl, tiny-store and tiny-bench) and "
                           "mark the block <!-- run -->"]
    if re.fullmatch(r"check:\s*syntax", body):
        return "syntax", "", []
    if m := re.fullmatch(r"check:\s*none\s*(?:\((?P<reason>.*)\))?", body):
        reason = (m["reason"] or "").strip()
        return "none", reason, [] if reason else ["`check: none` needs a reason: <!-- check: none (why) -->"]
    return None, "", [f"unreadable mark <!-- {body} -->: use run, check: syntax or check: none (reason)"]


def find_blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page`` with its language and mark."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m["fence"], m["info"].strip().split(" ")[0].lower()
        start, body = i, []
        i += 1
        while i < len(lines) and not re.match(rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$", lines[i]):
            body.append(lines[i])
            i += 1
        i += 1
        prev = lines[start - 1] if start > 0 else ""
        mark, reason, problems = None, "", []
        if mm := MARK.match(prev):
            mark, reason, problems = parse_mark(mm["body"])
        blocks.append(Block(page, start + 1, lang, "\n".join(body), mark, reason, problems))
    return blocks


REDIRECTS = {">", ">>", "<", ">&", "<&", "&>", "&>>", ">|"}


def commands(text: str) -> list[list[str]]:
    """The simple commands of a shell block: continuations joined, comments dropped, split at ; && || | &.

    Redirections (``> file``, ``2>&1``) are dropped: they are the shell's, not the command's.
    """
    out = []
    for cmd in _split_commands(text):
        words: list[str] = []
        skip = False
        for w in cmd:
            if skip:
                skip = False
            elif w in REDIRECTS:
                if words and words[-1].isdigit():  # the fd of `2>&1` / `2> log`, lexed as its own word
                    words.pop()
                skip = True  # the redirection's target
            else:
                words.append(w)
        if words:
            out.append(words)
    return out


def _split_commands(text: str) -> list[list[str]]:
    # A newline ends a command in a shell (shlex reads it as mere whitespace), so lex line by line.
    cmds: list[list[str]] = [[]]
    for line in text.replace("\\\n", " ").splitlines():
        lex = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
        lex.whitespace_split = True
        lex.commenters = "#"
        for word in [*lex, "\n"]:
            if word in (";", "&&", "||", "|", "&", "\n"):
                cmds.append([])
            else:
                cmds[-1].append(word)
    return [c for c in cmds if c]


# ---------------------------------------------------------------------------------------------------------------
# Syntax checks: each command's own parser, nothing executed
# ---------------------------------------------------------------------------------------------------------------


class Parsed(Exception):
    """Raised in place of returning from the command's own argument parser: the arguments parsed."""


class Unparsed(Exception):
    """The command's parser refused the arguments, or the command was not one the harness can check."""


def _env_prefix(words: list[str]) -> list[str]:
    i = 0
    while i < len(words) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[i]):
        i += 1
    return words[i:]


def check_syntax(words: list[str]) -> str:
    """Parse one command with its own parser; return what was checked, raise :class:`Unparsed` if it fails."""
    words = _env_prefix(words)
    if not words:
        return "assignment"
    prog, args = words[0], words[1:]
    if prog in ("cd", "export", "mkdir", "ls", "cat", "head", "tail", "echo"):
        return f"{prog} (shell)"
    if prog == "tokenswap":
        return _check_tokenswap(args)
    if prog in ("python", "python3"):
        return _check_python(args)
    if prog == "accelerate":
        return _check_accelerate(args)
    if prog == "make":
        return _check_make(args)
    if prog == "bash":
        return _check_bash(args)
    if prog == "transformers":
        return _check_click("transformers.cli.transformers", "app", "transformers", args)
    raise Unparsed(f"no parser for {prog!r}: move it to a block marked <!-- check: none (reason) -->")


def _parsing_only(run):
    """Call ``run()`` with every argparse parser and tokenswap's config parser stopping right after parsing.

    The patched parsers raise :class:`Parsed` once the outermost parse succeeds, so the command never gets
    past its arguments; a parser's own error (SystemExit 2, its message on stderr) becomes :class:`Unparsed`.
    """
    import argparse
    import contextlib
    import io

    import tokenswap.config as config

    depth = 0

    def stop_after(orig):
        def parse(*a, **k):
            nonlocal depth
            depth += 1
            try:
                result = orig(*a, **k)
            finally:
                depth -= 1
            if depth == 0:
                raise Parsed(result)
            return result

        return parse

    # parse_config: the recipes; load_config: build-store and build-bench, which raise their config errors.
    saved = (argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args, config.parse_config,
             config.load_config)
    argparse.ArgumentParser.parse_args = stop_after(saved[0])
    argparse.ArgumentParser.parse_known_args = stop_after(saved[1])
    config.parse_config = stop_after(saved[2])
    config.load_config = stop_after(saved[3])
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            run()
    except Parsed:
        return
    except config.ConfigError as e:  # load_config's refusal (build-store, build-bench): unknown key, bad value
        raise Unparsed(f"the config was refused: {_tail(str(e))}") from None
    except SystemExit as e:
        if e.code in (0, None):  # --help: printed, and nothing else done
            return
        raise Unparsed(f"the parser refused it (exit {e.code}): {_tail(err.getvalue())}") from None
    finally:
        (argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args, config.parse_config,
         config.load_config) = saved
    raise Unparsed(f"it returned without parsing its arguments (or they failed): {_tail(err.getvalue())}")


def _tail(text: str) -> str:
    # argparse ends with its one error line, tokenswap's config errors start with theirs: keep both ends.
    text = text.strip()
    return text if len(text) <= 3000 else f"{text[:1500]} [...] {text[-1500:]}"


def _check_tokenswap(args: list[str]) -> str:
    import importlib

    from tokenswap.cli import COMMANDS

    if not args or args[0] not in COMMANDS:
        raise Unparsed(f"`tokenswap {' '.join(args[:1])}`: no such subcommand (known: {', '.join(COMMANDS)})")
    module = importlib.import_module(COMMANDS[args[0]][0])
    _parsing_only(lambda: module.cli_main(args[1:]))
    return f"tokenswap {args[0]}"


def _run_python(args: list[str]) -> str:
    """``python path.py ARGS`` / ``python -m module ARGS`` as ``__main__`` with the parsers stopping at parse."""
    import runpy

    if args[:1] == ["-m"] and len(args) >= 2:
        target, rest = args[1], args[2:]
        if target == "tokenswap.cli":
            return _check_tokenswap(rest)
        if target == "pytest":  # running pytest's parser would start a session: check the test paths exist
            paths = [a.split("::")[0] for a in rest if not a.startswith("-") and ("/" in a or a.endswith(".py"))]
            missing = [p for p in paths if not (ROOT / p).exists()]
            if missing:
                raise Unparsed(f"pytest: {', '.join(missing)} does not exist")
            return "python -m pytest (paths)"

        def run():
            sys.argv = [target, *rest]
            runpy.run_module(target, run_name="__main__", alter_sys=False)
    elif args and args[0].endswith(".py"):
        target, rest = args[0], args[1:]
        path = ROOT / target
        if not path.is_file():
            raise Unparsed(f"{target} does not exist")

        def run():
            sys.argv = [str(path), *rest]
            runpy.run_path(str(path), run_name="__main__")
    else:
        raise Unparsed(f"`python {' '.join(args)}`: only `python FILE.py ...` and `python -m MODULE ...` are checked")
    argv, cwd = sys.argv, os.getcwd()
    try:
        os.chdir(ROOT)
        _parsing_only(run)
    finally:
        sys.argv = argv
        os.chdir(cwd)
    return f"python {target}"


def _check_python(args: list[str]) -> str:
    return _run_python(args)


def _check_accelerate(args: list[str]) -> str:
    if args[:1] != ["launch"]:
        raise Unparsed(f"`accelerate {' '.join(args[:1])}`: only `accelerate launch` is checked")
    import contextlib
    import io

    from accelerate.commands.launch import launch_command_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = launch_command_parser().parse_args(args[1:])
    except SystemExit as e:
        raise Unparsed(f"accelerate launch refused it (exit {e.code}): {_tail(err.getvalue())}") from None
    if ns.config_file and not (ROOT / ns.config_file).is_file():
        raise Unparsed(f"--config_file {ns.config_file} does not exist")
    inner = (["-m"] if ns.module else []) + [ns.training_script, *ns.training_script_args]
    return f"accelerate launch + {_run_python(inner)}"


def _check_make(args: list[str]) -> str:
    targets = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        if m := re.match(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", line):
            targets.add(m[1])
    names = [a for a in args if not a.startswith("-") and "=" not in a]
    missing = [t for t in names if t not in targets]
    if missing:
        raise Unparsed(f"make: no target {', '.join(missing)} in the Makefile (targets: {', '.join(sorted(targets))})")
    return f"make {' '.join(names)}"


def _check_bash(args: list[str]) -> str:
    if not args or not args[0].endswith(".sh"):
        raise Unparsed("only `bash SCRIPT.sh ...` is checked")
    path = ROOT / args[0]
    if not path.is_file():
        raise Unparsed(f"{args[0]} does not exist")
    script = path.read_text()
    # The scripts parse their flags in a `case "$1" in --flag) ...` loop: each flag must be one of its patterns.
    for flag in (a for a in args[1:] if a.startswith("--")):
        if not re.search(rf"(^|[\s|(]){re.escape(flag)}[)|]", script, re.M):
            raise Unparsed(f"{args[0]} has no `{flag})` case: the flag was renamed or removed")
    return f"bash {args[0]}"


def _check_click(module: str, attr: str, prog: str, args: list[str]) -> str:
    import importlib

    import click

    app = getattr(importlib.import_module(module), attr)
    ctx = click.Context(app, info_name=prog)
    sub = app.get_command(ctx, args[0]) if args else None
    if sub is None:
        raise Unparsed(f"`{prog}` has no command {args[:1]}")
    try:
        sub.make_context(args[0], list(args[1:]), parent=ctx)
    except click.exceptions.Exit:
        pass
    except click.UsageError as e:
        raise Unparsed(f"`{prog} {args[0]}` refused it: {e.format_message()}") from None
    return f"{prog} {args[0] if args else ''}".strip()


# ---------------------------------------------------------------------------------------------------------------
# Links
# ---------------------------------------------------------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\((?P<target><[^>]+>|[^)\s]+)(?:\s+\"[^\"]*\")?\)")
HTML_LINK = re.compile(r"""<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*["'](?P<target>[^"']+)["']""")


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_fence = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        if in_fence or not (m := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)):
            continue
        slug = github_slug(m[1])
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def relative_links(page: Path) -> list[tuple[int, str]]:
    """(line, target) of every relative link and image outside code in ``page``."""
    out, in_fence = [], False
    for no, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        prose = re.sub(r"`[^`]*`", "", line)
        for m in [*LINK.finditer(prose), *HTML_LINK.finditer(prose)]:
            target = m["target"].strip("<>")
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
                continue
            out.append((no, target))
    return out


def broken_links(page: Path) -> list[str]:
    problems = []
    for no, target in relative_links(page):
        path_part, _, fragment = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        where = f"{page.relative_to(ROOT)}:{no}"
        if not dest.exists():
            problems.append(f"{where}: {target} -> {path_part} does not exist")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            problems.append(f"{where}: {target} -> no heading #{fragment} in {dest.relative_to(ROOT)}")
    return problems


# ---------------------------------------------------------------------------------------------------------------
# Running blocks: a fork server with the heavy imports done once, and the shims that talk to it
# ---------------------------------------------------------------------------------------------------------------

PRELOAD = ("tokenswap", "torch", "transformers", "datasets", "PIL.Image", "matplotlib.pyplot", "peft", "trl",
           "accelerate", "tokenswap.cli", "tokenswap.training", "tokenswap.eval.cli", "tokenswap.eval.leaderboard",
           "tokenswap.crossmath.cli", "tokenswap.rest.cli", "tokenswap.store.build", "tokenswap.compare",
           "tokenswap.testing")


def _recv_json(sock: socket.socket) -> tuple[dict, list[int]]:
    msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
    while not msg.endswith(b"\n"):
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        msg += chunk
    return json.loads(msg), fds


def _child(conn: socket.socket, request: dict, fds: list[int]) -> None:
    """In the forked worker: become the command (fds, folder, environment, argv), run it, report its status."""
    import ctypes
    import signal
    import traceback
    import warnings

    # runpy warns that a preloaded module (tokenswap.testing) is run again as __main__: true, and harmless here.
    warnings.filterwarnings("ignore", category=RuntimeWarning, module="runpy")

    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the server, never outlive the test
    except AttributeError:  # not Linux: a worker may outlive a killed test run
        pass
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", closefd=False, buffering=1)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False, buffering=1)  # noqa: SIM115
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = request["argv"]
    rc = 0
    try:
        rc = _run_in_process(argv)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 -- a traceback is the command's own failure, reported as exit 1
        traceback.print_exc()
        rc = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        try:
            conn.sendall(f"{int(rc or 0)}\n".encode())
        finally:
            os._exit(int(rc or 0) & 0xFF)


def _run_in_process(argv: list[str]) -> int:
    import runpy

    prog, args = os.path.basename(argv[0]), argv[1:]
    if prog == "tokenswap":
        from tokenswap.cli import main

        sys.argv = ["tokenswap", *args]
        return int(main(args) or 0)
    if args[:1] == ["-m"]:
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return 0
    sys.argv = list(args)
    sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
    runpy.run_path(args[0], run_name="__main__")
    return 0


def serve(path: str) -> None:
    """Import the heavy modules once, then fork one worker per command a shim sends."""
    import importlib
    import signal

    for name in PRELOAD:
        importlib.import_module(name)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    signal.signal(signal.SIGCHLD, lambda *_: _reap())
    print("ready", flush=True)
    while True:
        try:
            conn, _ = server.accept()
        except InterruptedError:
            continue
        request, fds = _recv_json(conn)
        if os.fork() == 0:
            server.close()
            _child(conn, request, fds)
        for fd in fds:
            os.close(fd)
        conn.close()


def _reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def client(path: str, argv: list[str]) -> int:
    """The shim's side: run ``argv`` in the server unless it is a plain interpreter call, then exit with its status.

    ``python FILE.py`` and ``python -m MODULE`` go to the server; anything else ``python`` is given (``-c``, no
    arguments) is handed to the real interpreter.
    """
    prog, args = os.path.basename(argv[0]), argv[1:]
    if prog != "tokenswap" and not ((args[:1] == ["-m"] and len(args) > 1) or (args and args[0].endswith(".py"))):
        os.execv(sys.executable, [sys.executable, *args])
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    env = {k: v for k, v in os.environ.items() if k != "DOCS_SERVER"}
    payload = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": env}).encode() + b"\n"
    socket.send_fds(sock, [payload], [0, 1, 2])
    reply = b""
    while chunk := sock.recv(64):
        reply += chunk
    if not reply.strip():
        print(f"{prog}: the worker died without an exit status (killed?)", file=sys.stderr)
        return 137
    return int(reply.strip())


SHIM = """#!/bin/sh
exec "{python}" "{harness}" client "$DOCS_SERVER" {prog} "$@"
"""


def write_shims(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for prog in ("tokenswap", "python", "python3"):
        path = bin_dir / prog
        path.write_text(SHIM.format(python=sys.executable, harness=Path(__file__).resolve(), prog=prog))
        path.chmod(0o755)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    elif sys.argv[1] == "client":
        sys.exit(client(sys.argv[2], sys.argv[3:]))
    else:
        sys.exit(f"usage: {sys.argv[0]} serve SOCKET | client SOCKET PROGRAM ARGS...")
