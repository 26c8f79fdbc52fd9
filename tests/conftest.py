"""Test tiers: every test that starts processes (``distributed``) is ``slow`` too, so that
``pytest -m "not slow"`` runs every module's logic in a couple of minutes (README:
Development); how pytest-xdist's two workers share the tests; ``--cpu-report FILE``: the CPU
seconds of every test (docs/testing.md, "Where the time goes"); the packages' bytecode written
once before any test."""

from __future__ import annotations

import compileall
import json
import os
import resource
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from coded_shuffle.distributed.transports.multicast.batches import enable_gro
from coded_shuffle.tools.records import METRICS, read_metrics
from tests.helpers import EXCESS, JOB, SCHEMES, TRANSPORTS, run_job


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-report",
        metavar="FILE",
        help="append every test's wall and CPU seconds (its worker's and the child processes "
        "it waited for) to FILE, one JSON line each (scripts/suite_cpu.py sums them)",
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    """The packages' bytecode, written once (by the controller, not each xdist worker): where
    the environment forbids writing it on import (``PYTHONDONTWRITEBYTECODE``), every process a
    test starts would compile the modules it imports again (0.1 s of CPU for the job's)."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        return
    root = Path(__file__).resolve().parent.parent
    for package in ("coded_shuffle", "coded_shuffle_train"):
        compileall.compile_dir(root / package, quiet=1)


def cpu_seconds() -> tuple[float, float]:
    """This process's CPU seconds and those of the children it waited for (theirs include
    the children they waited for in turn: a job's ranks, reaped by its fork server)."""
    own, children = (
        resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    report = item.config.getoption("--cpu-report")
    if report is None:
        yield
        return
    (own, children), start = cpu_seconds(), time.perf_counter()
    yield  # setup (a session fixture's too, in its first user), call and teardown
    (own_after, children_after), wall = cpu_seconds(), time.perf_counter() - start
    line = {"test": item.nodeid, "wall": wall, "own": own_after - own}
    line["children"] = children_after - children
    with open(report, "a") as out:
        out.write(json.dumps(line) + "\n")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("distributed") is not None:
            item.add_marker(pytest.mark.slow)


# the files whose tests run one after another on one pytest-xdist worker, by unit: the
# emulated clusters' (each counts the namespaces that exist; two clusters at once would share
# the cores their links' rates are measured on) and the users of the session's ``runs``
# (a worker runs a session fixture once: one worker, one set of runs)
TOGETHER = {
    "tests/test_cluster.py": "clusters",
    "tests/test_train_runs.py": "runs",
    "tests/test_train_restarts.py": "runs",
}


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Two tests at a time (``-n 2``, pyproject.toml), each sent to whichever worker is free,
    but for the units of :data:`TOGETHER`, sent first (the largest). Another ``--dist`` is
    pytest-xdist's own."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class TogetherApart(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return TOGETHER.get(nodeid.split("::", 1)[0], nodeid)

    return TogetherApart(config, log)


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Sweeps over the SCHEMES (on the default chain), over the other TCP transports
    (uncoded, as unicast and p2p require) and chain on the gloo data plane (unicast's gloo
    plane: test_transports.py), and over the excess-storage schemes; same seed."""
    root = tmp_path_factory.mktemp("train")
    found = {}
    (storage,) = {t for _, t in EXCESS}
    for name, sweep in (
        ("schemes", ["-m", f"scheme={','.join(SCHEMES)}"]),
        (
            "transports",
            [
                "-m",
                "scheme=uncoded",
                f"dist.transport={','.join(TRANSPORTS)},chain",
                "dist.chain.plane=gloo",
            ],
        ),
        ("excess", ["-m", f"scheme={','.join(n for n, _ in EXCESS)}", f"storage={storage}"]),
        (  # the workers sending their own coded symbols
            "peers",
            ["-m", "scheme=decentralized", f"storage={storage}", "dist.transport=peer-unicast"],
        ),
        ("blocking", ["-m", "scheme=cycles", "dist.prefetch=false"]),  # the others prefetch
    ):
        out = run_job([*sweep, *JOB, f"hydra.sweep.dir={root / name}"], root)
        assert out.returncode == 0, out.stderr[-3000:]
        for metrics in (root / name).rglob(METRICS):
            first = read_metrics(metrics.parent)[0]
            key = {
                "schemes": first["scheme"],
                "transports": f"uncoded/{first['transport']}",
                "excess": f"{first['scheme']} T={storage}",
                "peers": f"{first['scheme']}/{first['transport']} T={storage}",
                "blocking": f"{first['scheme']}/blocking",
            }[name]
            key += "/gloo" if key == "uncoded/chain" else ""
            found[key] = metrics.parent
    return found


@pytest.fixture
def udp_pair() -> Iterator[Callable[[bool], tuple[socket.socket, socket.socket]]]:
    """Makes ``(rx, tx)``: a UDP receiver on 127.0.0.1 (4 MiB buffer, reads time out after
    2 s, coalescing where asked) and a sender connected to it; all closed after the test."""
    made: list[socket.socket] = []

    def make(gro: bool) -> tuple[socket.socket, socket.socket]:
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        made.extend((rx, tx))
        rx.bind(("127.0.0.1", 0))
        rx.settimeout(2.0)
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        if gro:
            enable_gro(rx)
        tx.connect(rx.getsockname())
        return rx, tx

    yield make
    for sock in made:
        sock.close()
