"""Uncoded delivery: every needed sub-point is broadcast once, as it is
(docs/model.md, uncoded delivery)."""

from __future__ import annotations

import numpy as np

from coded_shuffle.math.plan import DeliveryPlan, symbol_blocks
from coded_shuffle.math.schemes.base import Scheme, batch_plan_fields, uncoded_symbols
from coded_shuffle.math.state import CacheState


class Uncoded(Scheme):
    name = "uncoded"
    summary = "every needed point sent once, as it is (the baseline)"
    coded = False

    def plan(self, state: CacheState, new_assignment: np.ndarray) -> DeliveryPlan:
        symbols = uncoded_symbols(state, new_assignment)
        return DeliveryPlan(
            scheme=self.name,
            symbols=symbol_blocks([symbols]),
            breakdown={"uncoded": int(symbols.shape[0])},
            **batch_plan_fields(state, new_assignment),
        )
