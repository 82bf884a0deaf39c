"""The ground floor: atomic writes leave no stray file, the folder lock refuses what it cannot be, checked readers."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tokenswap.errors import InputError
from tokenswap.files import (
    _HOST,
    FolderLock,
    FolderLockedError,
    atomic_write,
    cut_torn_tail,
    iter_jsonl,
    json_loads,
    read_json,
    read_json_object,
    read_jsonl,
    remove_dead_temporaries,
)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid  # reaped: no process has this id now (pids are not reused this fast)


@pytest.mark.integration
def test_a_dead_writers_temporary_goes_with_the_next_write_and_the_sweep(tmp_path):
    dead = _dead_pid()
    stale = tmp_path / f"report.json.{dead}-7-{_HOST}.tmp"
    legacy = tmp_path / f"rejected-r000-000001.json.{dead}-7.tmp"  # written before the host part existed
    live = tmp_path / f"report.json.{os.getppid()}-7-{_HOST}.tmp"
    other_host = tmp_path / f"report.json.{dead}-7-00000000.tmp"
    unrelated = tmp_path / "notes.tmp"
    for p in (stale, legacy, live, other_host, unrelated):
        p.write_text("half")
    atomic_write(tmp_path / "report.json", b"{}")
    assert (tmp_path / "report.json").read_bytes() == b"{}"
    assert not stale.exists() and legacy.exists()  # the write cleans its own file's temporaries only
    (tmp_path / "sub").mkdir()
    deep = tmp_path / "sub" / f"x.arrow.{dead}-1-{_HOST}.tmp"
    deep.write_text("half")
    assert sorted(remove_dead_temporaries(tmp_path)) == sorted([legacy, deep])
    assert live.exists() and other_host.exists() and unrelated.exists()


def test_a_failed_write_removes_its_temporary(tmp_path):
    target = tmp_path / "taken"
    target.mkdir()  # os.replace of a file onto a folder fails after the temporary is written
    with pytest.raises(OSError):
        atomic_write(target, b"data")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


@pytest.mark.integration
def test_a_killed_writer_leaves_a_temporary_the_rerun_removes(tmp_path):
    # A real writer killed between writing its temporary and renaming it.
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        import tokenswap.files as files
        real = os.replace
        def stop(src, dst):
            os.kill(os.getpid(), signal.SIGKILL)
        files.os.replace = stop
        files.atomic_write(Path({str(tmp_path)!r}) / "store.json", b"new")
    """)
    proc = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == -signal.SIGKILL
    assert len(list(tmp_path.glob("store.json.*.tmp"))) == 1
    assert len(remove_dead_temporaries(tmp_path)) == 1 and not list(tmp_path.iterdir())


def test_lock_refuses_a_second_holder_and_frees_on_release(tmp_path):
    first = FolderLock(tmp_path, prefix=".job-lock", doing="in use", what="job").acquire()
    with pytest.raises(FolderLockedError, match=f"pid {os.getpid()}"):
        FolderLock(tmp_path, prefix=".job-lock").acquire()
    first.release()
    with FolderLock(tmp_path, prefix=".job-lock"):
        pass


def test_lock_does_not_follow_a_planted_symlink(tmp_path):
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    (tmp_path / ".job-lock-r000").symlink_to(victim)
    with pytest.raises(InputError, match="symbolic link"):
        FolderLock(tmp_path, prefix=".job-lock").acquire()
    assert victim.read_text() == "keep me"


def test_lock_refuses_a_folder_in_its_place(tmp_path):
    (tmp_path / ".job-lock-r000").mkdir()
    with pytest.raises(InputError, match="is a folder"):
        FolderLock(tmp_path, prefix=".job-lock").acquire()


@pytest.mark.integration
def test_lock_on_a_read_only_disk_is_named(tmp_path):
    disk = tmp_path / "ro"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(disk)],
                      capture_output=True).returncode != 0:
        pytest.skip("needs root and mount -t tmpfs for a read-only disk")
    try:
        with pytest.raises(InputError, match="writable"):
            FolderLock(disk, prefix=".job-lock").acquire()
    finally:
        subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.integration
def test_a_forked_child_does_not_keep_the_lock_after_its_parent_dies(tmp_path):
    # The holder forks a long-lived child (as a data-loader worker is) and is SIGKILLed: the folder is free at once,
    # not when the orphaned child notices.
    script = textwrap.dedent(f"""
        import os, sys, time
        from tokenswap.files import FolderLock
        FolderLock({str(tmp_path)!r}, prefix=".job-lock").acquire()
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        print("locked", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(FolderLockedError):
            FolderLock(tmp_path, prefix=".job-lock").acquire()
        proc.kill()
        proc.wait()
        time.sleep(0.2)
        with FolderLock(tmp_path, prefix=".job-lock"):  # the child is still alive, the lock is not
            pass
    finally:
        os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "is empty"),
        (b'{"a": ', "not valid JSON"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"n": ' + b"9" * 5000 + b"}", "not valid JSON"),
    ],
)
def test_read_json_names_the_file_for_every_refusal(tmp_path, content, message):
    path = tmp_path / "run.json"
    path.write_bytes(content)
    with pytest.raises(InputError, match=message) as err:
        read_json(path, "run file", "delete it and rerun")
    assert str(path) in str(err.value) and "delete it and rerun" in str(err.value)


def test_read_json_object_and_jsonl(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("[1]")
    with pytest.raises(InputError, match="not an object"):
        read_json_object(path, "x")
    lines = tmp_path / "x.jsonl"
    lines.write_text('{"a": 1}\n\n[2]\n')
    with pytest.raises(InputError, match=r"x.jsonl:3 holds a JSON list"):
        read_jsonl(lines, "records")
    lines.write_text('{"a": 1}\n' + "[" * 100_000 + "\n")
    with pytest.raises(InputError, match=r"x.jsonl:2 is not valid JSON \(JSON nested too deeply"):
        read_jsonl(lines, "records")
    lines.write_text('{"a": 1}\n{"b": 2}\n')
    assert read_jsonl(lines, "records") == [{"a": 1}, {"b": 2}]
    assert json_loads(json.dumps({"k": [1, 2]})) == {"k": [1, 2]}
    with pytest.raises(ValueError):
        json_loads("9" * 5000)
    # A missing file is an input to fix like any other (exit 2 through tokenswap.cli.main), not an OSError.
    with pytest.raises(InputError, match=r"records '.*nope.jsonl' does not exist; restore or regenerate it"):
        read_jsonl(Path(tmp_path / "nope.jsonl"), "records")
    with pytest.raises(InputError, match=r"run file '.*nope.json' does not exist; delete it"):
        read_json(tmp_path / "nope.json", "run file", "delete it")


def test_iter_jsonl_names_each_line_and_yields_bad_ones_when_asked(tmp_path):
    lines = tmp_path / "x.jsonl"
    lines.write_bytes(b'{"a": 1}\n\n[2]\n{"b": "\xff"}\n{"c": \n{"d": 4}')
    got = list(iter_jsonl(lines, "records", "fix it", yield_malformed=True))
    assert [where for where, _ in got] == [f"{lines}:{n}" for n in (1, 3, 4, 5, 6)]
    assert got[0][1] == {"a": 1} and got[-1][1] == {"d": 4}
    assert [str(row) for _, row in got[1:4]] == [
        f"records {lines}:3 holds a JSON list, not an object",
        f"records {lines}:4 is not UTF-8 text (byte 7 of the line)",
        f"records {lines}:5 is not valid JSON (Expecting value at line 1, column 7; a run killed mid-write?)",
    ]
    assert all(isinstance(row, InputError) for _, row in got[1:4])
    with pytest.raises(InputError, match=r"records .*x.jsonl:3 holds a JSON list, not an object; fix it"):
        list(iter_jsonl(lines, "records", "fix it"))


def _damaged_jsonl(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    good = {"id": "s0", "messages": [{"role": "user", "content": "a cat"}, {"role": "assistant", "content": "ok"}],
            "concepts": [], "images": [], "uuid": "u0",
            "conversations": [{"from": "human", "value": "a cat"}, {"from": "gpt", "value": "ok"}]}
    path.write_text(json.dumps(good) + "\n" + json.dumps(good)[:30] + "\n")
    return path


def test_every_jsonl_reader_refuses_a_damaged_line_with_one_error(tmp_path):
    # One damaged line gave a MalformedLine (a ValueError) in the Magpie, sample and build readers and an
    # InputError in the others; now every reader goes through iter_jsonl and names `path:2` the same way.
    from tokenswap.crossmath.data import read_jsonl as read_crossmath
    from tokenswap.data.magpie import iter_magpie
    from tokenswap.data.schema import load_samples
    from tokenswap.store.stages import read_swap_dataset

    damaged = _damaged_jsonl(tmp_path / "data" / "part-r000-000000.jsonl")
    readers = {
        "crossmath": lambda: read_crossmath(damaged),
        "magpie": lambda: list(iter_magpie(str(damaged), streaming=False)),
        "samples": lambda: load_samples(str(damaged)),
        "swap dataset": lambda: read_swap_dataset(damaged.parent),
    }
    for name, read in readers.items():
        with pytest.raises(InputError) as err:
            read()
        assert f"{damaged}:2 is not valid JSON (Unterminated string" in str(err.value), name


def test_read_jsonl_keeps_a_record_whose_string_holds_a_line_separator(tmp_path):
    # json.dumps(ensure_ascii=False) writes U+2028 / U+0085 raw; str.splitlines would break the record there.
    rows = [{"response": "one\u2028two\x85three\x1cfour"}, {"b": 2}]
    lines = tmp_path / "x.jsonl"
    lines.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert read_jsonl(lines, "records") == rows


def test_cut_torn_tail_removes_only_an_unterminated_last_line(tmp_path):
    lines = tmp_path / "x.jsonl"
    assert cut_torn_tail(lines) == 0 and not lines.exists()
    lines.write_bytes(b'{"a": 1}\n{"b": 2}\n')
    assert cut_torn_tail(lines) == 0 and lines.read_bytes() == b'{"a": 1}\n{"b": 2}\n'
    lines.write_bytes(b'{"a": 1}\n{"b": 2}\n{"c": ')
    assert cut_torn_tail(lines) == 6 and lines.read_bytes() == b'{"a": 1}\n{"b": 2}\n'
    lines.write_bytes(b'{"c": ')
    assert cut_torn_tail(lines) == 6 and lines.read_bytes() == b""


# A job taking the lock, paused right after a successful exclusive flock: "first" waits for a line on stdin after its
# first one, "lockfile" sleeps 1 s (less than the readers' wait for a believable tag) after the one of the lock file.
# It then prints "acquired" or the refusal, and holds what it holds until stdin closes.
_PAUSED_TAKER = textwrap.dedent("""
    import fcntl, os, sys, time
    from tokenswap.files import FolderLock, FolderLockedError
    folder, mode = sys.argv[1], sys.argv[2]
    lock_path = os.path.join(folder, ".job-lock-r000")
    real, paused = fcntl.flock, []
    def flock(fd, op):
        real(fd, op)
        if op & fcntl.LOCK_EX and not paused:
            if mode == "first":
                paused.append(1)
                print("locked", flush=True)
                sys.stdin.readline()
            elif os.readlink(f"/proc/self/fd/{fd}") == lock_path:
                paused.append(1)
                print("locked", flush=True)
                time.sleep(1.0)
    fcntl.flock = flock
    try:
        FolderLock(folder, prefix=".job-lock").acquire()
        print("acquired", flush=True)
    except FolderLockedError as e:
        print(f"refused {e}", flush=True)
    sys.stdin.read()
""")


def _paused_taker(folder: Path, mode: str) -> subprocess.Popen:
    taker = subprocess.Popen([sys.executable, "-c", _PAUSED_TAKER, str(folder), mode], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert taker.stdout.readline().strip() == "locked"
    return taker


@pytest.mark.integration
def test_a_lock_held_for_an_instant_already_names_its_holder(tmp_path):
    # Paused the instant its flock succeeded: a job that collides with it then must learn its pid (the tag used to be
    # written after the flock, and the second of two builds started together said "unknown process"). Either the
    # contender is refused naming the taker, or it gets the lock and the taker is refused naming the contender.
    taker = _paused_taker(tmp_path, "first")
    try:
        try:
            mine = FolderLock(tmp_path, prefix=".job-lock").acquire()
        except FolderLockedError as e:
            assert f"(pid {taker.pid} on host " in str(e), str(e)
            mine = None
        taker.stdin.write("go\n")
        taker.stdin.flush()
        said = taker.stdout.readline()
        if mine is not None:
            assert said.startswith("refused ") and f"(pid {os.getpid()} on host " in said, said
            mine.release()
        else:
            assert said.strip() == "acquired"
    finally:
        taker.stdin.close()
        taker.wait()


@pytest.mark.integration
def test_a_dead_holders_lock_file_is_taken_over_and_names_the_new_holder(tmp_path):
    # A holder SIGKILLed leaves its lock file and tag; the next job takes it over. A job colliding with the taker
    # while it holds the dead one's file must name the taker, not the dead holder.
    dead = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, signal
        from tokenswap.files import FolderLock
        FolderLock({str(tmp_path)!r}, prefix=".job-lock").acquire()
        os.kill(os.getpid(), signal.SIGKILL)
    """)], env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    dead.wait()
    assert f"pid {dead.pid} on host" in (tmp_path / ".job-lock-r000").read_text()
    taker = _paused_taker(tmp_path, "lockfile")
    try:
        with pytest.raises(FolderLockedError) as refused:
            FolderLock(tmp_path, prefix=".job-lock").acquire()
        assert f"(pid {taker.pid} on host " in str(refused.value), str(refused.value)
        assert taker.stdout.readline().strip() == "acquired"
        assert f"pid {taker.pid} on host" in (tmp_path / ".job-lock-r000").read_text()
    finally:
        taker.stdin.close()
        taker.wait()
    assert not list(tmp_path.glob("*.tmp"))  # the taker's tagged temporary went into place


def test_the_tag_names_the_command_without_its_secrets_and_release_removes_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/venv/bin/tokenswap", "build-store", "judge.api_key=sk-very-secret"])
    lock = FolderLock(tmp_path, prefix=".job-lock").acquire()
    tag = (tmp_path / ".job-lock-r000").read_text()
    assert tag.startswith(f"pid {os.getpid()} on host ") and tag.endswith(", running tokenswap build-store\n")
    assert "secret" not in tag
    lock.release()
    assert not list(tmp_path.iterdir())  # a lock file left in a folder is a dead holder's


def test_a_held_lock_without_a_readable_tag_is_named_unknown_after_a_bounded_wait(tmp_path, monkeypatch):
    import fcntl

    import tokenswap.files as files

    monkeypatch.setattr(files, "_TAG_WAIT_S", 0.3)
    fd = os.open(tmp_path / ".job-lock-r000", os.O_RDWR | os.O_CREAT)  # an untagged holder (an older tokenswap)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        t0 = time.monotonic()
        with pytest.raises(FolderLockedError, match=r"by another process \(unknown process\)"):
            FolderLock(tmp_path, prefix=".job-lock").acquire()
        assert 0.3 <= time.monotonic() - t0 < 5
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- a disk without hard links

_LINK_REFUSALS = ["EPERM", "ENOTSUP", "ENOSYS", "EXDEV"]


@pytest.mark.parametrize("name", _LINK_REFUSALS)
def test_a_disk_that_refuses_hard_links_still_locks_and_names_the_holder(tmp_path, monkeypatch, name):
    # exFAT, FUSE and some SMB mounts answer link(2) with one of these: the lock used to say the folder "must be
    # writable" though it is.
    import errno as errno_module

    code = getattr(errno_module, name)

    def no_link(src, dst, *args, **kwargs):
        raise OSError(code, os.strerror(code), str(src), None, str(dst))

    monkeypatch.setattr(os, "link", no_link)
    lock = FolderLock(tmp_path, prefix=".job-lock").acquire()
    tag = (tmp_path / ".job-lock-r000").read_text()
    assert tag.startswith(f"pid {os.getpid()} on host ")
    assert not list(tmp_path.glob("*.tmp"))
    with pytest.raises(FolderLockedError, match=rf"\(pid {os.getpid()} on host "):
        FolderLock(tmp_path, prefix=".job-lock").acquire()
    lock.release()
    assert not list(tmp_path.iterdir())
    FolderLock(tmp_path, prefix=".job-lock").acquire().release()  # free again once released


@pytest.mark.integration
def test_a_dead_holders_lock_is_taken_over_on_a_disk_without_hard_links(tmp_path, monkeypatch):
    (tmp_path / ".job-lock-r000").write_text(f"pid {_dead_pid()} on host {os.uname().nodename} since then\n")

    def no_link(src, dst, *args, **kwargs):
        raise PermissionError(1, "Operation not permitted", str(src))

    monkeypatch.setattr(os, "link", no_link)
    lock = FolderLock(tmp_path, prefix=".job-lock").acquire()
    assert (tmp_path / ".job-lock-r000").read_text().startswith(f"pid {os.getpid()} on host ")
    lock.release()


@pytest.mark.integration
def test_a_new_output_folder_in_a_read_only_place_is_one_input_error(tmp_path):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        if os.access(parent, os.W_OK):  # root ignores the mode: a read-only mount is needed instead
            if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(parent)],
                              capture_output=True).returncode != 0:
                pytest.skip("needs a read-only folder (root ignores modes, and mount -t tmpfs failed)")
        try:
            with pytest.raises(InputError, match="cannot create the output folder .*writable disk"):
                FolderLock(parent / "new" / "out", prefix=".job-lock").acquire()
        finally:
            subprocess.run(["umount", str(parent)], capture_output=True)
    finally:
        parent.chmod(0o755)


def _vfat_mount(tmp_path: Path) -> Path:
    import shutil

    mkfs = shutil.which("mkfs.vfat") or shutil.which("mkfs.fat")
    if mkfs is None or os.geteuid() != 0:
        pytest.skip("needs root and mkfs.vfat (dosfstools) for a real disk without hard links")
    image, mount = tmp_path / "fat.img", tmp_path / "fat"
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(8 << 20)
    subprocess.run([mkfs, str(image)], check=True, capture_output=True)
    if subprocess.run(["mount", "-o", "loop", str(image), str(mount)], capture_output=True).returncode != 0:
        pytest.skip("cannot loop-mount a vfat image here")
    return mount


@pytest.mark.integration
def test_the_lock_works_on_a_real_vfat_mount(tmp_path):
    mount = _vfat_mount(tmp_path)
    try:
        lock = FolderLock(mount / "out", prefix=".job-lock").acquire()
        assert f"pid {os.getpid()} on host " in (mount / "out" / ".job-lock-r000").read_text()
        with pytest.raises(FolderLockedError, match=rf"\(pid {os.getpid()} on host "):
            FolderLock(mount / "out", prefix=".job-lock").acquire()
        lock.release()
    finally:
        subprocess.run(["umount", str(mount)], check=True)
