"""Models: logistic regression, a small MLP and a small CNN (for 8x8 digits), plus helpers to
move the parameters as one flat float32 vector and to hash them."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import torch
from torch import nn

from coded_shuffle.errors import UsageError

from .config import ModelConf

MODELS = ("logreg", "mlp", "cnn")


def image_shape(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """``(channels, height, width)`` of the images a CNN reads: inputs of shape ``(C, H, W)``,
    ``(H, W)``, or ``(d,)`` with ``d`` a perfect square (one channel)."""
    if len(shape) == 1:
        side = math.isqrt(shape[0])
        if side * side != shape[0] or side < 2:
            raise UsageError(
                f"model cnn needs square images: features={shape[0]} is not a square >= 4 "
                "(use model=mlp or model=logreg)"
            )
        return 1, side, side
    if len(shape) not in (2, 3) or min(shape[-2:]) < 2:
        raise UsageError(
            f"model cnn needs images (C, H, W) or (H, W) with H, W >= 2; inputs have shape "
            f"{shape} (use model=mlp or model=logreg)"
        )
    return (1, *shape) if len(shape) == 2 else shape  # type: ignore[return-value]


def logreg(features: int, classes: int, name: str = "logreg", **_: Any) -> nn.Module:
    """Multinomial logistic regression (``model=logreg``)."""
    return nn.Linear(features, classes)


def mlp(features: int, classes: int, hidden: int = 64, name: str = "mlp", **_: Any) -> nn.Module:
    """One hidden layer with ReLU (``model=mlp``)."""
    if hidden < 1:
        raise UsageError(f"model.hidden={hidden} out of range (must be >= 1)")
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def cnn(
    features: int,
    classes: int,
    channels: int = 8,
    name: str = "cnn",
    shape: tuple[int, ...] | None = None,
) -> nn.Module:
    """Two 3x3 convolutions, 2x2 max-pool, linear (``model=cnn``), on flat rows of images of
    ``shape`` (:func:`image_shape`; default: square one-channel images of ``features``)."""
    c, h, w = image_shape(tuple(shape) if shape else (features,))
    if channels < 1:
        raise UsageError(f"model.channels={channels} out of range (must be >= 1)")
    return nn.Sequential(
        nn.Unflatten(1, (c, h, w)),
        nn.Conv2d(c, channels, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(channels, 2 * channels, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * channels * (h // 2) * (w // 2), classes),
    )


def build(cfg: ModelConf, shape: tuple[int, ...] | int, classes: int) -> nn.Module:
    """The configured model for inputs of ``shape`` (read as flat rows of ``prod(shape)``
    features), built by Hydra's ``instantiate`` from ``model._target_`` (call after seeding
    torch: every rank builds the same one). ``name`` is passed along: the builders take it so
    that the config can carry the name ``summary.json`` reports."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
    features = math.prod(shape)
    if str(cfg._target_).rpartition(".")[2] not in MODELS:
        raise UsageError(f"model {cfg.name!r} unknown; valid: {', '.join(MODELS)}")
    try:
        return instantiate(cfg, features=features, classes=classes, shape=shape)
    except InstantiationException as exc:  # the builder's own error, without Hydra's wrapping
        if isinstance(exc.__cause__, UsageError):
            raise exc.__cause__ from None
        raise


def check(cfg: ModelConf, shape: tuple[int, ...] | int) -> None:
    """Raises :class:`UsageError` for a model that does not fit the data (a trial build)."""
    build(cfg, shape, 2)


def flat_params(model: nn.Module) -> torch.Tensor:
    """All parameters as one contiguous float32 vector (``model.parameters()`` order)."""
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().contiguous()


def load_flat(model: nn.Module, flat: torch.Tensor) -> None:
    torch.nn.utils.vector_to_parameters(flat, model.parameters())


def params_sha256(model: nn.Module) -> str:
    """SHA-256 of the parameters' float32 bytes (the bit-identity check across schemes)."""
    return hashlib.sha256(flat_params(model).cpu().numpy().tobytes()).hexdigest()


def num_params(model: nn.Module) -> int:
    return int(sum(p.numel() for p in model.parameters()))
