"""``coded-shuffle cluster``: argument errors in one line, a real emulated-cluster run (root
only: one network namespace per host), and nothing left behind on any exit path."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from subprocess import PIPE

import pytest

from coded_shuffle.costs.wire import DGRAM_HEADER_BYTES as DGRAM_HEAD
from coded_shuffle.tools import cli
from coded_shuffle.tools.cluster import netns, run
from coded_shuffle.tools.records import metrics_path, read_metrics
from coded_shuffle.tools.tempdirs import socket_base
from tests.helpers import train_command, warm_jobs
from tests.ranks import is_root

ROOT_ONLY = pytest.mark.skipif(not is_root(), reason="network namespaces need root")
SMALL = ["epochs=3", "model.hidden=16", "seed=3", "dist.timeout_seconds=60"]
# six epochs; faults fire once epoch 2 is recorded (``HOST@e2``), so always mid-run whatever
# the start-up takes (a fixed 27 s once came after the last epoch of a fast run)
LONG = [
    "epochs=5",
    "model.hidden=16",
    "seed=3",
    "dist.timeout_seconds=15",
    "debug.step_delay=0.02",
]


def our_namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {
        line.split()[0] for line in out.splitlines() if re.match(r"cs[0-9a-f]{6}(br|h\d+)", line)
    }


def command() -> list[str]:
    exe = shutil.which("coded-shuffle")
    return [exe] if exe else [sys.executable, "-m", "coded_shuffle"]


def run_cluster(
    args: list[str], cwd: Path, timeout: float = 200, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """The cluster command (``env``: added to this process's environment); still running after
    ``timeout`` (inside pytest-timeout's 240 s), it is interrupted (it removes its cluster on
    SIGINT, so the next test finds none of it) and the test fails with its output and the tail
    of every host's log under ``cwd``."""
    argv = [*command(), "cluster", *args]
    env = {**os.environ, **(env or {})}
    proc = subprocess.Popen(argv, cwd=cwd, stdout=PIPE, stderr=PIPE, text=True, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        logs = "".join(
            f"--- {log}\n{log.read_text(errors='replace')[-1500:]}\n"
            for log in sorted(cwd.rglob("h[0-9]*.log"))
        )
        pytest.fail(f"the cluster ran past {timeout} s:\n{err[-2000:]}\n{out[-1000:]}\n{logs}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hosts", "3", "--rate", "fast", "--", "epochs=2"], "--rate 'fast' cannot be parsed"),
        (["--hosts", "1", "--rate", "1gbit"], "--hosts 1 out of range 2..250"),
        (["--rate", "1gbit"], "cluster needs --hosts P and --rate RATE"),
        (
            ["--hosts", "3", "--rate", "1gbit", "--", "workers=5"],
            "workers=5 does not fit --hosts 3",
        ),
        (["--hosts", "3", "--rate", "1gbit", "--master-rate", "x"], "--master-rate 'x' cannot"),
        (["--hosts", "3", "--rate", "1gbit", "--kill", "2"], "expected HOST@SECONDS or HOST@e"),
        (["--hosts", "3", "--rate", "1gbit", "--kill", "3@e2"], "host 3 out of range 0..2"),
        (["--hosts", "3", "--rate", "1gbit", "--cut", "1@e0"], "epoch 0 out of range: >= 1"),
        (["--hosts", "3", "--rate", "1gbit", "--lose", "2@e2"], "needs an elastic cluster"),
        (
            ["--hosts", "3", "--rate", "1gbit", "--min-hosts", "2", "--lose", "0@e2"],
            "host 0 holds the rendezvous and the master",
        ),
        (["--hosts", "3", "--rate", "1gbit", "--min-hosts", "1"], "--min-hosts 1 out of range"),
        (["--hosts", "3", "--rate", "1gbit", "--corrupt", "0@e2"], "host 0 is the master"),
        (["--hosts", "3", "--rate", "1gbit", "--stop", "2@e2+x"], "expected HOST@SECONDS or"),
        (
            ["--hosts", "3", "--rate", "1gbit", "--script", "/no/such.py"],
            "--script '/no/such.py' is not a file",
        ),
        (["--hosts", "3", "--rate", "1gbit", "--host-procs", "3=2"], "host out of range 0..2"),
        (["--hosts", "3", "--rate", "1gbit", "--host-procs", "1=0"], "processes out of range"),
        (["--hosts", "3", "--rate", "1gbit", "--host-rate", "1"], "expected HOST=RATE"),
        (["--hosts", "3", "--rate", "1gbit", "--host-rate", "1=x"], "--host-rate 'x' cannot"),
        (["--hosts", "3", "--rate", "1gbit", "--host-loss", "1=1"], "share out of range [0, 1)"),
        (["--hosts", "3", "--rate", "1gbit", "--host-loss", "1=x"], "'x' is not a number"),
        (
            ["--hosts", "3", "--rate", "1gbit", "--host-procs", "0=2", "--", "workers=2"],
            "workers=2 does not fit --hosts 3: the cluster runs workers = processes - 1 = 3",
        ),
    ],
)
def test_bad_arguments_are_one_line(args, message, capsys):
    before = our_namespaces() if is_root() else set()
    assert cli.main(["cluster", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    if is_root():
        assert our_namespaces() == before


def test_without_root_it_says_so_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    assert cli.main(["cluster", "--hosts", "3", "--rate", "1gbit", "--", "epochs=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "coded-shuffle: error: the emulated cluster needs root (network namespaces, "
        "veth pairs, tc); run as root"
    ]


def test_an_epoch_fault_fires_once_the_job_recorded_or_the_script_printed_that_epoch(tmp_path):
    fault = run.Fault.parse("kill", "2@e2", 3)
    fault.metrics = metrics_path(tmp_path)
    assert (fault.at, fault.after_epoch) == (None, 2)
    assert not fault.due(1e9)  # no file yet
    fault.metrics.write_text('{"epoch": 1}\n')
    assert not fault.due(1e9)
    fault.metrics.write_text('{"epoch": 1}\n{"epoch": 2}\n')
    assert fault.due(0.0)
    timed = run.Fault.parse("cut", "1@2.5", 3)
    assert not timed.due(2.4) and timed.due(2.5)
    script = run.Fault.parse("cut", "2@e2", 3)  # a --script: its "epoch" lines on host 0
    script.console = tmp_path / "h0.log"
    assert not script.due(1e9)
    script.console.write_text("start\nepoch 1: 100 bytes\nan epoch line that is not one\n")
    assert not script.due(1e9)
    script.console.write_text("epoch 1: 100 bytes\nepoch   2/10 cycles over chain\n")
    assert script.due(0.0)


def test_a_fault_a_delay_after_an_epoch_fires_inside_the_next(tmp_path):
    """``2@e2+0.5``: half a second after the job recorded epoch 2 (seen at 10.0 here)."""
    from coded_shuffle.tools.cluster.faults import Fault

    fault = Fault.parse("kill", "2@e2+0.5", 3)
    assert (fault.at, fault.after_epoch, fault.delay) == (None, 2, 0.5)
    fault.metrics = metrics_path(tmp_path)
    fault.metrics.write_text('{"epoch": 1}\n{"epoch": 2}\n')
    assert not fault.due(10.0) and not fault.due(10.4) and fault.due(10.5)


def test_a_host_that_outlives_the_jobs_clean_end_is_killed_naming_it(monkeypatch, capsys):
    """Once a host ended with exit 0, a host still running ``ENDED_GRACE`` later is killed
    (the run then fails naming it) instead of the run waiting for it for ever."""
    from coded_shuffle.tools.cluster.faults import Faults

    monkeypatch.setattr(run, "ENDED_GRACE", 0.3)
    procs = [
        subprocess.Popen([sys.executable, "-c", code])
        for code in ("pass", "import time; time.sleep(60)")
    ]
    results = [run.HostResult(i, None, Path(f"h{i}.log")) for i in range(2)]
    t0 = time.monotonic()
    run._wait(procs, results, 30.0, Faults(None, [], None, None))
    assert time.monotonic() - t0 < 10
    assert [r.code for r in results] == [0, -signal.SIGKILL]
    err = capsys.readouterr().err
    assert err == "coded-shuffle cluster: host 1 still running 0.3 s after the job ended: killed\n"


def test_a_corrupted_store_has_one_byte_of_its_newest_file_flipped(tmp_path):
    from coded_shuffle.tools.cluster.faults import corrupt_store

    folder = tmp_path / "stores" / "worker-1"
    folder.mkdir(parents=True)
    files = [folder / f"e{e}-part0.npy" for e in (2, 10, 9)]
    for f in files:
        f.write_bytes(bytes(range(10)))
    assert corrupt_store(tmp_path / "stores", 1) == files[1]  # epoch 10, not "e9" > "e10"
    assert files[1].read_bytes() == bytes([*range(9), 9 ^ 0xFF])
    assert all(f.read_bytes() == bytes(range(10)) for f in (files[0], files[2]))
    assert corrupt_store(tmp_path / "stores", 0) is None  # no store yet


@ROOT_ONLY
@pytest.mark.slow
def test_a_bad_training_config_stops_before_any_host_exists(tmp_path):
    before = our_namespaces()
    out = run_cluster(["--hosts", "3", "--rate", "1gbit", "--", "dist.transport=p2p"], tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "coded-shuffle: error: dist.transport=p2p carries uncoded deliveries only (each row to "
        "one worker); scheme=cycles is coded: use scheme=uncoded, or dist.transport=chain, "
        "multicast or tree"
    ]
    assert our_namespaces() == before


@ROOT_ONLY
def test_stale_clusters_of_dead_owners_are_swept(tmp_path):
    name = f"cs{os.urandom(3).hex()}h0"
    subprocess.run(["ip", "netns", "add", name], check=True)
    netns.STATE_DIR.mkdir(parents=True, exist_ok=True)
    state = netns.STATE_DIR / f"{name[2:8]}.json"
    dead = subprocess.Popen(["true"])
    dead.wait()
    state.write_text(json.dumps({"pid": dead.pid, "namespaces": [name]}))
    assert cli.main(["cluster", "--cleanup"]) == 0
    assert name not in our_namespaces() and not state.exists()


@ROOT_ONLY
@pytest.mark.distributed
def test_a_cluster_run_survives_a_killed_host_verifies_every_epoch_and_leaves_nothing(tmp_path):
    """K = 2 on 3 hosts sharing one medium, multicast with 10% of the datagrams lost at every
    receiver; host 2 is killed mid-run and started again: the job restarts once (resuming
    from its checkpoint with every store intact, nothing re-placed, when one was written
    before the kill) and ends with the parameters of an unbroken run. The medium carried
    every byte the hosts counted, and each multicast frame once. Neither command leaves a
    temporary file (torch's logs of each attempt, the killed rank's error file) behind."""
    before = our_namespaces()
    run_dir, local = tmp_path / "run", tmp_path / "local"
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    unbroken = warm_jobs().popen(  # the same job, on one machine, meanwhile (it mostly sleeps)
        [
            *train_command(),
            "scheme=uncoded",
            "workers=2",
            *LONG,
            "epochs=4",
            f"hydra.run.dir={local}",
        ],
        tmp_path,
        {**os.environ, "TMPDIR": str(temporary)},
        stdout=subprocess.DEVNULL,
    )
    args = [
        "--hosts",
        "3",
        "--rate",
        "400mbit",
        "--medium",
        "shared",
        "--grace",
        "10",
        "--kill",
        "2@e2",
        "--",
        "scheme=cycles",
        "dist.transport=multicast",
        "dist.multicast.drop=0.1",
        "dist.multicast.parity_window=0",  # the losses go to repair rounds, counted below
        *LONG,
        "epochs=4",
        "dist.max_restarts=1",
        # the restarted host starts torchrun and its rank afresh (torch imported twice) while
        # the others wait in the rendezvous: 15 s timed out there on a busy 2-core machine
        "dist.timeout_seconds=40",
        f"hydra.run.dir={run_dir}",
    ]
    try:
        out = run_cluster(args, tmp_path, env={"TMPDIR": str(temporary)})
        _, err = unbroken.communicate(timeout=180)
    finally:
        unbroken.kill()  # nothing when it has ended
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-3000:]
    assert unbroken.returncode == 0, err[-2000:]
    left = sorted(p.name for p in temporary.iterdir() if not p.name.startswith("torchinductor_"))
    assert left == []  # torchinductor_<user>: torch's cache, kept on purpose
    assert "cycles over multicast" in out.stdout  # host 0's console lines came through
    killed = r"coded-shuffle cluster: kill host 2 at [\d.]+ s \(after epoch 2\)"
    assert re.search(killed, out.stderr), out.stderr[-2000:]
    rows = read_metrics(run_dir)
    assert [r["epoch"] for r in rows] == list(range(1, 5))
    assert rows[-1]["attempt"] == 1  # the launcher restarted every process once
    resumed = [r for r in rows if "resumed_after_epoch" in r]
    assert len(resumed) <= 1 and all(r["attempt"] == 1 for r in resumed)
    assert all(r["replaced_workers"] == [] and r["replacement_bytes"] == 0 for r in resumed)
    assert all(r["verified"] and r["transport"] == "multicast" for r in rows)
    assert all(r["workers"] == 2 for r in rows)
    assert sum(r["repair_bytes"] for r in rows) > 0  # losses happened and were repaired
    for r in rows:  # master: the stream once, 20 bytes per datagram, repairs, parity, feedback
        if r["phase"] == "placement":  # each point to its one worker, by TCP
            assert r["placement_transport"] == "unicast" and r["repair_bytes"] == 0
            assert r["master_egress_bytes"] == r["broadcast_bytes"], r
            continue
        datagrams = -(-r["broadcast_bytes"] // 1452)  # MTU 1500: one frame each by default
        assert r["transport_settings"]["datagram_bytes"] == 1452
        model = (
            r["broadcast_bytes"] + DGRAM_HEAD * datagrams + r["repair_bytes"] + r["parity_bytes"]
        )
        feedback = r["master_egress_bytes"] - model
        assert 0 <= feedback < 0.01 * r["broadcast_bytes"], r
    record = json.loads((run_dir / "cluster.json").read_text())
    assert [h["exit_code"] for h in record["hosts"]] == [0, 0, 0]
    # the hosts' scratch folder (their fork servers' sockets inside: under a short base, as
    # this TMPDIR is too deep for a socket's path) is gone, the killed host's files with it
    for base in (temporary, Path(socket_base(100, str(temporary)))):
        assert not list(base.glob(f"coded-shuffle-{record['run_id']}-*")), base
    cpu = record["machine_cpu"]  # the machine was busy running the hosts' processes
    assert 0 < cpu["busy_share"] <= 1 and cpu["cores"] >= 1
    parts = cpu["user_share"] + cpu["system_share"] + cpu["softirq_share"]
    assert parts <= cpu["busy_share"] + 1e-9
    assert record["faults"][0]["kind"] == "kill" and record["faults"][0]["restarted"] is True
    counted = sum(r["master_egress_bytes"] for r in rows)
    assert record["hosts"][0]["nic_tx_bytes"] >= counted  # the NIC saw at least what we counted
    medium = record["medium"]
    assert medium["kind"] == "shared" and medium["rate_bits"] == 400_000_000
    assert medium["bytes"] >= sum(r["network_bytes"] for r in rows)  # every host's egress
    received = sum(h["nic_rx_bytes"] for h in record["hosts"])  # a multicast frame: twice
    assert received - medium["bytes"] > 0.5 * counted  # ... but once on the medium
    assert (run_dir / "hosts" / "h2.log").is_file()
    assert our_namespaces() == before
    assert not list(netns.STATE_DIR.glob(f"{record['run_id']}.json"))
    ours = json.loads((run_dir / "summary.json").read_text())["final_params_sha256"]
    theirs = json.loads((local / "summary.json").read_text())["final_params_sha256"]
    assert ours == theirs  # multicast on the cluster = chain on one machine, bit for bit


@ROOT_ONLY
@pytest.mark.distributed
def test_workers_multicast_their_own_coded_symbols_on_a_shared_medium(tmp_path):
    """``peer-multicast``, K = 3 on 4 hosts sharing one medium, the master behind a slower
    link, 10% of the datagrams lost at every receiver: the master multicasts the placement
    once and then sends only feedback; every worker multicasts its own symbols, repaired from
    its receivers' reports; every epoch verified, and the parameters of the same job on one
    machine over chain."""
    before = our_namespaces()
    run_dir, local = tmp_path / "run", tmp_path / "local"
    job = ["scheme=decentralized", "storage=2", *SMALL]
    unbroken = warm_jobs().popen(
        [*train_command(), *job, "workers=3", f"hydra.run.dir={local}"],
        tmp_path,
        dict(os.environ),
        stdout=subprocess.DEVNULL,
    )
    args = [
        "--hosts",
        "4",
        "--rate",
        "200mbit",
        "--master-rate",
        "50mbit",
        "--medium",
        "shared",
        "--",
        *job,
        "dist.transport=peer-multicast",
        "dist.multicast.drop=0.1",
        "dist.multicast.parity_window=0",  # the losses go to repair rounds, counted below
        f"hydra.run.dir={run_dir}",
    ]
    try:
        out = run_cluster(args, tmp_path)
        _, err = unbroken.communicate(timeout=180)
    finally:
        unbroken.kill()
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-3000:]
    assert unbroken.returncode == 0, err[-2000:]
    rows = read_metrics(run_dir)
    assert all(r["verified"] and r["transport"] == "peer-multicast" for r in rows)
    placement, *coded = rows
    assert placement["placement_transport"] == "peer-multicast"  # one stream from the master
    assert placement["master_egress_bytes"] >= placement["broadcast_bytes"]
    assert placement["transport_settings"]["rate_bits"] == 49_500_000  # the master's pace
    for r in coded:
        egress = r["host_egress_bytes"]
        assert egress[0] < 0.05 * r["broadcast_bytes"]  # the master: feedback only
        assert sum(egress[1:]) >= r["broadcast_bytes"]  # every symbol multicast once
        assert all(e > 0 for e in egress[1:])
    assert sum(r["repair_bytes"] for r in coded) > 0  # the workers repaired what was lost
    ours = json.loads((run_dir / "summary.json").read_text())["final_params_sha256"]
    theirs = json.loads((local / "summary.json").read_text())["final_params_sha256"]
    assert ours == theirs
    assert our_namespaces() == before


@ROOT_ONLY
@pytest.mark.distributed
def test_a_storage_host_beside_training_hosts_runs_the_job_and_an_own_loop(tmp_path):
    """One storage host with one process (the master, rank 4: the last node's) beside two
    training hosts with two workers each (K = 4): the job and the own-loop example (its
    loader's workers forked and kept) verify every epoch; each host ran its processes."""
    before = our_namespaces()
    run_dir, logs = tmp_path / "run", tmp_path / "loop"
    layout = ["--hosts", "3", "--rate", "1gbit", "--host-procs", "0=2", "--host-procs", "1=2"]
    job = [*layout, "--", *SMALL, "epochs=2", "dist.master_rank=4", f"hydra.run.dir={run_dir}"]
    out = run_cluster(job, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-3000:]
    rows = read_metrics(run_dir)
    assert len(rows) == 2 and all(r["verified"] and r["workers"] == 4 for r in rows)
    record = json.loads((run_dir / "cluster.json").read_text())
    assert [h["processes"] for h in record["hosts"]] == [2, 2, 1]
    assert record["hosts"][2]["nic_tx_bytes"] > rows[0]["broadcast_bytes"]  # it sent the set
    script = Path(__file__).resolve().parent.parent / "examples" / "own_loop.py"
    loop = [*layout, "--logs", str(logs), "--script", str(script), "--"]
    loop += ["--master-rank", "4", "--epochs", "2", "--points", "1200", "--num-workers", "2"]
    out = run_cluster(loop, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    master = (logs / "h2.log").read_text()
    epochs = [ln for ln in master.splitlines() if ln.startswith("epoch ")]
    assert len(epochs) == 2 and all(ln.endswith("verified True") for ln in epochs), master
    assert re.search(r"final parameters sha256 [0-9a-f]{64}", (logs / "h0.log").read_text())
    assert our_namespaces() == before


@ROOT_ONLY
@pytest.mark.distributed
def test_an_elastic_cluster_goes_on_without_a_host_lost_for_good(tmp_path):
    """``torchrun --nnodes 2:3`` on three hosts (two workers; docs/training.md has the
    same with four hosts); host 2 is lost for good once epoch 2 is recorded: the agents start
    the job again on the two hosts that are left, and it goes on from its checkpoint with one
    worker (the survivor's store reused: the placement after the change sends less than a
    fresh one), every epoch verified."""
    before = our_namespaces()
    run_dir = tmp_path / "run"
    args = [
        "--hosts",
        "3",
        "--rate",
        "1gbit",
        "--min-hosts",
        "2",
        "--grace",
        "10",
        "--lose",
        "2@e2",
        "--",
        *LONG,
        "epochs=4",
        "dist.timeout_seconds=6",
        "dist.heartbeat_seconds=0.5",
        "dist.max_restarts=1",
        f"hydra.run.dir={run_dir}",
    ]
    out = run_cluster(args, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-3000:]
    assert re.search(
        r"coded-shuffle cluster: lose host 2 at [\d.]+ s \(after epoch 2\)", out.stderr
    ), out.stderr[-2000:]
    assert "dist.elastic: 2 processes: workers=1 (the config said 2)" in out.stdout
    rows = read_metrics(run_dir)
    assert [r["epoch"] for r in rows] == list(range(1, 5))
    assert all(r["verified"] for r in rows)
    workers = [r["workers"] for r in rows]
    at = workers.index(1)  # the first epoch after the loss
    assert at >= 2 and workers == [2] * at + [1] * (4 - at), workers
    resized = rows[at]
    assert (resized["workers_before"], resized["workers_after"]) == (2, 1)
    assert resized["phase"] == "placement" and resized["reused_points"] > 0
    assert 0 < resized["resize_bytes"] < resized["fresh_placement_bytes"]
    record = json.loads((run_dir / "cluster.json").read_text())
    assert record["min_hosts"] == 2 and record["faults"][0]["kind"] == "lose"
    assert [h["lost"] for h in record["hosts"]] == [False, False, True]
    assert [h["exit_code"] for h in record["hosts"][:2]] == [0, 0]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["workers"] == 1 and summary["all_verified"] and summary["restarts"] == 1
    assert our_namespaces() == before


@ROOT_ONLY
@pytest.mark.distributed
def test_a_cut_host_fails_every_process_within_the_bound_naming_it(tmp_path):
    """Host 2's link goes down mid-run (its processes alive): every host exits within
    dist.timeout_seconds and a margin, the error names rank 2 and its address."""
    before = our_namespaces()
    args = [
        "--hosts",
        "3",
        "--rate",
        "1gbit",
        "--grace",
        "5",
        "--cut",
        "2@e2",
        "--",
        *LONG,
        "dist.timeout_seconds=6",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    t0 = time.monotonic()
    out = run_cluster(args, tmp_path)
    elapsed = time.monotonic() - t0
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert re.match(r"coded-shuffle cluster: error: host \d failed \(exit code \d+\)", last), last
    assert re.search(r"rank 2 \(worker 1\) on 10\.77\.0\.3", last), last
    record = json.loads((tmp_path / "run" / "cluster.json").read_text())
    cut_at = record["faults"][0]["done_at"]
    assert record["faults"][0]["after_epoch"] == 2 and cut_at is not None
    assert elapsed - cut_at < 15 + 6 + 20, elapsed  # timeout, grace, exit and a margin
    assert record["faults"][0]["kind"] == "cut"
    assert record["hosts"][2]["exit_code"] == 1  # the cut host ended itself
    assert all(h["exit_code"] for h in record["hosts"])  # nothing of the job left running
    # every process gone within dist.timeout_seconds, the cluster's grace and a margin
    assert record["wall_seconds"] - cut_at < 6 + 5 + 10
    cut_off = (tmp_path / "run" / "hosts" / "h2.log").read_text()
    assert "rank 2 (worker 1): lost contact with the job: its store at 10.77.0.1" in cut_off
    assert our_namespaces() == before


@ROOT_ONLY
@pytest.mark.distributed
def test_an_own_loop_with_a_cut_host_ends_on_every_host_naming_it(tmp_path):
    """``examples/own_loop.py`` on 3 hosts (no training job, no checkpoint): host 2's link
    goes down mid-run. Every host ends through the library's watchdog within ``--timeout``
    and a few seconds (the cluster's own grace, 60 s, is far longer), each naming rank 2 and
    its address, or, on the cut host, the store it lost."""
    before = our_namespaces()
    logs = tmp_path / "logs"
    script = Path(__file__).resolve().parent.parent / "examples" / "own_loop.py"
    args = [
        "--hosts",
        "3",
        "--rate",
        "1gbit",
        "--grace",
        "60",
        "--cut",
        "2@e3",
        "--logs",
        str(logs),
        "--script",
        str(script),
        "--",
        "--epochs",
        "2000",
        "--points",
        "2000",
        "--timeout",
        "6",
    ]
    out = run_cluster(args, tmp_path)
    assert out.returncode == 1, out.stderr[-2000:]
    record = json.loads((logs / "cluster.json").read_text())
    cut_at = record["faults"][0]["done_at"]
    assert cut_at is not None and record["faults"][0]["kind"] == "cut"
    assert record["faults"][0]["after_epoch"] == 3  # once host 0 printed "epoch 3"
    assert all(h["exit_code"] for h in record["hosts"])  # every host ended, none finished
    assert record["wall_seconds"] - cut_at < 6 + 12, record  # timeout, heartbeats, exit
    # where it was (its stage published when it changed, not at its next heartbeat), on every
    # surviving host (each lingers two heartbeats before it exits, so the others print too)
    lost = r"rank 2 \(worker 1\) on 10\.77\.0\.3 at 'epoch \d+ [a-z]+' lost: no heartbeat"
    for host in (0, 1):
        assert re.search(lost, (logs / f"h{host}.log").read_text()), host
    cut_off = (logs / "h2.log").read_text()
    assert "rank 2 (worker 1): lost contact with the job: its store at 10.77.0.1" in cut_off
    assert our_namespaces() == before


@ROOT_ONLY
@pytest.mark.slow
def test_an_interrupted_cluster_leaves_nothing(tmp_path):
    before = our_namespaces()
    proc = subprocess.Popen(
        [
            *command(),
            "cluster",
            "--hosts",
            "3",
            "--rate",
            "1gbit",
            "--",
            *SMALL,
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(our_namespaces() - before) < 4:
        time.sleep(0.2)
    assert len(our_namespaces() - before) == 4  # the bridge and three hosts exist
    time.sleep(1.0)  # the hosts' processes are starting inside them
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    state = (signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, []))
    assert proc.returncode == 130, (err, state)
    assert err.strip().splitlines()[-1] == "coded-shuffle: interrupted"
    assert our_namespaces() == before


def test_machine_cpu_use_reads_proc_stat_shares(tmp_path):
    """Busy share = everything but idle and iowait; softirq and irq counted as network work."""
    from coded_shuffle.tools.cluster.record import machine_cpu_ticks, machine_cpu_use

    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 10 5 15 0 0 0\ncpu0 1 2 3 4\n")
    before = machine_cpu_ticks(stat)
    stat.write_text("cpu  160 20 70 900 30 5 35 0 7 0\ncpu0 1 2 3 4\n")
    use = machine_cpu_use(before, machine_cpu_ticks(stat))
    # deltas: user 60 nice 20 system 20 idle 100 iowait 20 irq 0 softirq 20 (guest inside user)
    assert use["busy_share"] == pytest.approx(120 / 240)
    assert use["user_share"] == pytest.approx(80 / 240)
    assert use["softirq_share"] == pytest.approx(20 / 240)
    assert machine_cpu_use({}, before) == {} and machine_cpu_ticks(tmp_path / "none") == {}


FLOW = """
import socket, sys, time
role, port = sys.argv[1], int(sys.argv[2])
if role == "recv":
    s = socket.create_server(("0.0.0.0", port))
    print("ready", flush=True)
    c, _ = s.accept()
    while c.recv(1 << 16):
        pass
else:
    c = socket.create_connection((sys.argv[3], port))
    t0 = time.perf_counter()
    c.sendall(bytes(int(sys.argv[4])))
    c.shutdown(socket.SHUT_WR)
    c.recv(1)
    print(time.perf_counter() - t0, flush=True)
"""


def _flows(cluster: netns.Cluster, pairs: list[tuple[int, int]], nbytes: int) -> list[float]:
    """Seconds of TCP flows ``src -> dst`` of ``nbytes`` each, all started together."""
    receivers, senders = [], []
    for i, (_, dst) in enumerate(pairs):
        argv = cluster.exec_argv(dst, [sys.executable, "-c", FLOW, "recv", str(7000 + i)])
        receivers.append(subprocess.Popen(argv, stdout=subprocess.PIPE, text=True))
    try:
        for r in receivers:
            assert r.stdout.readline().strip() == "ready"
        for i, (src, dst) in enumerate(pairs):
            argv = [sys.executable, "-c", FLOW, "send", str(7000 + i), cluster.address(dst)]
            argv.append(str(nbytes))
            senders.append(subprocess.Popen(cluster.exec_argv(src, argv), stdout=subprocess.PIPE))
        return [float(s.communicate(timeout=60)[0]) for s in senders]
    finally:
        for p in receivers + senders:
            p.kill()
            p.wait()


GROUPS = """
import socket, struct, sys, time
role, port, groups = sys.argv[1], 7100, sys.argv[2].split(",")
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if role == "join":
    s.setsockopt(socket.IPPROTO_IP, 49, 0)  # IP_MULTICAST_ALL off: the groups joined alone
    s.bind(("0.0.0.0", port))
    for g in groups:
        s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                     struct.pack("4s4si", socket.inet_aton(g), bytes(4), 0))
    print("ready", flush=True)
    time.sleep(30)
else:
    for _ in range(200):
        for g in groups:
            s.sendto(bytes(1000), (g, port))
        time.sleep(0.001)
"""


@ROOT_ONLY
@pytest.mark.distributed
def test_the_bridge_sends_each_host_only_the_multicast_groups_it_joined():
    """The cluster's bridge snoops IGMP: host 1 joins two groups, host 2 one of them; host 0
    multicasts 200 KB to each: host 1's NIC takes both, host 2's only its own (a receiver-aware
    multicast's slow worker hears only its groups)."""
    a, b = "239.255.77.1", "239.255.77.2"
    with netns.Cluster(3, 400_000_000) as cluster:
        joined = []
        try:
            for host, groups in ((1, f"{a},{b}"), (2, a)):
                argv = [sys.executable, "-c", GROUPS, "join", groups]
                joined.append(
                    subprocess.Popen(cluster.exec_argv(host, argv), stdout=subprocess.PIPE)
                )
            for p in joined:
                assert p.stdout.readline().strip() == b"ready"
            time.sleep(0.5)  # the joins' reports reach the bridge
            before = cluster.nic_counters()
            argv = [sys.executable, "-c", GROUPS, "send", f"{a},{b}"]
            subprocess.run(cluster.exec_argv(0, argv), check=True, timeout=60)
            time.sleep(0.2)
            after = cluster.nic_counters()
        finally:
            for p in joined:
                p.kill()
                p.wait()
    got = [x["rx_bytes"] - y["rx_bytes"] for x, y in zip(after, before, strict=True)]
    assert got[1] > 400_000 and 200_000 < got[2] < 0.6 * got[1], got


DATAGRAMS = """
import socket, struct, sys
role, n = sys.argv[1], 5000
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if role == "recv":
    s.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE: none lost to the buffer
    s.bind(("0.0.0.0", 7200))
    print("ready", flush=True)
    got = {struct.unpack_from("=I", s.recv(2000))[0]}  # the sender may take a while to start
    s.settimeout(1.0)  # ... then until a quiet second
    try:
        while True:
            got.add(struct.unpack_from("=I", s.recv(2000))[0])
    except TimeoutError:
        run = longest = 0
        for i in range(n):
            run = 0 if i in got else run + 1
            longest = max(longest, run)
        print(len(got), longest, flush=True)
else:  # batches of 50 datagrams of 200 bytes, each batch one send (UDP GSO), as multicast's
    for first in range(0, n, 50):
        data = b"".join(struct.pack("=I", i).ljust(200, b"\\0") for i in range(first, first + 50))
        s.sendmsg([data], [(17, 103, struct.pack("=H", 200))], 0, (sys.argv[2], 7200))
"""


@ROOT_ONLY
@pytest.mark.distributed
def test_a_host_loses_its_share_of_what_it_receives_at_random_and_counts_it():
    """``--host-loss 1=0.1``: host 1 gets about 90% of 5,000 datagrams from host 0 (their
    own order, not a burst cut off), each lost on its own though sent 50 to a system call
    (the longest run lost: a few, not a batch), and its counter says how many it lost; host
    2, without a loss, gets them all."""
    with netns.Cluster(3, 400_000_000, host_losses={1: 0.1}) as cluster:
        got = []
        for host in (1, 2):
            argv = [sys.executable, "-c", DATAGRAMS, "recv"]
            receiver = subprocess.Popen(
                cluster.exec_argv(host, argv), stdout=subprocess.PIPE, text=True
            )
            assert receiver.stdout.readline().strip() == "ready"
            send = [sys.executable, "-c", DATAGRAMS, "send", cluster.address(host)]
            subprocess.run(cluster.exec_argv(0, send), check=True, timeout=60)
            got.append(tuple(map(int, receiver.communicate(timeout=30)[0].split())))
        lost = cluster.transport_counters()[1]["loss_drops"]
    (arrived, longest), (others, _) = got
    assert 0.86 * 5000 < arrived < 0.94 * 5000 and others == 5000 and longest <= 7, got
    assert 0 <= arrived + lost - 5000 <= 5  # ... and a few other frames (the bridge's queries)


@ROOT_ONLY
@pytest.mark.distributed
def test_a_full_queue_shows_in_the_hosts_tcp_and_queue_counters():
    """One TCP flow through a 4 Mbit/s NIC (a 100 ms queue: 50 KB) outgrows the queue: the
    sender's queue drops frames and its TCP sends segments again; nothing else moved."""
    with netns.Cluster(3, 4_000_000) as cluster:
        before = cluster.transport_counters()
        _flows(cluster, [(0, 1)], 300_000)
        after = cluster.transport_counters()
    moved = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before, strict=True)]
    assert moved[0]["tx_drops"] > 0 and moved[0]["retransmits"] > 0, moved
    assert moved[1]["rx_drops"] == 0 and moved[2] == dict.fromkeys(moved[2], 0), moved


@ROOT_ONLY
@pytest.mark.distributed
def test_a_full_medium_shows_in_its_queue_drops():
    """Two TCP flows from two 4 Mbit/s NICs offer a shared 4 Mbit/s medium twice its rate: its
    queue (100 ms: 50 KB) drops frames, and ``medium_counters`` says how many."""
    with netns.Cluster(4, 4_000_000, medium="shared") as shared:
        first = shared.medium_counters()
        _flows(shared, [(0, 1), (2, 3)], 200_000)
        last = shared.medium_counters()
    assert first["drops"] >= 0 and last["drops"] - first["drops"] > 0, (first, last)


@ROOT_ONLY
@pytest.mark.slow
def test_a_shared_medium_is_one_budget_for_every_host_and_leaves_nothing():
    """``--medium shared``: two flows between disjoint pairs of hosts share the medium's rate
    (on a switch each has its own NICs' rate); the medium counts what crossed it; the ifb and
    every namespace go with the cluster."""
    before = our_namespaces()
    nbytes, rate = 2_000_000, 40_000_000  # 0.4 s alone at 40 Mbit/s
    with netns.Cluster(4, rate, medium="switch") as switch:
        alone = max(_flows(switch, [(0, 1), (2, 3)], nbytes))
    with netns.Cluster(4, rate, medium="shared") as shared:
        first = shared.medium_counters()
        together = max(_flows(shared, [(0, 1), (2, 3)], nbytes))
        crossed = shared.medium_counters()["tx_bytes"] - first["tx_bytes"]
        ifbs = subprocess.run(
            ["ip", "-n", shared.bridge_ns, "-o", "link", "show", "type", "ifb"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert shared.medium_dev in ifbs
    assert alone < 0.6 and together > 1.5 * alone, (alone, together)
    assert 2 * nbytes < crossed < 2.2 * nbytes  # both flows, each frame once (and ACKs)
    assert our_namespaces() == before
    assert netns.Cluster(3, rate).medium_counters() == {}  # a switch has no medium to count
