"""One writer (issue 39 item 9): the REST renderings and the CrossMath pictures are written through
files.atomic_write, so writers of one file never share a temporary (the old fixed ``X.tmp.png`` was truncated by one
writer while another renamed it, or renamed away under it) and nothing is left beside the file."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from PIL import Image

from tokenswap.crossmath.cli import _write_image
from tokenswap.rest.build import _save_atomic


def write_at_once(write, path: Path, writers: int = 6, rounds: int = 25) -> list[BaseException]:
    """``writers`` threads each writing their own picture to ``path`` ``rounds`` times; the errors they raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(writers)

    def work(i: int) -> None:
        image = Image.new("RGB", (160 + i, 120), (40 * i, 90, 200))
        start.wait()
        for _ in range(rounds):
            try:
                write(image, path)
            except BaseException as e:  # noqa: BLE001 -- collected: the test is that there are none
                errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


@pytest.mark.parametrize("write", [_save_atomic, _write_image], ids=["rest-rendering", "crossmath-picture"])
def test_writers_of_one_picture_never_collide(tmp_path, write):
    path = tmp_path / "item.png"
    errors = write_at_once(write, path)
    assert errors == []
    with Image.open(path) as im:  # a whole picture of one writer, not a mix or a cut one
        im.load()
        assert im.size[1] == 120 and 160 <= im.size[0] < 166
    assert sorted(p.name for p in tmp_path.iterdir()) == ["item.png"]  # no temporary left
