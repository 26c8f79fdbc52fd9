"""A transport is its module and its registry entry: one registered here (the master's
streams one after another, last worker first) delivers exactly over a real process group,
counts its bytes, and ``predict`` prices it by the cost it carries; an unknown name is one
line."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist

from coded_shuffle.costs.model import Cost, Network, Reach, Traffic
from coded_shuffle.distributed.transports import REGISTRY, transport_cost
from coded_shuffle.distributed.transports.base import KeyName, OnMessage, Stream, Transport
from coded_shuffle.distributed.transports.chain import ChainOptions
from coded_shuffle.distributed.transports.multicast import MulticastOptions
from coded_shuffle.errors import UsageError
from coded_shuffle.tools import cli
from coded_shuffle_train.config import DistConf, transport_fields
from tests.links import CHUNK, WIDTH, WORLD, check_rows, deliver_rows, framed, routes_for
from tests.ranks import run_ranks

NAME = "reverse-unicast"


class SerialCost(Cost):
    """One stream at a time: each at the slower of the master's and a worker's NIC."""

    def busy(self, stream: float, traffic: Traffic, net: Network, reach: Reach | None) -> float:
        del traffic, reach
        return net.tcp(stream) / (min(net.rate, net.master_rate) / 8)


class ReverseUnicast(Transport):
    """The master sends every worker its own stream, the last worker's first, one at a time."""

    name = NAME
    summary = "uncoded only: the master's streams one after another, last worker first"
    routing = "master"
    cost = SerialCost()

    def exchange(
        self,
        streams: Sequence[Stream],
        outgoing: Mapping[int, Iterable[torch.Tensor]],
        on_message: OnMessage,
    ) -> None:
        self.check_streams(streams)
        me, group = self.peer.rank, self.peer.group
        for i in reversed(range(len(streams))):
            s = streams[i]
            if s.src == me:
                for buf in outgoing[i]:
                    dist.send(buf, dst=self.peer.at(s.dsts[0]), group=group)
                self.counts.egress += s.total
            elif me in s.dsts:
                for j, size in enumerate(s.sizes):
                    buf = torch.empty(size, dtype=torch.uint8)
                    dist.recv(buf, src=self.peer.at(s.src), group=group)
                    on_message(i, j, buf)
                self.counts.ingress += s.total


@pytest.fixture
def reverse_unicast(monkeypatch):
    """The registry with the transport above in it, for this test only."""
    monkeypatch.setitem(REGISTRY, NAME, ReverseUnicast)
    return ReverseUnicast


@pytest.mark.distributed
def test_a_registered_transport_delivers_exactly_and_counts_its_bytes(reverse_unicast):
    results = run_ranks(WORLD, deliver_rows, NAME, {})
    check_rows(results, WORLD, NAME)
    needs, _ = routes_for(NAME, WORLD)
    own = [framed(n.size, WIDTH, CHUNK) for n in needs]
    assert [r[1][0] for r in results] == [sum(own), 0, 0, 0]
    assert [r[1][1] for r in results] == [0, *own]


def test_predict_prices_a_registered_transport_by_its_own_cost(reverse_unicast, capsys):
    argv = ["predict", "-K", "4", "-N", "4000", "-B", "1000", "--rate", "100mbit", "--json"]
    argv += ["--master-rate", "400mbit"]  # unicast's streams at once fill the master's NIC
    assert cli.main(argv) == 0
    rows = {
        (r["delivery"], r["transport"]): r
        for r in map(json.loads, capsys.readouterr().out.splitlines())
    }
    assert ("coded", NAME) not in rows  # it carries rows only (routing "master")
    mine, unicast = rows[("uncoded", NAME)], rows[("uncoded", "unicast")]
    net = Network("switch", 100e6, 400e6)
    stream = mine["uncoded_bytes"]
    traffic = Traffic(4, mine["coded_bytes"], stream)
    assert mine["seconds"] == pytest.approx(SerialCost().seconds(stream, traffic, net))
    assert mine["seconds"] > unicast["seconds"]  # one stream at a time: a worker's NIC's pace
    assert mine["master_bytes"] == unicast["master_bytes"] == stream


def test_an_unknown_transport_has_no_cost_but_one_line():
    with pytest.raises(UsageError, match=r"transport='carrier-pigeon' unknown; valid: .*unicast"):
        transport_cost("carrier-pigeon")


@dataclass
class Backwards:
    """A small transport's own option."""

    last_first: bool = True

    def check(self, world_size: int | None, name: KeyName) -> None:
        del world_size, name


class ReverseWithOptions(ReverseUnicast):
    name = "reverse_unicast"
    Options = Backwards


def test_a_registered_transports_options_join_the_job_schema():
    """The job's ``dist.<key>`` fields come from the registry: a transport with options gets
    its own key with its registry entry (transports that share a mechanism share one)."""
    registry = {**REGISTRY, ReverseWithOptions.name: ReverseWithOptions}
    fields = {key: kind for key, kind, _ in transport_fields(registry)}
    assert fields["reverse_unicast"] is Backwards
    assert fields["chain"] is ChainOptions and fields["multicast"] is MulticastOptions
    assert "peer-multicast" not in fields and "p2p" not in fields  # dist.multicast; none
    keys = {key for key, _, _ in transport_fields(REGISTRY)}
    assert (
        keys == {"chain", "multicast", "unicast"} <= {f.name for f in dataclasses.fields(DistConf)}
    )
