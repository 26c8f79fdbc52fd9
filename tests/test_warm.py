"""``coded_shuffle.tools.warm``: commands forked from one warm interpreter run as their console
script or ``python -m`` would (folder, environment, argv, output, exit code, the interpreter's
own exit), and what it cannot run is refused in one line."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from coded_shuffle.tools.warm import WarmStarter, target_of

PROBE = """
import atexit, json, os, sys, tempfile
if sys.argv[1:2] == ["--raise"]:
    raise RuntimeError("probe failed on purpose")
if sys.argv[1:2] == ["--sleep"]:
    import time
    time.sleep(60)
atexit.register(lambda: print("atexit ran", flush=True))
print(json.dumps({
    "argv": sys.argv[1:], "cwd": os.getcwd(), "probe": os.environ.get("PROBE"),
    "tmp": tempfile.gettempdir(), "stdin": sys.stdin.read(), "path0": sys.path[0],
}))
print("to stderr", file=sys.stderr)
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""


@pytest.fixture(scope="module")
def starter():
    warm = WarmStarter(["json", "tempfile"])
    yield warm
    warm.close()


@pytest.fixture
def probe(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """``python -m warm_probe`` and an environment that finds it."""
    (tmp_path / "warm_probe.py").write_text(textwrap.dedent(PROBE))
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TMPDIR": str(tmp_path / "tmp")}
    return [sys.executable, "-m", "warm_probe"], env


def test_a_module_runs_in_its_folder_environment_and_argv_with_its_exit(starter, probe, tmp_path):
    import json

    command, env = probe
    work = tmp_path / "work"
    work.mkdir()
    out = starter.run([*command, "a", "b"], work, {**env, "PROBE": "x"}, timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    seen = json.loads(lines[0])
    assert seen["argv"] == ["a", "b"] and seen["cwd"] == str(work) and seen["probe"] == "x"
    assert seen["tmp"] == str(tmp_path / "tmp") and seen["stdin"] == ""
    assert seen["path0"] == str(work)
    assert lines[1] == "atexit ran" and out.stderr == "to stderr\n"
    code = starter.run(command, work, {**env, "PROBE_EXIT": "3"}, timeout=30).returncode
    assert code == 3


def test_an_exception_is_exit_1_with_its_traceback(starter, probe, tmp_path):
    command, env = probe
    out = starter.run([*command, "--raise"], tmp_path, env, timeout=30)
    assert out.returncode == 1
    assert "Traceback" in out.stderr and "probe failed on purpose" in out.stderr


def test_a_timeout_kills_it_and_a_file_takes_both_outputs(starter, probe, tmp_path):
    command, env = probe
    with pytest.raises(subprocess.TimeoutExpired):
        starter.run([*command, "--sleep"], tmp_path, env, timeout=1)
    log = tmp_path / "log"
    with open(log, "w") as file:
        process = starter.popen(command, tmp_path, env, stdout=file, stderr=subprocess.STDOUT)
    assert process.wait(30) == 0 and process.communicate() == (None, None)
    assert "to stderr" in log.read_text() and "atexit ran" in log.read_text()
    process = starter.popen([*command, "--sleep"], tmp_path, env, stdout=subprocess.DEVNULL)
    process.kill()
    assert process.wait(30) == -9


def test_a_console_script_runs_as_installed(starter, tmp_path):
    script = Path(sys.executable).parent / "coded-shuffle"
    if not script.exists():
        pytest.skip("coded-shuffle is not installed beside this interpreter")
    out = starter.run([str(script), "schemes"], tmp_path, dict(os.environ), timeout=60)
    fresh = subprocess.run([str(script), "schemes"], capture_output=True, text=True, timeout=60)
    assert out.returncode == fresh.returncode == 0 and out.stdout == fresh.stdout


def test_what_it_cannot_run_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"not a warm command \(valid: "):
        target_of(["/bin/echo", "hi"])
    with pytest.raises(ValueError, match="not a warm command"):
        target_of([sys.executable, "script.py"])


def test_a_preload_that_fails_stops_the_start_in_one_line():
    with pytest.raises(RuntimeError, match="did not start: ModuleNotFoundError: No module named"):
        WarmStarter(["no_such_module_here"])


def test_a_server_that_dies_ends_what_it_had_not_reported(probe, tmp_path):
    command, env = probe
    warm = WarmStarter(["json"])
    process = warm.popen([*command, "--sleep"], tmp_path, env, stdout=subprocess.DEVNULL)
    try:
        warm.server.kill()
        assert process.wait(30) == -9
        with pytest.raises((RuntimeError, OSError)):
            warm.popen(command, tmp_path, env)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)  # its orphan, still asleep
        warm.close()
