"""The typed schema of ``coded-shuffle-train``'s config: one dataclass per concern (Hydra structured
configs). ``coded_shuffle_train/conf/*.yaml`` set the values; these classes fix every key's type, so
that a mistyped value (``optim.lr=abc``) stops at composition with one line naming the key. Ranges
are checked by the jobs' ``validate(cfg)`` before any process starts.

A string under a field is its documentation (shown by ``coded-shuffle-train --help``'s
config dump and read by the docs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, make_dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from coded_shuffle.distributed.transports import REGISTRY, Transport
from coded_shuffle.distributed.transports.base import NoOptions

from .start_methods import DEFAULT_START_METHOD

# --- groups ----------------------------------------------------------------------------------


@dataclass
class SchemeConf:
    name: str = MISSING
    """A registered scheme (``coded-shuffle schemes``)."""


@dataclass
class SourceConf:
    """What every data source has."""

    placement: str = "random"
    """The first assignment: random (from the seed) | by_label (dealt in label order: skewed
    shards)."""


@dataclass
class DigitsConf(SourceConf):
    _target_: str = "coded_shuffle_train.sources.Digits"
    source: str = "digits"
    """scikit-learn's bundled 8x8 digits (1797 images, 10 classes, no download)."""
    test_fraction: float = 0.2
    """Share of the points the master holds for evaluation, in (0, 1)."""
    normalise: bool = True
    """Per-feature standardisation with the training split's statistics."""


@dataclass
class SyntheticConf(SourceConf):
    _target_: str = "coded_shuffle_train.sources.Synthetic"
    source: str = "synthetic"
    """Gaussian classes with size knobs (scale runs)."""
    points: int = 4000
    """Training points (trimmed to a multiple of the workers), >= 1."""
    test_points: int = 1000
    """Test points held by the master, >= 1."""
    features: int = 64
    """Features per point, >= 1 (a record is 4 * features + 4 bytes)."""
    classes: int = 10
    """Classes, >= 2."""
    separation: float = 3.0
    """Scale of the class means."""
    normalise: bool = True
    """Per-feature standardisation with the training split's statistics."""


@dataclass
class FileConf(SourceConf):
    _target_: str = "coded_shuffle_train.sources.File"
    source: str = "file"
    """X (n, ...) and y (n,) integer labels: a directory of .npy files (memory-mapped, never
    loaded whole; coded-shuffle pack writes one), or an .npz or .pt file."""
    path: str = MISSING
    """DIR (X.npy, y.npy, optional X_test.npy, y_test.npy), FILE.npz or FILE.pt (required)."""
    test_fraction: float = 0.2
    """Share held out for evaluation when there is no X_test / y_test, in (0, 1)."""
    normalise: bool | None = None
    """Per-feature standardisation with the training split's statistics; null: true for a
    file, false for a directory (its records move as stored)."""
    transform: Any = field(
        default_factory=lambda: {"_target_": "coded_shuffle_train.datasets.ToFloat"}
    )
    """Decoded inputs (n, ...) -> the model's floats (default ToFloat: uint8 scaled by 1/255,
    float32 as it is)."""


@dataclass
class DatasetConf(SourceConf):
    _target_: str = "coded_shuffle_train.datasets.DatasetSource"
    source: str = "dataset"
    """Any map-style Dataset that Hydra can instantiate; records keep the items' dtypes."""
    dataset: Any = field(
        default_factory=lambda: {"_target_": "coded_shuffle_train.datasets.DigitsImages"}
    )
    """The training set: _target_ (a Dataset class) and its arguments."""
    test_dataset: Any = None
    """The test set the master evaluates on (null: test_fraction of data.dataset)."""
    test_fraction: float = 0.2
    """Share of data.dataset held out when test_dataset is null, in (0, 1)."""
    input_key: str | None = None
    """Dict items: the model's input (null: the one key besides label_key)."""
    item_transform: Any = None
    """Each item's input -> a fixed-size array, before it is stored (null: as it is; PIL
    images become uint8 (C, H, W) arrays, numbers 0-d ones). For images of any size:
    {_target_:coded_shuffle_train.datasets.ResizeCrop,size:32}."""
    label_key: str = "label"
    """Dict items: the integer class label."""
    transform: Any = field(
        default_factory=lambda: {"_target_": "coded_shuffle_train.datasets.ToFloat"}
    )
    """Decoded inputs (n, ...) -> the model's floats, on the worker and for the master's test
    split (null: none). The default ToFloat takes +data.transform.scale (null: 1/255 for uint8),
    .mean, .std; ++data.transform={_target_:pkg.fn,_partial_:true} for an own function. The
    inputs move as the items hold them (no standardisation)."""


@dataclass
class LogRegConf:
    _target_: str = "coded_shuffle_train.models.logreg"
    name: str = "logreg"
    """Multinomial logistic regression (one linear layer)."""


@dataclass
class MLPConf:
    _target_: str = "coded_shuffle_train.models.mlp"
    name: str = "mlp"
    """One hidden layer with ReLU."""
    hidden: int = 64
    """Hidden units, >= 1."""


@dataclass
class CNNConf:
    _target_: str = "coded_shuffle_train.models.cnn"
    name: str = "cnn"
    """Two 3x3 convolutions, 2x2 max-pool, linear (square images only)."""
    channels: int = 8
    """Channels of the first convolution, >= 1."""


@dataclass
class SGDConf:
    name: str = "sgd"
    lr: float = 0.05
    """Step size, > 0."""
    momentum: float = 0.9
    weight_decay: float = 0.0
    batch_size: int = 16
    """Minibatch per worker, >= 1 (the global minibatch is workers * batch_size)."""
    average_every: int = 0
    """0: gradients averaged every step; H >= 1: local SGD, the workers' models (and momentum
    buffers) averaged every H steps and at every epoch's end."""


@dataclass
class ShufflePolicyConf:
    name: str = "full"
    """full | partial | none (coded_shuffle/math/policies.py)."""
    fraction: float = 1.0
    """Q in (0, 1]: the share of every worker's points ``partial`` moves each epoch."""


@dataclass
class ShuffleJobConf:
    name: str = "shuffle_sgd"
    """Random-reshuffling SGD with coded epoch delivery (coded_shuffle_train/shuffle_sgd/)."""
    checkpoint: bool = True
    """After every epoch: the master's checkpoint and every worker's store in the run
    directory; a restart resumes after the last epoch (docs/training.md, "Failures")."""
    checkpoint_steps: int = 0
    """0: epoch checkpoints only. S >= 1: every worker also checkpoints its training state
    every S optimiser steps and keeps its batch, so that a restart resumes at that step of
    that epoch without a new delivery (needs checkpoint=true)."""


@dataclass
class ElasticConf:
    """What both coded-elastic jobs read of ``job.elastic`` (docs/elastic.md)."""

    recovery_threshold: int = 3
    """L: any L of the P coded blocks hold all the data, 1..P-1."""
    generator: str = "gaussian"
    """gaussian | cauchy | vandermonde (systematic)."""
    max_condition: float = 1.0e6
    """Refuse generators whose worst L-subset is worse conditioned."""
    methods: list[str] = field(default_factory=list)
    """Methods run in turn (distinct names of the job's)."""
    events: list[Any] | None = field(default_factory=list)
    """{step: S, leave: [ids]} or {step: S, join: count or [ids]}; ids are ranks 1..workers
    (null or []: none)."""
    step_delay: float = 0.0
    """Seconds of sleep per step (to watch or kill a run), >= 0."""
    store_dir: str | None = None
    """Stores, checkpoint and exit records (null: RUN_DIR/elastic)."""


@dataclass
class ElasticGDElasticConf(ElasticConf):
    """``job=elastic_gd``'s ``job.elastic``."""

    methods: list[str] = field(
        default_factory=lambda: ["coded", "nofailure", "ignore", "repartition", "distr_bgd"]
    )
    events: list[Any] | None = field(
        default_factory=lambda: [{"step": 10, "leave": [2, 4]}, {"step": 25, "join": 1}]
    )
    fully_distributed: bool = False
    """No master in the loop (sec. 3.3; coded, departures only)."""


@dataclass
class MatmulElasticConf(ElasticConf):
    """``job=elastic_matmul``'s ``job.elastic``."""

    methods: list[str] = field(default_factory=lambda: ["coded", "uncoded", "nonadaptive"])
    events: list[Any] | None = field(
        default_factory=lambda: [{"step": 5, "leave": [2, 4]}, {"step": 12, "join": 1}]
    )


@dataclass
class ElasticProblemConf:
    """Synthetic heterogeneous least squares, one source per initial worker."""

    points: int = 360
    features: int = 20
    noise: float = 0.1
    heterogeneity: float = 1.0
    """Spread of the sources' true weights (0: one linear model)."""
    test_points: int = 360
    """Held-out points of the same sources: test_loss in every record."""


@dataclass
class ProductProblemConf:
    """A (rows x cols) and the right factor's columns."""

    rows: int = 6000
    cols: int = 2000
    rhs_cols: int = 1
    """1: A x (Algorithm 1, row blocks); more: A B (sec. 3.1, column blocks)."""


@dataclass
class ElasticJobConf:
    name: str = "elastic_gd"
    """Coded elastic gradient descent, Yang et al. 2018 (coded_shuffle_train/elastic_gd.py)."""
    steps: int = 40
    """Full-batch gradient-descent steps per method, >= 1."""
    lr: float | None = None
    """Step size; null = 1 / largest eigenvalue of X^T X / N + ridge."""
    line_search: bool = False
    """Backtracking (Armijo) line search from 4 lr at every step, for every method."""
    ridge: float = 0.0
    """f(w) = |Xw - y|^2 / (2N) + ridge |w|^2 / 2, >= 0."""
    report_every: int = 10
    """Console line every this many steps per method (0: events and summary only)."""
    problem: ElasticProblemConf = field(default_factory=ElasticProblemConf)
    elastic: ElasticGDElasticConf = field(default_factory=ElasticGDElasticConf)


@dataclass
class ElasticMatmulConf:
    name: str = "elastic_matmul"
    """Coded elastic A x and A B, Yang et al. 2018 Algorithm 1 and sec. 3.1
    (coded_shuffle_train/elastic_matmul.py)."""
    steps: int = 20
    """Products per method (a fresh x or B each step), >= 1."""
    report_every: int = 5
    """Console line every this many steps per method (0: events and summary only)."""
    problem: ProductProblemConf = field(default_factory=ProductProblemConf)
    elastic: MatmulElasticConf = field(default_factory=MatmulElasticConf)


DataConf = DigitsConf | SyntheticConf | FileConf | DatasetConf
ModelConf = LogRegConf | MLPConf | CNNConf

# --- the top level ---------------------------------------------------------------------------


@dataclass
class DistSettings:
    """``dist.*`` but the transports' own options (:data:`DistConf` adds those)."""

    transport: str = "chain"
    """The transport (``coded-shuffle transports`` lists them)."""
    timeout_seconds: float = 60.0
    """A dead, hung or unreachable rank fails the job within this, > 0."""
    heartbeat_seconds: float = 1.0
    """How often every rank tells the others it is alive (job's store), > 0."""
    progress_seconds: float = 10.0
    """The master's console line during a long stage, > 0."""
    chunk_bytes: int = 262144
    """Payload bytes per message (one 24-byte header each), >= 1."""
    start_method: str = DEFAULT_START_METHOD
    """forkserver | spawn (local launcher only)."""
    monitor_interval: float = 0.1
    """Seconds between the launcher's liveness checks."""
    max_restarts: int | None = None
    """How often the launcher restarts the job's processes after a failure (>= 0); the job
    resumes from its checkpoint. null: the job's own default (job=elastic_gd: 1, a worker
    that dies is survived; the others: 0). The one restart setting of every job."""
    elastic: bool = False
    """Under ``torchrun --nnodes MIN:MAX``: the number of workers follows the processes the
    launcher started (WORLD_SIZE - 1) at every start, so a restart with fewer or more hosts
    goes on from the checkpoint with them; ``workers`` then only seeds the first config."""
    store_dir: str | None = None
    """Where every worker's store lives, memory-mapped (one folder per worker); null: the
    run directory's stores/."""
    master_rank: int = 0
    """The rank that holds the data set and sends the deliveries (the master); the workers
    are the other ranks in order. 0..workers."""
    prefetch: bool = True
    """Epoch e + 1's delivery runs while the workers train on epoch e (false: each epoch's
    delivery waits for the training before it)."""


def transport_fields(registry: Mapping[str, type[Transport]]) -> list[tuple[str, type, Any]]:
    """``dist.<key>`` for every registered transport that takes options: its options
    dataclass, the library's (one source), under the key its options go by (transports of
    one mechanism share it: ``peer-multicast`` reads ``dist.multicast``). A new transport's
    options join the job's schema with its registry entry, and no other change."""
    found: dict[str, type] = {}
    for cls in registry.values():
        if cls.Options is not NoOptions:
            found.setdefault(cls.options_key or cls.name, cls.Options)
    for key in found:
        if not key.isidentifier():
            raise ValueError(f"transport options key {key!r} is no identifier: set options_key")
    return [(key, kind, field(default_factory=kind)) for key, kind in found.items()]


DistConf = make_dataclass(
    "DistConf",
    transport_fields(REGISTRY),
    bases=(DistSettings,),
    namespace={"__module__": __name__},
)


@dataclass
class DebugConf:
    die_rank: int | None = None
    """A rank that exits (or hangs) on purpose, to test failure handling."""
    die_epoch: int = 2
    die_step: int | None = None
    """The die rank exits at this optimiser step (1-based) of die_epoch instead of at the
    epoch's start (a worker: a failure in the middle of an epoch)."""
    die_mode: str = "exit"
    """exit | hang."""
    corrupt_epoch: int | None = None
    """The master flips a byte of this epoch's symbols: the job must fail."""
    step_delay: float = 0.0
    """Seconds every worker sleeps per minibatch step (a slow model, long epochs)."""


@dataclass
class Config:
    job: Any = MISSING
    scheme: SchemeConf = MISSING
    shuffle: ShufflePolicyConf = MISSING
    data: Any = MISSING
    model: Any = MISSING
    optim: SGDConf = MISSING
    workers: int = 4
    """K worker processes; one more, the master (dist.master_rank), holds the data set."""
    epochs: int = 10
    """Epoch 1 is the uncoded placement, epochs 2.. are coded deliveries."""
    seed: int = 0
    """Assignments, minibatch order, model init, data split."""
    storage: float = 1.0
    """T: what a worker stores, in batches (1 <= T <= workers)."""
    threads: int = 1
    """Torch and codec threads per process (fixed: bit-identical runs)."""
    device: str = "auto"
    """Where the model trains: auto (CUDA where every rank has it, else the CPU) | cpu |
    cuda. The data plane (transports, stores) stays on the host."""
    tensorboard: bool = False
    """TensorBoard scalars in RUN_DIR/tb (skipped if tensorboard is missing)."""
    dist: DistConf = field(default_factory=DistConf)
    debug: DebugConf = field(default_factory=DebugConf)


SCHEMAS: dict[str, dict[str, type]] = {
    "data": {
        "digits": DigitsConf,
        "synthetic": SyntheticConf,
        "file": FileConf,
        "dataset": DatasetConf,
    },
    "model": {"logreg": LogRegConf, "mlp": MLPConf, "cnn": CNNConf},
    "optim": {"sgd": SGDConf},
    "job": {
        "shuffle_sgd": ShuffleJobConf,
        "elastic_gd": ElasticJobConf,
        "elastic_matmul": ElasticMatmulConf,
    },
    "scheme": {"base": SchemeConf},
    "shuffle": {"policy": ShufflePolicyConf},
}


def register_schemas() -> None:
    """The schemas in Hydra's config store: ``base_config`` for the top level and
    ``<group>/schema_<option>`` for every group option (the YAMLs name them first)."""
    store = ConfigStore.instance()
    store.store(name="base_config", node=Config)
    for group, options in SCHEMAS.items():
        for option, node in options.items():
            store.store(group=group, name=f"schema_{option}", node=node)
