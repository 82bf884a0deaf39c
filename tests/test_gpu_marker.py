"""The `gpu` marker, and only the marker, skips a test on a machine without CUDA."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

CONFTEST = Path(__file__).resolve().parent / "conftest.py"


@pytest.mark.integration
def test_a_checkout_folder_named_gpu_does_not_skip_its_tests(tmp_path):
    folder = tmp_path / "gpu"  # the folder's name is a keyword of every test in it
    folder.mkdir()
    shutil.copy(CONFTEST, folder / "conftest.py")
    (folder / "test_named.py").write_text(
        "import pytest\n\n\ndef test_plain():\n    pass\n\n\n@pytest.mark.gpu\ndef test_marked():\n    pass\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-W",
         "ignore::pytest.PytestUnknownMarkWarning", "--rootdir", str(folder), str(folder)],
        cwd=folder, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    marked = "1 passed, 1 skipped" if not torch.cuda.is_available() else "2 passed"
    assert marked in done.stdout, done.stdout
    if not torch.cuda.is_available():
        assert "test_named.py:8: needs a CUDA device" in done.stdout, done.stdout
