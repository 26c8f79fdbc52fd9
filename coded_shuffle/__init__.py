"""coded-shuffle: coded data shuffling for distributed random-reshuffling SGD.

``from coded_shuffle import CodedShuffle, ShuffleSettings, PackedDataset`` gives the
training-loop API (:class:`coded_shuffle.distributed.shuffle.CodedShuffle`, its settings
:class:`coded_shuffle.distributed.settings.ShuffleSettings`, and a packed directory as a data
set, :class:`coded_shuffle.codec.packed.PackedDataset`). They are loaded on first use, so that
the math layer (:mod:`coded_shuffle.math`) imports without torch, and ``import coded_shuffle``
loads neither hydra nor matplotlib nor scikit-learn (the training job's and the plots' own).

The layers, one folder each: ``math`` (assignments, plans, schemes, bounds, the index
decoder; no torch), ``codec`` (records, the byte codec, its kernel, stores), ``distributed``
(``CodedShuffle``, epochs, deliveries, transports, liveness), ``tools`` (the command, the
emulated cluster); ``elastic`` (coded elastic computing) beside them.
"""

from __future__ import annotations

from typing import Any

from coded_shuffle.version import __version__

__all__ = ["CodedShuffle", "PackedDataset", "ShuffleSettings", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "CodedShuffle":
        from coded_shuffle.distributed.shuffle import CodedShuffle  # torch: only when asked for

        return CodedShuffle
    if name == "PackedDataset":
        from coded_shuffle.codec.packed import PackedDataset

        return PackedDataset
    if name == "ShuffleSettings":
        from coded_shuffle.distributed.settings import ShuffleSettings

        return ShuffleSettings
    raise AttributeError(f"module 'coded_shuffle' has no attribute {name!r}")
