"""Coded elastic computing (Yang et al. 2018): exact gradient descent while workers leave and join.

Pure numpy: the generator, the encoding, the cyclic usage and group decoding, the events and
the master's loop behind a transport interface. The torch.distributed job is
``coded_shuffle_train/elastic_gd.py``.
"""

from coded_shuffle.elastic.cyclic import CyclicUsage, GroupCode
from coded_shuffle.elastic.encoding import block_rows, encode, split_blocks
from coded_shuffle.elastic.generator import (
    Generator,
    systematic_generator,
    with_fresh_row,
    worst_condition,
)
from coded_shuffle.elastic.membership import Event, Membership, parse_events, rebalance
from coded_shuffle.elastic.problem import Problem, make_problem
from coded_shuffle.elastic.runner import ElasticMaster, simulate
from coded_shuffle.elastic.settings import METHODS, Settings, make_settings

__all__ = [
    "METHODS",
    "CyclicUsage",
    "ElasticMaster",
    "Event",
    "Generator",
    "GroupCode",
    "Membership",
    "Problem",
    "Settings",
    "block_rows",
    "encode",
    "make_problem",
    "make_settings",
    "parse_events",
    "rebalance",
    "simulate",
    "split_blocks",
    "systematic_generator",
    "with_fresh_row",
    "worst_condition",
]
