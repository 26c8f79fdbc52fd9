"""Small image data sets the tests define (no download), as a user's own ``Dataset`` classes:
``data=dataset data.dataset._target_=tests.image_sets.TinyImages``."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset


class TinyImages(Dataset):
    """``n`` uint8 images ``(3, side, side)`` of ``classes`` classes (a bright square whose
    corner is the class, plus noise) and a Python int label, from ``seed``.

    The knobs that make bad items, for the error tests: ``vary_at`` (that item's image is one
    pixel wider), ``float_label_at`` (that item's label is 0.5), ``dict_items`` (items are
    ``{"image", "label"}`` dicts; ``extra_key`` adds a second input)."""

    def __init__(
        self,
        n: int = 240,
        side: int = 8,
        classes: int = 4,
        seed: int = 0,
        vary_at: int | None = None,
        float_label_at: int | None = None,
        dict_items: bool = False,
        extra_key: bool = False,
    ) -> None:
        if n < 0:
            raise ValueError(f"n={n} must be >= 0")
        rng = np.random.default_rng(seed)
        self.labels = rng.integers(0, classes, n)
        images = rng.integers(0, 96, (n, 3, side, side), dtype=np.uint8)
        half = side // 2
        for c in range(classes):
            r, col = divmod(c % 4, 2)
            rows, cols = slice(r * half, (r + 1) * half), slice(col * half, (col + 1) * half)
            images[self.labels == c, :, rows, cols] += 150
        self.images = torch.from_numpy(images)
        self.vary_at, self.float_label_at = vary_at, float_label_at
        self.dict_items, self.extra_key = dict_items, extra_key

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        image = self.images[i]
        if i == self.vary_at:
            image = torch.zeros((3, image.shape[1], image.shape[2] + 1), dtype=torch.uint8)
        label = 0.5 if i == self.float_label_at else int(self.labels[i])
        if self.dict_items:
            item = {"image": image, "label": torch.tensor(label)}
            if self.extra_key:
                item["mask"] = torch.ones(2)
            return item
        return image, label
