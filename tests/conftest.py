"""Test tiers: every test that starts processes (``distributed``) is ``slow`` too, so that
``pytest -m "not slow"`` runs every module's logic in a couple of minutes (README:
Development)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coded_shuffle.tools.records import METRICS, read_metrics
from tests.helpers import EXCESS, JOB, SCHEMES, TRANSPORTS, run_job


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("distributed") is not None:
            item.add_marker(pytest.mark.slow)


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
