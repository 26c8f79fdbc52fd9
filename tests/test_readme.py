"""The README and the docs as a newcomer runs them: their commands, read from README.md and
docs/*.md themselves, run as written with only size overrides (fewer epochs, fewer points),
each exiting 0 and producing the files the text promises; the tables of docs/benchmarks.md
are what their scripts print. A command broken in the documentation fails here."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
DOCS = "\n".join(
    [README, *(p.read_text() for p in sorted((REPO / "docs").glob("*.md")))]
)  # every documented command, the README's first
README_LINES = 250

# size overrides: Hydra keys set (or replaced) in every training command, flags shrunk
TRAIN_SIZE = {"epochs": "2", "data.points": "4000", "job.steps": "30"}  # events at 10, 25
EVALUATE_MAX_POINTS = 3200


def section(title: str, text: str = README) -> str:
    """The text under ``## title`` up to the next ``## `` (the README's by default)."""
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"no section {title!r}"
    return m.group(1)


def blocks(text: str) -> list[list[str]]:
    """The commands of every code block: lines of ``bash`` blocks (``\\`` continuations
    joined, comments cut) and the ``$ ``-prompted lines of the other blocks."""
    out = []
    for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, re.S):
        body = re.sub(r"\\\n\s*", " ", body)
        found = []
        for line in body.splitlines():
            if lang == "bash":
                line = re.sub(r"\s+#.*$", "", line).strip()
                if line and not line.startswith("#"):
                    found.append(line)
            elif line.startswith("$ "):
                found.append(line[2:].strip())
        out.append(found)
    return out


def commands(text: str) -> list[str]:
    return [c for block in blocks(text) for c in block]


def fault_epochs(words: list[str]) -> list[int]:
    """The epochs a command's ``debug.*`` faults fire at (a smaller run must still reach them)."""
    keys = ("debug.die_epoch=", "debug.corrupt_epoch=")
    return [int(w.split("=", 1)[1]) for w in words if w.startswith(keys)]


def sized(command: str) -> str:
    """The command with the size overrides applied (nothing else changes; ``epochs`` stays
    as large as the command's fault epochs)."""
    words = shlex.split(command)
    if words[:2] == ["coded-shuffle", "pack"]:
        words = [w if not w.startswith("data.points=") else "data.points=4000" for w in words]
    elif words[0] == "coded-shuffle-train" or words[:2] == ["coded-shuffle", "cluster"]:
        keys = {w.split("=", 1)[0]: i for i, w in enumerate(words) if re.match(r"[\w.]+=", w)}
        size = {**TRAIN_SIZE, "epochs": str(max([int(TRAIN_SIZE["epochs"]), *fault_epochs(words)]))}
        for key, value in size.items():
            if key in keys:
                words[keys[key]] = f"{key}={value}"
            elif key == "epochs" or (key == "job.steps" and "job=elastic_gd" in words):
                words.append(f"{key}={value}")
    if words[:2] == ["coded-shuffle", "evaluate"]:
        for flag in ("-N", "--points"):
            if flag in words:
                i = words.index(flag) + 1
                words[i] = str(min(int(words[i]), EVALUATE_MAX_POINTS))
    return " ".join(w if re.search(r"[*?]", w) else shlex.quote(w) for w in words)


def run(command: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    """Runs ``command`` in its own session, with a temporary folder of its own (torchrun leaves
    its log folders there; short, as Python 3.11's sockets under it need), removed after. On a
    timeout every process of the session prints its Python stacks (SIGUSR1,
    :func:`coded_shuffle_train.entry.stacks_on_signal`) before it is killed, and the test fails
    with the output: a hang in CI is diagnosable from the log."""
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"  # the venv's commands first
    with tempfile.TemporaryDirectory(prefix="readme-") as scratch:
        env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PATH": path, "TMPDIR": scratch}
        proc = subprocess.Popen(
            ["bash", "-c", command],
            cwd=cwd,
            env=env,
            text=True,
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGUSR1)
            time.sleep(3)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            pytest.fail(
                f"documented command hung for {timeout:.0f} s: {command}\n--- stdout ---\n"
                f"{stdout[-6000:]}\n--- stderr (stacks) ---\n{stderr[-20000:]}"
            )
    out = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert out.returncode == 0, f"documented command failed: {command}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture
def workdir(tmp_path) -> Path:
    """A fresh directory with the repository's scripts (relative paths as in the README)."""
    os.symlink(REPO / "scripts", tmp_path / "scripts")
    return tmp_path


def test_the_readme_is_short_and_links_the_docs():
    """At most 250 lines; the benchmarks, the layout and the command's details are in docs,
    each linked from the README."""
    assert len(README.splitlines()) <= README_LINES
    for doc in ("benchmarks", "architecture", "training", "transports", "command"):
        assert f"(docs/{doc}.md" in README, doc
    assert (REPO / "CHANGELOG.md").is_file() and "(CHANGELOG.md)" in README


def test_the_two_set_up_commands_agree_with_ci():
    quick = commands(section("Quick start"))
    assert len(quick) == 2, quick
    run_job, run_tests = quick
    setup = (
        "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && "
        "pip install -e '.[dev]' && "
    )
    assert run_job.startswith(setup) and run_tests.startswith(setup), quick
    assert run_job.endswith("coded-shuffle-train")
    assert run_tests.endswith(" && pytest"), "the README's test command runs plain pytest"
    ci = [ln.strip() for ln in (REPO / ".ci" / "run").read_text().splitlines()]
    commands_run = [ln for ln in ci if ln and not ln.startswith("#") and not ln.startswith("set ")]
    commands_run = [ln for ln in commands_run if not ln.startswith('cd "$(dirname')]
    assert commands_run == [run_tests], (
        f".ci/run must run the README's test command exactly: {run_tests!r}, not {commands_run!r}"
    )


@pytest.mark.distributed
def test_quick_start_job_writes_what_the_readme_promises(workdir):
    job = commands(section("Quick start"))[0].split(" && ")[-1]
    out = run(sized(job), workdir)
    runs = list(workdir.glob("outputs/*/*"))
    assert len(runs) == 1, runs
    for name in ("metrics.jsonl", "summary.json", "config.yaml"):
        assert (runs[0] / name).is_file(), name
    (shown,) = [ln for ln in section("Quick start").splitlines() if ln.startswith("epoch ")]
    # the README's line with its numbers as patterns: the job prints that line, its epoch 2
    pattern = re.sub(r"(?:\\ )+", " +", re.escape(shown))
    pattern = re.sub(r"\d+(?:\\\.\d+)?", r"\\d+(?:\\.\\d+)?", pattern)
    assert re.search(pattern, out.stdout + out.stderr), (shown, out.stdout[-2000:])


@pytest.mark.distributed
def test_the_sweep_and_compare_recipe_runs_as_written(workdir):
    """The Training section's sweep, then compare.py on the sweep's glob (Hydra's own
    multirun.yaml included), in one directory, as a user runs them."""
    block = blocks(section("Training"))[0]
    sweep = next(c for c in block if " -m " in c)
    compare = next(c for c in block if c.startswith("python scripts/compare.py"))
    assert "runs/sweep/*" in compare
    run(sized(sweep), workdir)
    assert len(list((workdir / "runs" / "sweep").glob("*/metrics.jsonl"))) == 3
    out = run(compare, workdir)
    assert "skipped" in out.stderr  # multirun.yaml is not a run; said in one line
    for png in ("loss.png", "bytes.png", "cumulative.png", "seconds.png", "hosts.png"):
        assert (workdir / "runs" / "plots" / png).stat().st_size > 10_000, png


def test_every_training_command_has_a_valid_config(workdir, monkeypatch):
    """The documented training commands: their overrides compose and validate (what
    the launcher checks before any process starts), after the documented ``pack`` commands
    (smaller) wrote the directories they read."""
    from coded_shuffle_train.compose import compose_argv
    from coded_shuffle_train.entry import typed, validate
    from coded_shuffle_train.pack import pack

    monkeypatch.chdir(workdir)
    # the documented device=cuda commands validate as on a host with CUDA (this one has none)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    packs = {sized(c) for c in commands(DOCS) if c.startswith("coded-shuffle pack")}
    assert packs, "the documented pack command"
    for words in map(shlex.split, sorted(packs)):
        assert words[3] == "--", words
        assert "N = 4,000 training records" in pack(Path(words[2]), words[4:])
    found = [c for c in commands(DOCS) if c.startswith("coded-shuffle-train")]
    assert len(found) >= 12 and any("data=file" in c for c in found)
    for command in found:
        words = [w for w in shlex.split(sized(command))[1:] if w != "-m"]
        for choice in _sweep_choices(words):
            cfg, _ = compose_argv(choice)
            validate(typed(cfg))  # what the launcher hands the job


def _sweep_choices(words: list[str]) -> list[list[str]]:
    """``a=x,y b=z`` as the runs a Hydra sweep makes: ``[a=x b=z], [a=y b=z]``."""
    runs = [[]]
    for w in words:
        key, _, value = w.partition("=")
        values = value.split(",") if "," in value and "[" not in value else [value]
        runs = [[*r, f"{key}={v}" if _ else key] for r in runs for v in values]
    return runs


def test_evaluate_examples_verify(workdir, monkeypatch, capsys):
    """The evaluate examples through the command's entry point (in this process)."""
    from coded_shuffle.tools import cli

    examples = [c for c in commands(DOCS) if c.startswith("coded-shuffle evaluate")]
    setup = [c for c in commands(DOCS) if "np.save" in c]
    assert len(examples) >= 4 and setup, "the documented evaluate examples"
    for command in setup:
        run(command, workdir)
    monkeypatch.chdir(workdir)
    for command in examples:
        assert cli.main(shlex.split(sized(command))[1:]) == 0, command
        out = capsys.readouterr().out
        assert "verified" in out and "MISMATCH" not in out, command


@pytest.mark.distributed
def test_elastic_job_shows_progress_and_a_summary(workdir):
    """docs/elastic.md's first command."""
    elastic = (REPO / "docs" / "elastic.md").read_text()
    job = next(c for c in commands(elastic) if "job=elastic_gd" in c)
    out = run(sized(job), workdir)
    console = out.stdout + out.stderr
    assert re.search(r"coded +step +0/30: \d+ workers, loss", console), console[-2000:]
    assert "final loss" in console and "files:" in console
    assert list(workdir.rglob("metrics.jsonl"))


def test_the_own_loop_diff_turns_a_distributed_sampler_loop_into_a_coded_one():
    """The README's diff: it replaces the sampler, the loader and DDP and the epoch's call,
    nothing else; its ``CodedShuffle`` call's settings are valid as written."""
    (body,) = [
        b
        for lang, b in re.findall(r"```(\w*)\n(.*?)```", section("Your own training loop"), re.S)
        if lang == "diff"
    ]
    removed = [ln[1:] for ln in body.splitlines() if ln.startswith("-")]
    added = [ln[1:] for ln in body.splitlines() if ln.startswith("+")]
    assert len(removed) == len(added) == 4
    assert "DistributedSampler(" in removed[0] and "sampler.set_epoch" in removed[3]
    assert "cs.dataset" in added[1] and "sampler=cs.sampler" in added[1] and "cs.ddp(" in added[2]
    (made,) = [ln for ln in added if "CodedShuffle(" in ln]
    keywords = made.split("master_rank=MASTER, ", 1)[1].rsplit(")", 1)[0]
    from coded_shuffle import ShuffleSettings

    settings = eval(
        f"ShuffleSettings(master_rank=4, {keywords})",
        {"ShuffleSettings": ShuffleSettings, "EPOCHS": 3},
    )
    assert (settings.master_rank, settings.epochs, settings.prefetch) == (4, 3, True)


def test_the_decision_commands_run_and_the_first_says_what_the_readme_shows(capsys):
    """The README's first section: both ``predict`` commands run as written; the first prints
    the verdict the README quotes (deterministic: the same seed plans the same shuffle)."""
    from coded_shuffle.tools import cli

    text = section("Will coding help on my cluster?")
    found = commands(text)
    assert [c.split()[:2] for c in found] == [["coded-shuffle", "predict"]] * 2
    assert cli.main(shlex.split(found[0])[1:]) == 0
    verdict = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("fastest:"))
    quoted = re.search(r"`(fastest: [^`]*)`", text.replace("\n", " ")).group(1)
    assert verdict.startswith(quoted)
    assert cli.main(shlex.split(found[1])[1:]) == 0
    assert "fastest" in capsys.readouterr().out


@pytest.mark.distributed
def test_own_loop_example_runs_as_written_and_trains_the_jobs_parameters(workdir):
    """The own-loop example under torchrun as the README writes it (fewer epochs and points):
    the third command (the first with two persistent loader workers and the master on the
    last rank) verifies every epoch and ends with the training job's parameters bit for bit:
    the job on the example's data set (its ``make_dataset``, imported by Hydra), the same
    model, optimiser, minibatch and seed. The first command is the third's defaults (the
    loader in the training process, whose items are the batch's records:
    ``tests/test_prefetch.py``; the master on rank 0, every job's), run to its end under
    torchrun by ``tests/test_images.py``; the second is the first with ``--scheme uncoded``
    (that coded and uncoded delivery train the same parameters: ``tests/test_api.py``)."""
    found = commands(section("Your own training loop"))
    assert len(found) == 3 and all(c.startswith("torchrun --standalone") for c in found)
    assert found[1] == f"{found[0]} --scheme uncoded"
    assert found[2] == f"{found[0]} --master-rank 4 --num-workers 2"
    os.symlink(REPO / "examples", workdir / "examples")
    out = run(f"OMP_NUM_THREADS=1 {found[2]} --epochs 3 --points 1200", workdir)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("epoch ")]
    assert len(lines) == 3 and all(ln.endswith("verified True") for ln in lines), out.stdout
    digests = re.findall(r"final parameters sha256 ([0-9a-f]{64})", out.stdout)
    data = "_target_:own_loop.make_dataset,points:1200,features:16,classes:4"
    test = "_target_:own_loop.make_dataset,points:200,features:16,classes:4,seed:1"
    job = (
        f"coded-shuffle-train workers=4 epochs=3 seed=0 data=dataset '++data.dataset={{{data}}}' "
        f"'++data.test_dataset={{{test}}}' model=mlp model.hidden=32 hydra.run.dir=job"
    )
    run(f"PYTHONPATH={REPO / 'examples'} {job}", workdir)
    summary = json.loads((workdir / "job" / "summary.json").read_text())
    assert digests == [summary["final_params_sha256"]]


def test_rate_memory_and_benchmark_scripts_run(workdir):
    rate_memory = next(c for c in commands(DOCS) if c.startswith("python scripts/rate_memory.py"))
    assert " -K 6 -N 60 " in rate_memory
    small = " -K 4 -N 24 --epochs 1 --steps 3 "  # a size override
    run(rate_memory.replace(" -K 6 -N 60 ", small), workdir)
    assert (workdir / "rate_memory.png").stat().st_size > 10_000
    bench = next(c for c in commands(DOCS) if c.startswith("python scripts/bench_core.py"))
    out = run(bench + " --workers 4 --points 4000 --schemes cycles", workdir)
    assert "cycles" in out.stdout


def test_the_walk_count_runs_as_written(workdir):
    """docs/architecture.md's count of the functions one coded epoch runs: the script as
    written counts the master's, the CodedShuffle's epoch among them, by file."""
    walk = next(c for c in commands(DOCS) if c.startswith("python scripts/walk_count.py"))
    first, *files = run(walk, workdir).stdout.strip().splitlines()
    counted = (
        r"master, epoch 2 \(cycles over chain\): (\d+) functions of the library in (\d+) files"
    )
    m = re.match(counted, first)
    assert m and int(m.group(2)) == len(files) > 10, first
    assert sum(len(f.split(": ", 1)[1].split(", ")) for f in files) == int(m.group(1))
    shuffle = next(f for f in files if f.startswith("  distributed/shuffle.py: "))
    assert "CodedShuffle.epoch" in shuffle.split(": ", 1)[1].split(", ")


def test_elastic_benchmark_runs_as_written(workdir):
    """Fig. 2(a) (smaller): every method and every number of pre-empted machines, exact."""
    bench = next(c for c in commands(DOCS) if c.startswith("python scripts/bench_elastic.py"))
    out = run(bench + " --rows 360 --cols 60 --trials 3", workdir)
    rows = [ln.split() for ln in out.stdout.splitlines() if ln.split()[:1] == ["coded"]]
    assert [r[1] for r in rows] == ["0", "1", "2", "3"], out.stdout
    assert all(float(r[-1]) < 1e-12 for r in rows), out.stdout
    assert (workdir / "elastic_matmul.png").stat().st_size > 10_000


@pytest.mark.distributed
def test_overlap_benchmark_runs_as_written(workdir):
    """The overlap benchmark under torchrun (smaller): both modes run, one table row."""
    bench = next(c for c in commands(DOCS) if "scripts/bench_overlap.py" in c)
    assert bench.startswith("torchrun --standalone") and " --points 1000000" in bench
    small = bench.replace(" --points 1000000", " --points 3000 --epochs 2 --repeats 1")
    out = run(small, workdir)
    assert "stream/max" in out.stdout, out.stdout
    row = out.stdout.strip().splitlines()[-1].split()
    assert len(row) == 6 and all(float(v) >= 0 for v in row), out.stdout


def test_cluster_commands_pass_their_checks(workdir, monkeypatch, capsys):
    """The documented cluster commands, checked without building hosts (``--dry-run``)."""
    from coded_shuffle.tools import cli
    from coded_shuffle.tools.cluster import command as cluster_command
    from coded_shuffle_train.entry import check_main

    # the job's config check in this process (the command runs ``python -m coded_shuffle_train
    # --check``)
    monkeypatch.setattr(cluster_command, "check_training_config", check_main)
    cluster = [c for c in commands(DOCS) if c.startswith("coded-shuffle cluster")]
    assert len(cluster) >= 3
    monkeypatch.chdir(workdir)
    for command in cluster:
        words = shlex.split(sized(command))[1:]
        assert cli.main([words[0], "--dry-run", *words[1:]]) == 0, command
        out = capsys.readouterr().out  # elastic hosts run torchrun, fixed ones the project's node
        torchrun = "--min-hosts" in words
        node = "-m torch.distributed.run" if torchrun else "-m coded_shuffle_train.node"
        assert f"{node} --nnodes" in out, out


def test_bench_transport_documents_its_options(workdir):
    bench = next(c for c in commands(DOCS) if c.startswith("python scripts/bench_transport.py"))
    run(bench.split(" --")[0] + " --help", workdir)


def test_bench_transport_prices_a_prefetching_runs_multicast_at_its_background_pace():
    """``--predict`` prices a paced stream as the run paced it: behind the training loop (a
    coded epoch ``prefetched``) at ``dist.multicast.background_share`` (0.9, or as ``--set``
    gives it) of its pace, else at all of it; the seconds follow (multicast at 400 Mbit/s)."""
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_transport", REPO / "scripts" / "bench_transport.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_transport"] = mod
    spec.loader.exec_module(mod)

    def result(prefetched: bool):
        rows = [{"phase": "placement"}, {"phase": "coded", "prefetched": prefetched}]
        return mod.Result(4, "cycles", "multicast", rows, {})

    args = argparse.Namespace(
        set=[], rate="400mbit", master_rate=None, medium="switch", mtu=1500, host_rate=[]
    )
    args.points, args.features = 20000, 500  # the bench's defaults: 2,004-byte points
    assert mod.background_share(args, result(False)) == 1.0
    assert mod.background_share(args, result(True)) == 0.9
    paced = [mod.predicted_seconds(args, result(p)) for p in (False, True)]
    assert 1.05 < paced[1] / paced[0] < 1.11  # the stream's seconds / 0.9, the fixed 20 ms not
    args.set = ["dist.multicast.background_share=0.5"]
    assert mod.background_share(args, result(True)) == 0.5


def test_bench_time_to_accuracy_documents_its_options_and_tables_runs(workdir):
    """The time-to-accuracy benchmark (it needs root and builds a cluster for every
    run): here its options, and its table on records written here, without a cluster."""
    import importlib.util

    bench = next(c for c in commands(DOCS) if "scripts/bench_time_to_accuracy.py" in c)
    run(bench.split(" --")[0] + " --help", workdir)
    spec = importlib.util.spec_from_file_location(
        "bench_tta", REPO / "scripts" / "bench_time_to_accuracy.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_tta"] = mod
    spec.loader.exec_module(mod)

    def rows(acc, seconds, load, deliver=0.5):
        return [
            {
                "test_accuracy": a,
                "elapsed_seconds": t,
                "network_bytes": 1e6,
                "epoch_seconds": 1.0,
                "master_egress_bytes": 5e5,
                "delivery_seconds": deliver if e else 0.5,  # the placement: 0.5 s
                "train_seconds": 0.5,
                "wait_seconds": 0.1 if e else 0.5,
                "uncoded_points": 100.0,
                "load_points": load,
                "cpu_seconds_per_gb_max": 2.0,
                "host_anon_bytes": [3e6, 2e6],
                "coverage_min": 1.0,
                "label_tv_max": 0.125,
            }
            for e, (a, t) in enumerate(zip(acc, seconds, strict=True))
        ]

    base = mod.Result(1000, "full", "uncoded", "unicast", rows([0.5, 0.97], [1, 4], 100.0))
    coded = mod.Result(1000, "full", "cycles", "chain", rows([0.5, 0.97], [1, 3], 50.0, 0.25))
    never = mod.Result(1000, "none", "uncoded", "unicast", rows([0.5, 0.9], [1, 2], 0.0))
    lines = mod.table([base, coded, never], 0.96, 0.25)
    chain = next(ln for ln in lines if "full/cycles/chain" in ln).split()
    assert chain[2:8] == ["0.970", "2", "3.00", "0.75", "2.00", "1.00"]  # 3 s / 4 s
    assert chain[-1] == "0.500"
    assert "not reached" in next(ln for ln in lines if "none/uncoded" in ln)
    big = mod.epoch_table([coded, base], 0.25)  # the big runs: every epoch's seconds
    # e1 e2, to the end, vs the best uncoded, placement and reshuffle / unicast's, steps and
    # wait seconds after the placement, overlap ((3 - 0.5) s over max(0.5, 0.25) + 0.5 s),
    # cpu s/GB, anonymous MB, coverage, label distance
    cells = ["1.0", "1.0", "3.0", "0.75", "1.00", "0.50", "0.50", "0.10", "2.50", "2.00", "3"]
    cells += ["1.000", "0.125"]
    assert big[2].split()[1:] == cells
    assert big[-1].endswith("0.5000, 0.9700 (every full run the same)")


def test_the_cifar10_line_composes():
    """The CIFAR-10 line of docs/training.md (torchvision is not a dependency here): its
    overrides compose into the data set, test set and transform nodes that the ``dataset``
    source builds."""
    from coded_shuffle_train.compose import compose_argv

    (line,) = [
        line
        for lang, body in re.findall(r"```(\w*)\n(.*?)```", DOCS, re.S)
        if lang == "text"
        for line in body.splitlines()
        if "torchvision.datasets.CIFAR10" in line
    ]
    cfg, _ = compose_argv(shlex.split(line)[1:])
    data = cfg.data
    assert data.source == "dataset" and cfg.model.name == "cnn"
    assert data.dataset._target_ == data.test_dataset._target_ == "torchvision.datasets.CIFAR10"
    assert data.dataset.transform._target_ == "torchvision.transforms.PILToTensor"
    assert data.test_dataset.train is False and data.dataset.download is True


def test_the_predict_example_prints_what_the_docs_show(capsys):
    """The ``coded-shuffle predict`` example of docs/benchmarks.md and its output, line for
    line (the prediction is deterministic: the same seed plans the same shuffle)."""
    from coded_shuffle.tools import cli

    (body,) = [
        b
        for _, b in re.findall(r"```(\w*)\n(.*?)```", DOCS, re.S)
        if "$ coded-shuffle predict" in b and "--job" not in b
    ]
    lines = textwrap.dedent(body).strip().splitlines()
    assert lines[0].startswith("$ coded-shuffle predict")
    assert cli.main(shlex.split(lines[0][2:])[1:]) == 0
    assert capsys.readouterr().out.strip().splitlines() == lines[1:]


def test_the_predict_job_example_prices_the_runs_the_docs_show(capsys, monkeypatch):
    """docs/command.md's ``predict --job`` example: the same options in the same order, the
    same one marked as the job and the same fastest, on the machine the example was priced on
    (the job's profile is taken here, but with the step time and the cores the example shows
    and this machine's quiet test forward and hash: timed beside the suite's other tests, the
    hash of ``none``'s digests took twice as long and ``partial`` came out fastest)."""
    from coded_shuffle.tools import cli, predict_job

    found = re.findall(r"```(\w*)\n(.*?)```", DOCS, re.S)
    (body,) = [b for _, b in found if "$ coded-shuffle predict --job" in b]
    lines = textwrap.dedent(body).strip().splitlines()
    shown = re.search(r"a step ([\d.]+) ms, (\d+) cores", body)
    assert shown, body
    profiled = predict_job.profile_of
    monkeypatch.setattr(
        predict_job,
        "profile_of",
        lambda overrides: {
            **profiled(overrides),
            "step_seconds": float(shown.group(1)) / 1e3,
            "cores": int(shown.group(2)),
            "eval_seconds_per_point": 2.0e-6,
            "sha256_seconds_per_gb": 0.55,
        },
    )
    assert cli.main(shlex.split(lines[0][2:])[1:]) == 0
    out = capsys.readouterr().out.strip().splitlines()

    def runs(text: list[str]) -> list[tuple[str, str]]:
        rows = [ln.split() for ln in text if re.match(r"(full|partial|none)", ln)]
        return [(r[0], r[-1] if r[-1] in ("*", "<", "*<") else "") for r in rows]

    assert runs(out) == runs(lines[1:]) and len(runs(out)) >= 10


def test_the_measured_runs_are_the_seconds_the_docs_show():
    """``docs/measured_runs.json``'s measured seconds are the docs' tables' (each one printed
    there as measured), and its labels name options ``predict --job`` prices."""
    from coded_shuffle.tools.measured import load

    for table in load(REPO / "docs" / "measured_runs.json"):
        for m in table.runs:
            assert f"{m.seconds:.2f}" in DOCS or f"{m.seconds:.1f} s" in DOCS, (table.title, m)
            option, storage = m.option
            assert option.shuffle in ("full", "partial", "none") and storage >= 1


def test_the_predicted_table_is_what_the_script_prints(workdir):
    """``scripts/predict_table.py`` as docs/benchmarks.md runs it: every line of its table is
    there (regenerated, not edited by hand)."""
    command = next(c for c in commands(DOCS) if c.startswith("python scripts/predict_table.py"))
    out = run(command, workdir).stdout.strip().splitlines()
    shown = {line.strip() for line in DOCS.splitlines()}
    assert len(out) == 9 and all(line.strip() in shown for line in out), out
