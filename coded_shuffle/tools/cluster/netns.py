"""An emulated cluster on one machine: one Linux network namespace per host (transports.md).

Every host ``h<i>`` is a namespace with one NIC, ``eth0`` (a veth pair), plugged into a
bridge that lives in a namespace of its own; ``tc tbf`` limits every NIC in both directions
(the host's ``eth0`` limits what it sends, the bridge's port what it receives).

The medium between the NICs is a switch (``medium="switch"``: full bisection, the bridge
forwards at once) or a **shared medium** (``medium="shared"``: the papers' broadcast link,
one bus or radio channel): every frame that enters the bridge from any host is first
redirected (an ``ingress`` qdisc on every bridge port, a ``u32`` filter matching every frame,
the ``mirred`` action) into one ``ifb`` device whose ``tbf`` is the medium's budget of
``rate``; the ifb hands it back to the bridge, which then forwards it (and copies a multicast
frame to every port after the medium whose host joined its group: a multicast frame is paid
once; the bridge snoops IGMP, :data:`SNOOPING`, and is its querier). The ifb's counters
are what crossed the medium. Addresses
(``10.77.0.<i+1>/24``) and the multicast route exist only inside these namespaces. Names
carry a random run id, so two clusters never collide, and every cluster is registered in
:data:`STATE_DIR` with the pid that owns it: :func:`sweep_stale` removes what a killed owner
left behind. :class:`Cluster` is a context manager that removes everything on every exit path.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coded_shuffle.costs.wire import ETHERNET_HEADER_BYTES
from coded_shuffle.errors import UsageError

STATE_DIR = Path("/run/coded-shuffle")
NETNS_ETC = Path("/etc/netns")
SUBNET = "10.77.0"
MAX_HOSTS = 250
IFACE = "eth0"
# the bridge snoops IGMP, as most switches do, so each port gets the multicast groups its host
# joined. It is the querier (a Linux bridge without one floods every group), in version 3 (in
# version 2 a host that hears another's report for a group suppresses its own, and the bridge
# then forwards that group to one of them only), and waits 0.2 s for a query's responses (10 s
# by default, during which it floods every group: set before the querier, whose switching on
# starts that wait)
SNOOPING = ("mcast_snooping", "1", "mcast_igmp_version", "3", "mcast_query_response_interval", "20")
QUERIER = ("mcast_querier", "1")
# classic BPF's random number (SKF_AD_OFF + SKF_AD_RANDOM, linux/filter.h): ``ld rand``
BPF_LOAD_RANDOM = (1 << 32) - 4096 + 56
MEDIA = ("switch", "shared")


class ClusterError(RuntimeError):
    """The host cannot build the emulated cluster (no root, no namespaces, no tc)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    try:
        out = subprocess.run(["ip", *args], capture_output=True, text=True)
    except FileNotFoundError:
        raise ClusterError("the `ip` command (iproute2) is not installed") from None
    if check and out.returncode:
        raise ClusterError(f"ip {' '.join(args)}: {out.stderr.strip() or 'failed'}")
    return out


def _tc(ns: str, *args: str) -> None:
    out = subprocess.run(["ip", "netns", "exec", ns, "tc", *args], capture_output=True, text=True)
    if out.returncode:
        raise ClusterError(f"tc {' '.join(args)} in {ns}: {out.stderr.strip() or 'failed'}")


def check_privileges() -> None:
    """:class:`ClusterError` with one line unless this process can create namespaces."""
    if os.geteuid() != 0:
        raise ClusterError(
            "the emulated cluster needs root (network namespaces, veth pairs, tc); run as root"
        )
    if shutil.which("ip") is None or shutil.which("tc") is None:
        raise ClusterError("the emulated cluster needs iproute2's `ip` and `tc` commands")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_namespace_processes(ns: str, sig: int = signal.SIGKILL) -> int:
    """Signals every process inside namespace ``ns``; returns how many there were."""
    out = _ip("netns", "pids", ns, check=False)
    pids = [int(p) for p in out.stdout.split()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    return len(pids)


def remove_namespaces(names: list[str]) -> None:
    """Kills what runs inside, deletes the namespaces (their veths go with them)."""
    for ns in names:
        kill_namespace_processes(ns)
    deadline = time.monotonic() + 5
    for ns in names:
        while kill_namespace_processes(ns) and time.monotonic() < deadline:
            time.sleep(0.05)
        _ip("netns", "del", ns, check=False)
        shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)


def sweep_stale() -> list[str]:
    """Removes clusters whose owning process is gone; returns their run ids."""
    removed = []
    if not STATE_DIR.is_dir():
        return removed
    for path in STATE_DIR.glob("*.json"):
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if _alive(int(state.get("pid", 0))):
            continue
        remove_namespaces(list(state.get("namespaces", [])))
        path.unlink(missing_ok=True)
        removed.append(path.stem)
    return removed


def _write(path: Path, text: str) -> None:
    """Writes ``path``, creating its folder (again, if another cluster just removed it)."""
    for _ in range(3):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.write_text(text)
            return
        except FileNotFoundError:
            continue
    path.write_text(text)


@dataclass
class Cluster:
    """``hosts`` namespaces on one bridge, NICs limited to ``rate`` bits/s both ways (host 0's
    to ``master_rate``, any host's to its ``host_rates`` entry), each running ``host_procs``
    processes (default 1)."""

    hosts: int
    rate: int
    master_rate: int | None = None
    mtu: int = 1500
    medium: str = "switch"
    run_id: str = field(default_factory=lambda: os.urandom(3).hex())
    created: list[str] = field(default_factory=list)
    host_rates: dict[int, int] = field(default_factory=dict)
    host_procs: dict[int, int] = field(default_factory=dict)
    host_losses: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 2 <= self.hosts <= MAX_HOSTS:
            raise UsageError(f"--hosts {self.hosts} out of range 2..{MAX_HOSTS}")
        for key, given in (
            ("--host-rate", self.host_rates),
            ("--host-procs", self.host_procs),
            ("--host-loss", self.host_losses),
        ):
            for host in given:
                if not 0 <= host < self.hosts:
                    raise UsageError(f"{key} {host}=...: host out of range 0..{self.hosts - 1}")
        for host, procs in self.host_procs.items():
            if procs < 1:
                raise UsageError(f"--host-procs {host}={procs}: processes out of range (>= 1)")
        for host, loss in self.host_losses.items():
            if not 0 <= loss < 1:
                raise UsageError(f"--host-loss {host}={loss:g}: share out of range [0, 1)")
        if not 576 <= self.mtu <= 65535:
            raise UsageError(f"--mtu {self.mtu} out of range 576..65535")
        if self.medium not in MEDIA:
            raise UsageError(f"--medium {self.medium!r} unknown; valid: {', '.join(MEDIA)}")

    # -- names -----------------------------------------------------------------------------

    @property
    def bridge_ns(self) -> str:
        return f"cs{self.run_id}br"

    def host_ns(self, i: int) -> str:
        return f"cs{self.run_id}h{i}"

    def sink_dev(self, i: int) -> str:
        """Host ``i``'s device that is never up: where its random loss sends frames."""
        return f"cs{self.run_id}s{i}"

    @property
    def medium_dev(self) -> str:
        """The shared medium's ``ifb`` device (in the bridge's namespace)."""
        return f"cs{self.run_id}md"

    def address(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def host_rate(self, i: int) -> int:
        if i in self.host_rates:
            return self.host_rates[i]
        return self.master_rate if i == 0 and self.master_rate else self.rate

    def procs(self, i: int) -> int:
        """How many processes (ranks) host ``i`` runs."""
        return self.host_procs.get(i, 1)

    @property
    def processes(self) -> int:
        """Every host's processes: the job's world."""
        return sum(self.procs(i) for i in range(self.hosts))

    def host_of(self, rank: int) -> int:
        """The host that runs ``rank`` (ranks go to the hosts in order, a node's together)."""
        first = 0
        for i in range(self.hosts):
            first += self.procs(i)
            if rank < first:
                return i
        raise UsageError(f"rank {rank} out of range 0..{self.processes - 1} (the cluster's)")

    def exec_argv(self, i: int, argv: list[str]) -> list[str]:
        """``argv`` run inside host ``i``'s namespace."""
        return ["ip", "netns", "exec", self.host_ns(i), *argv]

    @property
    def state_file(self) -> Path:
        return STATE_DIR / f"{self.run_id}.json"

    # -- life cycle ------------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        check_privileges()
        sweep_stale()
        try:
            self._register()
            self._create()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def _register(self) -> None:
        names = [self.bridge_ns] + [self.host_ns(i) for i in range(self.hosts)]
        _write(self.state_file, json.dumps({"pid": os.getpid(), "namespaces": names}))

    def _add_ns(self, name: str) -> None:
        _ip("netns", "add", name)
        self.created.append(name)

    def _create(self) -> None:
        br = self.bridge_ns
        self._add_ns(br)
        _ip("-n", br, "link", "add", "br0", "type", "bridge", *SNOOPING)
        _ip("-n", br, "link", "set", "br0", "type", "bridge", *QUERIER)
        _ip("-n", br, "link", "set", "br0", "up")
        hosts_file = "".join(
            f"{self.address(i)} h{i}\n::ffff:{self.address(i)} h{i}\n" for i in range(self.hosts)
        )  # IPv4 and the IPv4-mapped IPv6 form, as gloo and c10d look them up
        for i in range(self.hosts):
            ns, port = self.host_ns(i), f"p{i}"
            self._add_ns(ns)
            _write(NETNS_ETC / ns / "hosts", f"127.0.0.1 localhost\n{hosts_file}")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "add", IFACE, "type", "veth", "peer", "name", port, "netns", br)
            _ip("-n", ns, "link", "set", IFACE, "mtu", str(self.mtu))
            _ip("-n", br, "link", "set", port, "mtu", str(self.mtu))
            _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", IFACE)
            _ip("-n", ns, "link", "set", IFACE, "up")
            _ip("-n", ns, "route", "add", "224.0.0.0/4", "dev", IFACE)
            _ip("-n", br, "link", "set", port, "master", "br0")
            _ip("-n", br, "link", "set", port, "up")
            self._limit(ns, IFACE, self.host_rate(i))  # what host i sends
            self._limit(br, port, self.host_rate(i))  # what host i receives
            if self.host_losses.get(i):
                self._lose(i, self.host_losses[i])
        if self.medium == "shared":
            self._share_medium()

    def _lose(self, i: int, share: float) -> None:
        """Host ``i`` loses ``share`` of the IP frames it receives, each at random: its NIC's
        ingress classifies every frame by a classic BPF program that draws the kernel's random
        number (:func:`random_drop`), and a frame it picks is redirected (``mirred``) to a
        device that is never up, which drops it (this kernel has no ``netem``, ``gact`` or
        ``nft``; ``cls_bpf`` and ``mirred`` it has).

        A run of datagrams sent with one call (UDP GSO; TCP's TSO alike) crosses veths and the
        bridge as one buffer, which the filter would lose whole (multicast's batch of 32
        datagrams: measured at 1% with the block parity of then, 0.35-1.16 MB of repairs a
        delivery that way, 0.13-0.17 MB frame by frame): the bridge's port to the host cuts
        every such buffer into its frames first (``gso_max_segs 1``), so that each is lost on
        its own, as on a wire."""
        ns, sink = self.host_ns(i), self.sink_dev(i)
        _ip("-n", self.bridge_ns, "link", "set", f"p{i}", "gso_max_segs", "1")
        _ip("-n", ns, "link", "add", sink, "type", "ifb")
        _tc(ns, "qdisc", "add", "dev", IFACE, "handle", "ffff:", "ingress")
        _tc(
            ns,
            *("filter", "add", "dev", IFACE, "parent", "ffff:", "protocol", "ip"),
            *("bpf", "bytecode", random_drop(share)),
            *("action", "mirred", "egress", "redirect", "dev", sink),
        )

    def _share_medium(self) -> None:
        """Every frame any host sends passes one ``ifb`` limited to ``rate`` before the bridge
        forwards it (module docstring)."""
        br, medium = self.bridge_ns, self.medium_dev
        _ip("-n", br, "link", "add", medium, "type", "ifb")
        _ip("-n", br, "link", "set", medium, "up")
        self._limit(br, medium, self.rate)
        for i in range(self.hosts):
            port = f"p{i}"
            _tc(br, "qdisc", "add", "dev", port, "handle", "ffff:", "ingress")
            _tc(
                br,
                "filter",
                "add",
                "dev",
                port,
                "parent",
                "ffff:",
                "protocol",
                "all",
                "u32",
                "match",
                "u32",
                "0",
                "0",
                "action",
                "mirred",
                "egress",
                "redirect",
                "dev",
                medium,
            )

    def _limit(self, ns: str, dev: str, rate: int) -> None:
        """``tbf`` on ``dev``: ``rate`` bits/s, a 100 ms queue, and a burst of 2 ms at ``rate``
        but at least 4 frames (an idle NIC sends no more than that at once above its rate)."""
        burst = max(4 * (self.mtu + ETHERNET_HEADER_BYTES), rate // 8 // 500)
        _tc(
            ns,
            "qdisc",
            "add",
            "dev",
            dev,
            "root",
            "tbf",
            "rate",
            f"{rate}bit",
            "burst",
            str(burst),
            "latency",
            "100ms",
        )

    def destroy(self) -> None:
        """Removes every namespace this cluster created (idempotent)."""
        remove_namespaces(list(reversed(self.created)))
        self.created.clear()
        self.state_file.unlink(missing_ok=True)
        for folder in (NETNS_ETC, STATE_DIR):  # ours to create; gone again once empty
            with contextlib.suppress(OSError):
                folder.rmdir()

    # -- observation -----------------------------------------------------------------------

    def nic_counters(self) -> list[dict[str, int]]:
        """Bytes every host's NIC has sent and received so far."""
        return [_counters(self.host_ns(i), IFACE) for i in range(self.hosts)]

    def transport_counters(self) -> list[dict[str, int]]:
        """Per host so far: TCP segments sent again and retransmission timeouts (its
        namespace's ``/proc/net/snmp`` and ``netstat``), and the frames its NIC's queues
        dropped sending (``eth0``'s tbf) and receiving (its bridge port's tbf): where a
        delivery lost time to a full queue; and the frames its random loss dropped
        (``--host-loss``)."""
        out = []
        for i in range(self.hosts):
            tcp = _tcp_counters(self.host_ns(i))
            tcp["tx_drops"] = _queue_drops(self.host_ns(i), IFACE)
            tcp["rx_drops"] = _queue_drops(self.bridge_ns, f"p{i}")
            tcp["loss_drops"] = _loss_drops(self.host_ns(i)) if self.host_losses.get(i) else 0
            out.append(tcp)
        return out

    def medium_counters(self) -> dict[str, int]:
        """Bytes and frames that crossed the shared medium so far, and the frames its queue
        dropped (empty on a switch)."""
        if self.medium != "shared":
            return {}
        counts = _counters(self.bridge_ns, self.medium_dev)
        counts["drops"] = _queue_drops(self.bridge_ns, self.medium_dev)
        return counts


def _counters(ns: str, dev: str) -> dict[str, int]:
    """``dev``'s bytes and frames sent and received (-1 where unreadable)."""
    got = _ip("-n", ns, "-j", "-s", "link", "show", "dev", dev, check=False)
    try:
        stats = json.loads(got.stdout)[0]["stats64"]
        return {
            "tx_bytes": stats["tx"]["bytes"],
            "rx_bytes": stats["rx"]["bytes"],
            "tx_packets": stats["tx"]["packets"],
        }
    except (ValueError, LookupError):
        return {"tx_bytes": -1, "rx_bytes": -1, "tx_packets": -1}


def _tcp_counters(ns: str) -> dict[str, int]:
    """``RetransSegs`` and ``TCPTimeouts`` of namespace ``ns`` (-1 where unreadable)."""
    got = subprocess.run(
        ["ip", "netns", "exec", ns, "cat", "/proc/net/snmp", "/proc/net/netstat"],
        capture_output=True,
        text=True,
        check=False,
    )
    table: dict[str, int] = {}
    lines = got.stdout.splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        kind, _, keys = names.partition(":")
        for key, value in zip(keys.split(), values.partition(":")[2].split(), strict=False):
            table[f"{kind}.{key}"] = int(value) if value.lstrip("-").isdigit() else -1
    return {
        "retransmits": table.get("Tcp.RetransSegs", -1),
        "timeouts": table.get("TcpExt.TCPTimeouts", -1),
    }


def random_drop(share: float) -> str:
    """A classic BPF program, as ``tc``'s ``bytecode`` takes it, that matches a frame with
    probability ``share``: it loads the kernel's random number and matches where it is below
    ``share * 2^32`` (returns -1: the filter's action runs), else returns 0."""
    below = min(int(share * 2**32), 2**32 - 1)
    program = [
        (0x20, 0, 0, BPF_LOAD_RANDOM),  # ld rand
        (0x35, 0, 1, below),  # jge #below: next (keep), else skip one (drop)
        (0x06, 0, 0, 0),  # ret #0: no match
        (0x06, 0, 0, 2**32 - 1),  # ret #-1: match
    ]
    return ",".join([str(len(program)), *(" ".join(map(str, insn)) for insn in program)])


def _tc_stats(ns: str, *show: str) -> Any:
    """``tc -s -j SHOW...`` in namespace ``ns``, parsed (None where unreadable)."""
    got = subprocess.run(
        ["tc", "-n", ns, "-s", "-j", *show], capture_output=True, text=True, check=False
    )
    try:
        return json.loads(got.stdout) if got.stdout.strip() else []
    except ValueError:
        return None


def _loss_drops(ns: str) -> int:
    """Frames the host's random loss dropped so far (0 without one; -1 where unreadable)."""
    filters = _tc_stats(ns, "filter", "show", "dev", IFACE, "parent", "ffff:")
    try:
        actions = [a for f in filters for a in f.get("options", {}).get("actions", [])]
        return sum(int(a["stats"]["packets"]) for a in actions)
    except (ValueError, LookupError, TypeError):
        return -1


def _queue_drops(ns: str, dev: str) -> int:
    """Frames the root qdisc of ``dev`` dropped so far (-1 where unreadable)."""
    qdiscs = _tc_stats(ns, "qdisc", "show", "dev", dev)
    try:
        return int(next(q["drops"] for q in qdiscs if q.get("root")))
    except (ValueError, LookupError, StopIteration, TypeError):
        return -1
