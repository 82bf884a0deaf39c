"""Section ``no_link`` of benchmarks/faults.py: the folder lock on a disk that refuses hard links (exFAT, FUSE, some
SMB mounts answer ``link(2)`` with EPERM, ENOTSUP, ENOSYS or EXDEV). Each command runs with ``os.link`` refusing one
errno (a wrapper patches it, then runs the real ``tokenswap`` entry): a build completes; a second build on a folder
a holder keeps is refused naming the holder's pid; released, the same command completes. Where this machine can
loop-mount a vfat image (root, ``mkfs.vfat``), the same trials run on it, with nothing patched.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ._common import ENV, PY, REPO, Tally, run

OUTCOME = ("where link(2) is refused the lock falls back to create-and-flock: builds complete, a second build on a "
           "held folder exits 1 naming the holder's pid, the released folder builds")

# Runs argv[2:] as `tokenswap ...` with os.link refusing errno argv[1] (0: not patched).
_WRAPPER = r"""
import errno, os, runpy, sys
code = int(sys.argv[1])
if code:
    def refused(src, dst, *args, **kwargs):
        raise OSError(code, os.strerror(code), src, None, dst)
    os.link = refused
sys.argv = ["tokenswap", *sys.argv[2:]]
runpy.run_module("tokenswap.cli", run_name="__main__")
"""

# Holds FolderLock(argv[2], prefix=.build-lock) with os.link refusing errno argv[1]; prints "locked", holds until
# stdin closes.
_HOLDER = r"""
import os, sys
code = int(sys.argv[1])
if code:
    def refused(src, dst, *args, **kwargs):
        raise OSError(code, os.strerror(code), src, None, dst)
    os.link = refused
from tokenswap.files import FolderLock
lock = FolderLock(sys.argv[2], prefix=".build-lock").acquire()
print("locked", flush=True)
sys.stdin.read()
lock.release()
"""

_BUILD = ["build-store", "--config", "store_embedded.yaml", "data.max_samples=16", "samples_per_shard=8",
          "progress=false"]


def _build(out: Path, code: int) -> subprocess.CompletedProcess:
    return run([PY, "-c", _WRAPPER, str(code), *_BUILD, f"output_dir={out}"], 600)


def _trials(t: Tally, root: Path, code: int, where: str) -> None:
    name = errno.errorcode[code] if code else "nothing patched"
    out = root / f"build-{name}"
    first = _build(out, code)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    t.add("no_link", f"{where}, link refused with {name}: build-store completes",
          first.returncode == 0 and report.get("complete") is True, f"rc={first.returncode}: {first.stderr[-300:]}")
    held = root / f"held-{name}"
    holder = subprocess.Popen([PY, "-c", _HOLDER, str(code), str(held)], cwd=REPO, env=ENV, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = holder.stdout.readline().strip() == "locked"
        second = _build(held, code) if ready else None
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    named = second is not None and f"(pid {holder.pid} on host " in second.stderr
    t.add("no_link", f"{where}, link refused with {name}: a build on a held folder exits 1 naming the holder",
          second is not None and second.returncode == 1 and named,
          "the holder never locked" if second is None else f"rc={second.returncode}: {second.stderr[-300:]}")
    again = _build(held, code)
    t.add("no_link", f"{where}, link refused with {name}: the released folder builds", again.returncode == 0,
          f"rc={again.returncode}: {again.stderr[-300:]}")


def _vfat(work: Path) -> Path | None:
    mkfs = shutil.which("mkfs.vfat") or shutil.which("mkfs.fat")
    if mkfs is None or os.geteuid() != 0:
        return None
    image, mount = work / "no-link-fat.img", work / "no-link-fat"
    mount.mkdir(exist_ok=True)
    with open(image, "wb") as f:
        f.truncate(64 << 20)
    if subprocess.run([mkfs, str(image)], capture_output=True).returncode != 0:
        return None
    if subprocess.run(["mount", "-o", "loop", str(image), str(mount)], capture_output=True).returncode != 0:
        return None
    return mount


def section_no_link(t: Tally, work: Path) -> None:
    root = work / "no-link"
    root.mkdir(parents=True, exist_ok=True)
    for code in (errno.EPERM, errno.ENOTSUP, errno.ENOSYS, errno.EXDEV):
        _trials(t, root, code, "os.link patched")
    mount = _vfat(work)
    if mount is None:
        t.note("no_link", "no vfat mount here (needs root, mkfs.vfat and a loop device): only the patched trials ran")
        return
    try:
        _trials(t, mount, 0, "a real vfat mount")
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)


if __name__ == "__main__":  # pragma: no cover - run through benchmarks/faults.py
    sys.exit("run: python benchmarks/faults.py --sections no_link")
