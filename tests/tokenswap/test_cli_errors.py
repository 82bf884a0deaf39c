"""CLI subcommands: missing inputs and bad counts are one clear line and exit code 2, never a traceback."""

from __future__ import annotations

import pytest

from tokenswap.cli import main


@pytest.mark.parametrize(
    "argv, message",
    [
        (["rest", "build", "--source", "soebench", "--n", "-1", "--out", "{tmp}/r"], "argument --n: must be >= 1, got -1"),
        (["rest", "build", "--source", "soebench", "--n", "0", "--out", "{tmp}/r"], "must be >= 1, got 0"),
        (["rest", "build", "--source", "mmlu", "--data", "{tmp}/mmlu.parquet", "--out", "{tmp}/r"], "does not exist"),
        (["rest", "eval", "--model", "{tmp}/ckpt", "--data", "{tmp}/nope", "--out", "{tmp}/o"], "--data '{tmp}/nope' does not exist"),
        (["rest", "eval", "--model", "{tmp}/ckpt", "--data", "{tmp}/built", "--out", "{tmp}/o"],
         "--model '{tmp}/ckpt' does not exist locally"),
        (["rest", "eval", "--model", "m", "--data", "{tmp}/built", "--out", "{tmp}/o", "--batch-size", "-2"], "must be >= 1"),
        (["build-store", "--config", "store_embedded.yaml", "output_dir={tmp}/b", "data.path={tmp}/typo.jsonl"],
         "`data.path` '{tmp}/typo.jsonl' does not exist"),
        (["build-store", "--config", "store_embedded.yaml", "output_dir={tmp}/b", "data.max_samples=-1"],
         "`max_samples` must be >= 1"),
        (["eval", "--backend", "openai", "--model", "m", "--bench", "{tmp}/nope", "--out", "{tmp}/r"],
         "--backend openai needs --base-url"),
        (["eval", "--backend", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--forms", "both,nope",
          "--bench", "{tmp}/nope", "--out", "{tmp}/r"], "argument --forms: expected a comma list of text, interleaved"),
        (["eval", "--backend", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--forms", "both",
          "--prompt", "k_shot", "--out", "{tmp}/r"], "--prompt k_shot has shots for the text and interleaved forms"),
        (["eval", "--model", "m", "--max-error-share", "5", "--out", "{tmp}/r"], "must be between 0 and 1"),
        (["eval", "--backend", "openai", "--base-url", "ftp://host/v1", "--model", "m", "--out", "{tmp}/r"],
         "--base-url must be an http(s) URL"),
        (["eval", "--backend", "openai", "--base-url", "https://me:pw@host/v1", "--model", "m", "--out", "{tmp}/r"],
         "`--base-url` on the command line is a URL carrying a user or password"),  # refused before the flags
        (["crossmath", "eval", "--backend", "openai", "--model", "m", "--data", "{tmp}/nope", "--modality", "text",
          "--out", "{tmp}/r"], "--backend openai needs --base-url"),
        (["rest", "eval", "--backend", "openai", "--model", "m", "--data", "{tmp}/built", "--out", "{tmp}/r"],
         "--backend openai needs --base-url"),
        (["rest", "eval", "--model", "m", "--data", "{tmp}/built", "--family", "llava", "--out", "{tmp}/r"],
         "--family must be one of"),
    ],
    ids=["rest-n-negative", "rest-n-zero", "rest-data-missing", "rest-eval-data-missing", "rest-eval-model-missing",
         "rest-eval-batch-negative", "build-store-data-typo", "build-store-negative-limit", "eval-openai-no-url",
         "eval-unknown-form", "eval-k-shot-forms", "eval-error-share-range", "eval-url-scheme", "eval-url-credentials", "crossmath-openai-no-url",
         "rest-openai-no-url", "rest-unknown-family"],
)
def test_missing_inputs_and_bad_counts_exit_2_with_one_clear_line(tmp_path, capsys, argv, message):
    (tmp_path / "built").mkdir()
    (tmp_path / "built" / "meta.json").write_text('{"variants": ["plain"]}')
    try:
        code = main([a.format(tmp=tmp_path) for a in argv])
    except SystemExit as e:  # argparse's own usage errors exit 2 from inside the parser
        code = e.code
    err = capsys.readouterr().err
    assert code == 2
    assert message.format(tmp=tmp_path) in err
    assert "Traceback" not in err and "Repo id must" not in err and "pw@" not in err
    assert not (tmp_path / "r").exists() and not (tmp_path / "b" / "state").exists()



@pytest.mark.parametrize(
    "argv, written",
    [
        (["crossmath", "generate", "--n", "2", "--out", "{tmp}/cm"], "{tmp}/cm/"),
        (["build-store", "--config", "store_embedded.yaml", "output_dir={tmp}/b", "data.max_samples=2"], "{tmp}/b/"),
    ],
    ids=["crossmath-generate", "build-store"],
)
def test_a_full_disk_is_one_line_naming_the_file_and_the_free_space(tmp_path, capsys, monkeypatch, argv, written):
    # A write refused by a full disk (the fsync of files.atomic_write, where the kernel reports ENOSPC) used to end
    # in an "OSError: [Errno 28]" traceback; training already named the disk and its free space.
    import errno
    import os

    real_fsync = os.fsync

    def full(fd):
        if os.path.isfile(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full)
    code = main([a.format(tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert code == 1, err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"writing '{written.format(tmp=tmp_path)}" in lines[0] and "[Errno 28]" in lines[0], lines[0]
    assert f"(disk of {os.path.realpath(tmp_path)}" in lines[0] and " MiB free)" in lines[0], lines[0]
    assert "run the same command again" in lines[0]


def test_ctrl_c_in_a_command_is_one_line_and_130(tmp_path, capsys, monkeypatch):
    from tokenswap.crossmath import cli as crossmath_cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(crossmath_cli, "generate_puzzles", interrupted)
    code = main(["crossmath", "generate", "--n", "2", "--out", str(tmp_path / "cm")])
    err = capsys.readouterr().err
    assert code == 130
    assert err.strip().splitlines() == ["tokenswap crossmath: error: interrupted (Ctrl-C): every file and answer "
                                        "written so far is kept whole; run the same command again to resume from them"]


@pytest.mark.integration
def test_a_new_folder_in_a_read_only_place_is_one_line_and_2(tmp_path, capsys):
    # A training run's os.makedirs of a new run.output_dir on a read-only mount was an OSError traceback.
    import os
    import subprocess

    from tokenswap.errors import exit_status

    disk = tmp_path / "ro"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(disk)],
                      capture_output=True).returncode != 0:
        pytest.skip("needs root and mount -t tmpfs for a read-only disk")
    try:
        code = exit_status(lambda: os.makedirs(disk / "runs" / "new"), prefix="x: ")
    finally:
        subprocess.run(["umount", str(disk)], check=True)
    err = capsys.readouterr().err
    assert code == 2
    assert err.splitlines() == [f"x: error: cannot use '{disk / 'runs'}' (Read-only file system): a read-only disk or "
                                "no permission; pick a folder you can write to (or fix its permissions)"]
