"""Every transport's cost model and options: rates, datagram sizes, the registry's errors and
the job's keys."""

from __future__ import annotations

import dataclasses
import math
import socket
import time
from pathlib import Path

import pytest

from coded_shuffle.costs.rates import format_rate, parse_rate
from coded_shuffle.costs.wire import (
    default_datagram_bytes,
    wire_bytes,
)
from coded_shuffle.distributed.transports import (
    JOB_NAMES,
    REGISTRY,
    ChainOptions,
    MulticastOptions,
    build_transport,
    transport_class,
)
from coded_shuffle.distributed.transports.chain import chain_order
from coded_shuffle.distributed.transports.multicast.batches import enlarge_send_buffer
from coded_shuffle.distributed.transports.multicast.pacing import (
    CATCH_UP_BYTES,
    CATCH_UP_SECONDS,
    Pacer,
    catch_up_bytes,
    send_buffer_bytes,
)
from coded_shuffle.distributed.transports.tree import children
from coded_shuffle.errors import UsageError
from tests.links import (
    PEER,
)

# --- models and options -----------------------------------------------------------------------


def test_gloo_binomial_tree_children():
    """gloo/broadcast.cc: in round i every rank r < 2^i sends to r + 2^i (root 0)."""
    assert children(0, 5) == [1, 2, 4]
    assert children(1, 5) == [3]
    assert children(2, 5) == []
    assert children(3, 8) == [7]
    assert children(0, 9) == [1, 2, 4, 8]
    assert [len(children(0, p)) for p in range(2, 18)] == [
        math.ceil(math.log2(p)) for p in range(2, 18)
    ]


def test_the_multicast_pacer_catches_up_a_hold_up_within_its_slack():
    pacer = Pacer(8e6, 1000)  # 1 ms per 1000-byte datagram; slack: 50 ms (50 KB)
    assert pacer.interval == pytest.approx(1e-3)
    assert pacer.slack == pytest.approx(CATCH_UP_SECONDS, rel=1e-3)
    held = pacer.due = time.perf_counter() - pacer.slack / 2  # held up, within the slack
    pacer.wait()
    assert pacer.due == held  # what fell due meanwhile goes out at once (no sleep)
    before = time.perf_counter()
    pacer.due = before - 10 * pacer.slack  # held up far longer
    pacer.wait()
    assert before - pacer.slack <= pacer.due <= time.perf_counter() - pacer.slack


def test_the_catch_up_burst_is_bounded_in_bytes_and_in_time():
    assert catch_up_bytes(8e6) == int(1e6 * CATCH_UP_SECONDS)  # a slow NIC: its 50 ms
    assert catch_up_bytes(400e6) == CATCH_UP_BYTES  # 2 MiB is 42 ms at 400 Mbit/s
    assert Pacer(400e6, 1514).slack == pytest.approx(CATCH_UP_BYTES * 8 / 400e6)
    assert send_buffer_bytes(400e6, 48_448) == CATCH_UP_BYTES + 2 * 48_448


def test_the_send_buffer_grows_to_hold_the_burst_and_never_shrinks():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        default = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 2
        assert enlarge_send_buffer(sock, default // 2) == default  # never less
        wanted = send_buffer_bytes(400e6, 48_448)
        held = enlarge_send_buffer(sock, wanted)
        cap = int(Path("/proc/sys/net/core/wmem_max").read_text())
        assert held >= min(wanted, cap)  # root forces it past the cap; others get the cap
        assert enlarge_send_buffer(sock, wanted // 4) == held


def test_default_datagrams_fill_one_frame():
    for mtu in (576, 1500, 4000, 9000):
        d = default_datagram_bytes(mtu)
        assert d == mtu - 48  # IPv4, UDP, our header
        assert wire_bytes(d + 20, mtu) == mtu + 14  # one frame, no fragment
    assert wire_bytes(default_datagram_bytes(1500) + 21, 1500) == 1501 + 14 + 34  # one more


def test_wire_bytes_of_a_fragmented_datagram():
    # 8208 bytes + 8 UDP = 8216 IP payload; 1480 per fragment -> 6 fragments of 34 header bytes
    assert wire_bytes(8208, 1500) == 8216 + 6 * 34
    assert wire_bytes(1000, 1500) == 1008 + 34
    assert wire_bytes(8208, 9000) == 8216 + 34
    assert wire_bytes(8972, 9000) == 8980 + 34  # 8,980 bytes of IP payload fit one frame
    assert wire_bytes(8973, 9000) == 8981 + 2 * 34  # ... and one more does not


@pytest.mark.parametrize(
    ("text", "bits"),
    [("400mbit", 400_000_000), ("1gbit", 10**9), ("50mbps", 400_000_000), ("2.5Mbit", 2_500_000)],
)
def test_rates_in_tc_units(text, bits):
    assert parse_rate(text) == bits
    assert parse_rate(format_rate(bits)) == bits


@pytest.mark.parametrize(
    "text",
    ["400mb", "fast", "", "-3mbit", "1kbit"],
    ids=["400mb", "fast", "empty", "-3mbit", "1kbit"],
)
def test_bad_rates_are_one_usage_error(text):
    with pytest.raises(UsageError, match="rate"):
        parse_rate(text)


def test_registry_and_option_errors():
    assert set(REGISTRY) == {
        "tree",
        "chain",
        "multicast",
        "unicast",
        "p2p",
        "peer-unicast",
        "peer-multicast",
    }
    with pytest.raises(UsageError, match=r"^transport='smoke' unknown; valid: chain, "):
        build_transport("smoke", PEER)
    with pytest.raises(UsageError, match=r"must list every worker rank 1\.\.3 once"):
        chain_order([1, 1, 2], 4)
    assert chain_order([3, 1, 2], 4) == (3, 1, 2)
    with pytest.raises(UsageError, match=r"^transport_options\['window'\]=0 out of range"):
        REGISTRY["chain"].validate(4, window=0)
    with pytest.raises(UsageError, match=r"^transport_options\['rate'\] is required"):
        REGISTRY["multicast"].validate(4)
    with pytest.raises(UsageError, match="not an IPv4 multicast address"):
        REGISTRY["multicast"].validate(4, rate="1gbit", group="10.0.0.1")
    with pytest.raises(UsageError, match=r"^transport=tree takes no options, got \['window'\]"):
        REGISTRY["tree"].validate(4, window=3)
    with pytest.raises(UsageError, match=r"^transport_options\['windows'\] is not an option"):
        REGISTRY["chain"].validate(4, windows=3)
    with pytest.raises(UsageError, match=r"segment_bytes'\]=10 out of range \(must be >= 1024\)"):
        REGISTRY["chain"].validate(4, segment_bytes=10)


def test_the_job_names_its_hydra_keys():
    """The same checks, named the way the training job's config names them."""
    with pytest.raises(UsageError, match=r"^dist\.chain\.window=0 out of range"):
        REGISTRY["chain"].validate(4, JOB_NAMES, window=0)
    with pytest.raises(UsageError, match=r"^dist\.chain\.order=\[1, 1, 2\] must list"):
        REGISTRY["chain"].validate(4, JOB_NAMES, order=[1, 1, 2])
    with pytest.raises(UsageError, match=r"^dist\.multicast\.rate is required"):
        REGISTRY["multicast"].validate(4, JOB_NAMES)
    with pytest.raises(UsageError, match=r"^dist\.multicast\.rate 'x' cannot be parsed"):
        REGISTRY["multicast"].validate(4, JOB_NAMES, rate="x")
    with pytest.raises(UsageError, match=r"^dist\.multicast\.slow_lanes=5 out of range 0\.\.4$"):
        REGISTRY["multicast"].validate(4, JOB_NAMES, rate="1gbit", slow_lanes=5)
    with pytest.raises(UsageError, match=r"^dist\.transport='smoke' unknown"):
        transport_class("smoke", JOB_NAMES)


def test_each_option_has_one_default_the_job_schema_reuses():
    """The Hydra schema's ``dist.chain``/``dist.multicast`` are the transports' dataclasses."""
    from coded_shuffle_train.compose import CONF_DIR
    from coded_shuffle_train.config import DistConf

    fields = {f.name: f.default_factory for f in dataclasses.fields(DistConf) if f.default_factory}
    assert fields["chain"] is ChainOptions and fields["multicast"] is MulticastOptions
    assert REGISTRY["chain"].Options is ChainOptions
    conf = (CONF_DIR / "config.yaml").read_text()
    assert "window:" not in conf and "grace_seconds:" not in conf  # no second default
