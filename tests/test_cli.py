"""The ``coded-shuffle`` command: JSON lines, exit codes, one-line errors (docs/command.md)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from coded_shuffle.tools.cli import main

KEYS = {
    "scheme": str,
    "workers": int,
    "points": int,
    "storage": float,
    "epoch": int,
    "load_points": float,
    "uncoded_points": float,
    "lower_bound_points": float,
    "lower_bound_exact": bool,
    "broadcast_bytes": int,
    "verified": bool,
}


def json_lines(capsys, argv: list[str]) -> list[dict]:
    assert main(argv) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_json_lines_have_the_promised_keys(capsys):
    rows = json_lines(
        capsys, ["evaluate", "--scheme", "uncoded", "-K", "4", "-N", "40", "-E", "3", "--json"]
    )
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    for row in rows:
        for key, kind in KEYS.items():
            assert isinstance(row[key], kind), key
        assert row["verified"] is True
        assert row["load_points"] == row["uncoded_points"]
        assert row["lower_bound_points"] <= row["load_points"]
        # 64 bytes per point, plus one frame header
        assert row["broadcast_bytes"] >= 64 * row["load_points"]
        # no excess storage: every worker stores exactly its batch of N/K points
        assert row["stored_bytes_max"] == 64 * 40 // 4


def test_old_new_files_give_one_transition(tmp_path, capsys):
    old = np.repeat(np.arange(3), 5)
    new = np.array([0, 0, 1, 2, 2, 0, 0, 1, 2, 2, 0, 1, 1, 1, 2])
    np.save(tmp_path / "old.npy", old)
    np.save(tmp_path / "new.npy", new)
    argv = ["evaluate", "--scheme", "uncoded", "-K", "3", "-N", "15", "--json"]
    rows = json_lines(
        capsys, [*argv, "--old", str(tmp_path / "old.npy"), "--new", str(tmp_path / "new.npy")]
    )
    assert len(rows) == 1
    assert rows[0]["uncoded_points"] == 11  # the seed-001 example shuffle


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scheme", "nope", "-K", "3", "-N", "15"], "unknown scheme 'nope'"),
        (["--scheme", "uncoded", "-K", "3", "-N", "16"], "multiple of workers"),
        (["--scheme", "uncoded", "-K", "3", "-N", "15", "-T", "4"], "out of range 1..3"),
        (["--scheme", "uncoded", "-K", "3", "-N", "15", "-T", "0.5"], "out of range 1..3"),
        (["--scheme", "uncoded", "-K", "0", "-N", "15"], "workers must be >= 1"),
        (["--scheme", "uncoded", "-K", "3", "-N", "15", "--shuffle", "sideways"], "sideways"),
        (["--scheme", "uncoded", "-K", "3", "-N", "15", "-B", "0"], "point bytes"),
        (["--scheme", "uncoded", "-K", "3", "-N", "15", "--old", "x.npy"], "go together"),
        (["--scheme", "uncoded", "-K", "x", "-N", "15"], "invalid int value: 'x'"),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(args, message, capsys):
    assert main(["evaluate", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("coded-shuffle: error:") and message in err[0]


def test_bad_files_give_one_line(tmp_path, capsys):
    np.save(tmp_path / "short.npy", np.zeros(4, dtype=np.int64))
    np.save(tmp_path / "ok.npy", np.repeat(np.arange(3), 5))
    (tmp_path / "junk.npy").write_text("not numpy")
    base = [
        "evaluate",
        "--scheme",
        "uncoded",
        "-K",
        "3",
        "-N",
        "15",
        "--new",
        str(tmp_path / "ok.npy"),
    ]
    for bad, message in [
        ("short.npy", "length 15"),
        ("junk.npy", "cannot read"),
        ("none.npy", "cannot read"),
    ]:
        assert main([*base, "--old", str(tmp_path / bad)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0]
    np.save(tmp_path / "ids.npy", np.array([0] * 5 + [1] * 5 + [3] * 5))
    assert main([*base, "--old", str(tmp_path / "ids.npy")]) == 2
    assert "worker id 3 out of range 0..2" in capsys.readouterr().err


def test_module_entry_point_has_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "coded_shuffle", "evaluate", "--scheme", "x", "-K", "2", "-N", "4"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


def paper_example(tmp_path) -> list[str]:
    """Attia & Tandon 2016's example: K = 3, N = 15, S = [[2,1,2],[2,1,2],[1,3,1]]."""
    s = [[2, 1, 2], [2, 1, 2], [1, 3, 1]]
    old = np.repeat(np.arange(3), 5)
    new = np.concatenate([np.repeat(np.arange(3), row) for row in s])
    np.save(tmp_path / "old.npy", old)
    np.save(tmp_path / "new.npy", new)
    return ["--old", str(tmp_path / "old.npy"), "--new", str(tmp_path / "new.npy")]


@pytest.mark.parametrize(("scheme", "load"), [("uncoded", 11), ("attia-tandon", 6), ("cycles", 6)])
def test_paper_example_through_the_command(tmp_path, capsys, scheme, load):
    argv = [
        "evaluate",
        "--scheme",
        scheme,
        "-K",
        "3",
        "-N",
        "15",
        "--json",
        *paper_example(tmp_path),
    ]
    (row,) = json_lines(capsys, argv)
    assert row["load_points"] == load and row["uncoded_points"] == 11
    assert row["pairs_only_points"] == 7
    assert row["lower_bound_points"] == 6 and row["lower_bound_exact"] is True
    assert row["verified"] is True
    # 64-byte points: load * 64 bytes of payload plus one 24-byte frame header
    assert row["broadcast_bytes"] == load * 64 + 24


@pytest.mark.parametrize(
    ("scheme", "storage", "load"),
    [
        ("elmahdy-mohajer", 2.0, 1.0),
        ("elmahdy-mohajer", 3.0, 1 / 3),
        ("attia-tandon-excess", 2.5, 2 / 3),
    ],
)
def test_the_default_point_size_reaches_the_papers_corners(capsys, scheme, storage, load):
    """Seeds 003/004 with K = N = 4 on the worst shuffle: the default point size is one that
    every split count divides, so ``T`` is what was asked and the load is the paper's."""
    argv = ["evaluate", "--scheme", scheme, "-K", "4", "-N", "4", "-T", str(storage)]
    (row,) = json_lines(capsys, [*argv, "--shuffle", "worst", "--json"])
    assert row["load_points"] == pytest.approx(load)
    assert row["storage_used"] == pytest.approx(storage) and row["storage_shifted"] is False
    assert row["stored_points_max"] == pytest.approx(storage)
    assert row["point_bytes"] >= 64


def test_a_point_size_that_shifts_the_corner_says_so(capsys):
    """64-byte points cannot be cut into 3 equal sub-points: bytes move to another corner, and
    both the JSON line and the human line say which ``T`` is really stored."""
    argv = ["evaluate", "--scheme", "elmahdy-mohajer", "-K", "4", "-N", "4", "-T", "2", "-B", "64"]
    (row,) = json_lines(capsys, [*argv, "--shuffle", "worst", "--json"])
    assert row["storage_shifted"] is True and row["storage_used"] == pytest.approx(1.984375)
    assert row["load_points"] == pytest.approx(1.03125)
    assert main([*argv, "--shuffle", "worst"]) == 0
    line = capsys.readouterr().out
    assert "64-byte points store T = 1.98438, not 2: bytes moved to another corner" in line


def test_transports_lists_every_transport_with_the_keys_the_job_reads(capsys):
    """A transport that shares another's options names the job's key it reads
    (``peer-multicast``: ``dist.multicast.*``)."""
    assert main(["transports"]) == 0
    out = capsys.readouterr().out
    blocks = re.split(r"\n(?=\S)", out.strip())
    listed = {b.split()[0]: b for b in blocks}
    assert {
        "chain",
        "multicast",
        "tree",
        "unicast",
        "p2p",
        "peer-unicast",
        "peer-multicast",
    } == set(listed)
    assert "dist.multicast.rate (required)" in listed["peer-multicast"]
    assert "dist.peer-multicast" not in out


def test_the_version_is_the_packages(capsys):
    from coded_shuffle import __version__

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"coded-shuffle {__version__}"


def help_examples(command: str) -> list[str]:
    """The commands under ``examples:`` of ``coded-shuffle COMMAND --help``."""
    text = main_help(command)
    block = text.split("examples:\n", 1)[1].split("\n\n", 1)[0] if "examples:" in text else ""
    return [ln.strip() for ln in block.splitlines() if ln.strip()]


def main_help(command: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "coded_shuffle", command, "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.slow
def test_every_help_example_runs_as_written(tmp_path):
    """Every ``examples:`` line of every subcommand's ``--help`` (smaller where it is a size:
    ``data.points``); the folder of images is ``tests/test_images.py``'s, which runs the third
    ``pack`` example as written."""
    from coded_shuffle.tools.cli import PACK_PHOTOS

    found = {c: help_examples(c) for c in ("evaluate", "predict", "cluster", "pack")}
    assert found["pack"][2] == PACK_PHOTOS and len(found["pack"]) == 3
    for line in found["pack"][:2]:
        argv = [re.sub(r"^data\.points=\d+$", "data.points=2000", w) for w in line.split()]
        out = subprocess.run(
            [sys.executable, "-m", "coded_shuffle", *argv[1:]],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0 and out.stdout.startswith("packed runs/"), out.stderr
    assert not any(found[c] for c in ("evaluate", "predict", "cluster"))
