"""Every master-sourced transport against a plain TCP stream of the same bytes: a torchrun script.

Run by ``scripts/bench_transport.py --loopback`` (``torchrun --standalone --nproc-per-node P``,
every rank on this machine, no ``tc`` limit). The master holds ``--mbytes`` MB of random rows
and every worker needs all of them: one stream through :class:`~coded_shuffle.distributed.
transports.Link` (framing, header checks, rows put in place) over each transport (``NAME/gloo``:
its ``gloo`` data plane; the default is ``socket``), and the same framed bytes from the master to
every worker over one plain TCP socket each (``sendall`` into ``recv_into`` a buffer, nothing
checked: the physical limit of this machine's loopback for these processes), timed before and
after the transports (the faster counts: the machine's pace drifts within a run). Median
seconds of ``--repeats`` runs, from a barrier before the first byte to a barrier after every
worker has its rows; every worker's rows are compared with the master's after each run,
outside the timed span (the raw stream's are not compared at all); rank 0 prints one JSON
line per row.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import threading
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from coded_shuffle.costs.wire import DEFAULT_CHUNK_BYTES, framed_bytes
from coded_shuffle.distributed.reports import HostCpu
from coded_shuffle.distributed.transports import Link, Peer, Routes, build_transport
from coded_shuffle.distributed.transports.framing import KIND_PLACEMENT

TRANSPORTS = ("unicast", "chain", "tree", "unicast/gloo", "chain/gloo")  # NAME[/PLANE]


def timed(step, repeats: int, before=None) -> tuple[float, float]:
    """Median wall seconds of ``step()`` between two barriers, and this rank's CPU seconds
    per run (median); ``before()`` runs ahead of each, untimed."""
    walls, cpus = [], []
    for _ in range(repeats):
        if before is not None:
            before()
        dist.barrier()
        t0, cpu = time.perf_counter(), HostCpu.start()
        step()
        dist.barrier()
        walls.append(time.perf_counter() - t0)
        cpus.append(cpu.stop().total)
    return statistics.median(walls), statistics.median(cpus)


def transport_step(name: str, rows: torch.Tensor | None, n: int, w: int, chunk: int):
    rank, world = dist.get_rank(), dist.get_world_size()
    kind, _, plane = name.partition("/")
    options = {"plane": plane} if plane else {}
    transport = build_transport(kind, Peer(rank, world, timedelta(seconds=300)), options)
    link = Link(transport, chunk)
    every = np.arange(n, dtype=np.int64)
    routes = Routes(tuple(every if rank in (0, k + 1) else None for k in range(world - 1)))
    out = torch.empty((n, w), dtype=torch.uint8) if rank else None

    def clear() -> None:  # untimed: the last run's rows gone, so that every run is checked
        if out is not None:
            out.zero_()

    def step() -> None:
        link.deliver(
            epoch=1,
            part=0,
            kind=KIND_PLACEMENT,
            num_rows=n,
            row_bytes=w,
            routes=routes,
            rows=rows,
            out=out,
        )

    def check() -> None:  # untimed, after each run: the raw stream is not compared either
        if rank and not torch.equal(out, expected_rows(n, w)):
            raise SystemExit(f"{name}: worker {rank} received wrong rows")

    def before() -> None:
        if out is not None and runs[0]:
            check()
        clear()
        runs[0] += 1

    runs = [0]
    return step, before, check, transport


_EXPECTED: dict[tuple[int, int], torch.Tensor] = {}


def expected_rows(n: int, w: int) -> torch.Tensor:
    """The master's rows, derived from the seed on every rank (for the check after timing)."""
    if (n, w) not in _EXPECTED:
        gen = torch.Generator().manual_seed(n * 7919 + w)
        _EXPECTED[(n, w)] = torch.randint(0, 256, (n, w), dtype=torch.uint8, generator=gen)
    return _EXPECTED[(n, w)]


def raw_tcp_step(nbytes: int):
    """The master sends ``nbytes`` to every worker over its own TCP socket, all at once."""
    rank, world = dist.get_rank(), dist.get_world_size()
    port = [0]
    if rank == 0:
        server = socket.create_server(("127.0.0.1", 0), backlog=world)
        port = [server.getsockname()[1]]
    dist.broadcast_object_list(port, src=0)
    if rank == 0:
        conns = [server.accept()[0] for _ in range(world - 1)]
        server.close()
        data = memoryview(np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8))

        def step() -> None:
            threads = [threading.Thread(target=c.sendall, args=(data,)) for c in conns]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        return step, conns
    conn = socket.create_connection(("127.0.0.1", port[0]))
    buf = memoryview(bytearray(nbytes))

    def step() -> None:
        got = 0
        while got < nbytes:
            n = conn.recv_into(buf[got:])
            if n == 0:
                raise SystemExit("raw TCP stream closed early")
            got += n

    return step, [conn]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mbytes", type=float, default=200.0, help="stream size, MB")
    parser.add_argument("--point-bytes", type=int, default=2004)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunk-bytes", type=int, default=DEFAULT_CHUNK_BYTES)
    parser.add_argument("--transports", nargs="+", default=list(TRANSPORTS))
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    w, chunk = args.point_bytes, args.chunk_bytes
    n = max(1, int(args.mbytes * 1e6 / w))
    stream = framed_bytes(n, w, chunk)
    rows = expected_rows(n, w) if rank == 0 else None
    expected_rows(n, w)
    results = []
    raw, conns = raw_tcp_step(stream)
    first = timed(raw, args.repeats)
    for name in args.transports:
        step, before, check, transport = transport_step(name, rows, n, w, chunk)
        results.append((name, *timed(step, args.repeats, before)))
        check()
        transport.close()
    # the raw stream before and after the transports, the faster of the two: the machine's
    # pace drifts within a run, and the ceiling is what it reached
    last = timed(raw, args.repeats)
    results.insert(0, ("raw tcp", *min(first, last)))
    for c in conns:
        c.close()
    cpus = [torch.tensor([c for _, _, c in results], dtype=torch.float64)]
    gathered = [torch.zeros_like(cpus[0]) for _ in range(world)] if rank == 0 else None
    dist.gather(cpus[0], gathered, dst=0)
    if rank == 0:
        assert gathered is not None
        for i, (name, seconds, _) in enumerate(results):
            host_cpu = [float(g[i]) for g in gathered]
            print(
                json.dumps(
                    {
                        "processes": world,
                        "transport": name,
                        "stream_bytes": stream,
                        "delivered_bytes": stream * (world - 1),
                        "seconds": seconds,
                        "host_cpu_seconds": host_cpu,
                    }
                ),
                flush=True,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
