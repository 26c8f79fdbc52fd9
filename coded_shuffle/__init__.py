"""coded-shuffle: coded data shuffling for distributed random-reshuffling SGD.

``from coded_shuffle import CodedShuffle`` gives the training-loop API
(:class:`coded_shuffle.shuffle.CodedShuffle`). It is loaded on first use, so that the math
(``coded_shuffle.schemes``, ``.plan``, ``.bounds`` ...) imports without torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CodedShuffle"]


def __getattr__(name: str) -> Any:
    if name == "CodedShuffle":
        from .shuffle import CodedShuffle  # torch: only when the API is asked for

        return CodedShuffle
    raise AttributeError(f"module 'coded_shuffle' has no attribute {name!r}")
