"""The bytes layer: data set items as fixed-size records, the byte codec that runs a proved
plan over them (encode at the master, decode at a worker, streamed), the gather-XOR kernel it
runs on, and a worker's persistent block store.

The codec's functions are re-exported here (``coded_shuffle.codec.encode`` is
:func:`coded_shuffle.codec.programs.encode`), the path they had before the layers.
"""

from coded_shuffle.codec.kernel import set_threads
from coded_shuffle.codec.programs import (
    Encoder,
    StreamDecoder,
    Workspace,
    batch_from_workspace,
    cache_bytes,
    decode,
    decode_workspace,
    digest,
    empty_rows,
    encode,
    encode_blocks,
    gather_rows,
    join_subpoints,
    run_blocks,
    run_ops,
    split_points,
)

__all__ = [
    "Encoder",
    "StreamDecoder",
    "Workspace",
    "batch_from_workspace",
    "cache_bytes",
    "decode",
    "decode_workspace",
    "digest",
    "empty_rows",
    "encode",
    "encode_blocks",
    "gather_rows",
    "join_subpoints",
    "run_blocks",
    "run_ops",
    "set_threads",
    "split_points",
]
