"""``pytest --cpu-report FILE`` (tests/conftest.py) and ``scripts/suite_cpu.py``: where the
suite's CPU goes (docs/testing.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SPIN = """
import time
t = time.process_time()
while time.process_time() - t < 0.3:
    pass
"""
TESTS = """
import subprocess, sys

def test_spins_a_child():
    subprocess.run([sys.executable, "{spin}"], check=True)

def test_does_nothing():
    pass
"""


def test_a_cpu_report_has_a_line_per_test_that_the_script_sums_by_file(tmp_path):
    """Two tests run with ``--cpu-report``: a line each with its CPU (a test that spins a child
    process for 0.3 s of CPU counts it among its children's), summed by the script."""
    (tmp_path / "spin.py").write_text(textwrap.dedent(SPIN))
    (tmp_path / "test_two.py").write_text(textwrap.dedent(TESTS).format(spin=tmp_path / "spin.py"))
    report = tmp_path / "cpu.jsonl"
    pytest = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:randomly"]
    here = ["-p", "no:cacheprovider", "-p", "tests.conftest", f"--rootdir={tmp_path}"]
    cpu = ["--cpu-report", str(report), str(tmp_path / "test_two.py")]
    out = subprocess.run([*pytest, *here, *cpu], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    names = [line["test"].split("::")[1] for line in lines]
    assert names == ["test_spins_a_child", "test_does_nothing"]
    assert lines[0]["children"] >= 0.3 > lines[1]["children"]
    script = [sys.executable, str(REPO / "scripts" / "suite_cpu.py"), str(report)]
    table = subprocess.run(script, capture_output=True, text=True)
    assert table.returncode == 0, table.stderr
    assert table.stdout.startswith("2 tests, ")
    row = next(r for r in table.stdout.splitlines() if r.startswith("| `test_two.py` |"))
    assert row.split("|")[2].strip() == "2"
