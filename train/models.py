"""Models: logistic regression, a small MLP and a small CNN (for 8x8 digits), plus helpers to
move the parameters as one flat float32 vector and to hash them."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import torch
from torch import nn

from coded_shuffle.errors import UsageError

MODELS = ("logreg", "mlp", "cnn")


def image_side(features: int) -> int:
    """Side of the square image a CNN reads (``features`` must be a perfect square)."""
    side = math.isqrt(features)
    if side * side != features or side < 2:
        raise UsageError(
            f"model cnn needs square images: features={features} is not a square >= 4 "
            "(use model=mlp or model=logreg)"
        )
    return side


def check(cfg: Any, features: int) -> None:
    """Raises :class:`UsageError` for an unknown model or one that does not fit the data."""
    name = str(cfg.name)
    if name not in MODELS:
        raise UsageError(f"model {name!r} unknown; valid: {', '.join(MODELS)}")
    if name == "mlp" and int(cfg.hidden) < 1:
        raise UsageError(f"model.hidden={cfg.hidden} out of range (must be >= 1)")
    if name == "cnn":
        image_side(features)
        if int(cfg.channels) < 1:
            raise UsageError(f"model.channels={cfg.channels} out of range (must be >= 1)")


def build(cfg: Any, features: int, classes: int) -> nn.Module:
    """The configured model (call after seeding torch: every rank builds the same one)."""
    check(cfg, features)
    name = str(cfg.name)
    if name == "logreg":
        return nn.Linear(features, classes)
    if name == "mlp":
        hidden = int(cfg.hidden)
        return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))
    side, ch = image_side(features), int(cfg.channels)
    return nn.Sequential(
        nn.Unflatten(1, (1, side, side)),
        nn.Conv2d(1, ch, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(ch, 2 * ch, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * ch * (side // 2) ** 2, classes),
    )


def flat_params(model: nn.Module) -> torch.Tensor:
    """All parameters as one contiguous float32 vector (``model.parameters()`` order)."""
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().contiguous()


def load_flat(model: nn.Module, flat: torch.Tensor) -> None:
    torch.nn.utils.vector_to_parameters(flat, model.parameters())


def params_sha256(model: nn.Module) -> str:
    """SHA-256 of the parameters' float32 bytes (the bit-identity check across schemes)."""
    return hashlib.sha256(flat_params(model).numpy().tobytes()).hexdigest()


def num_params(model: nn.Module) -> int:
    return int(sum(p.numel() for p in model.parameters()))
