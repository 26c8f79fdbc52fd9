"""Where the elastic loops write their records and checkpoints: in memory, or as JSON lines
and a pickle beside the run."""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


class Sink(Protocol):
    def write(self, record: dict[str, Any]) -> None: ...

    def truncate(self, keep: Callable[[dict[str, Any]], bool]) -> None: ...


@dataclass
class ListSink:
    records: list[dict[str, Any]] = field(default_factory=list)

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def truncate(self, keep: Callable[[dict[str, Any]], bool]) -> None:
        self.records = [r for r in self.records if keep(r)]


@dataclass
class JsonlSink:
    """``metrics.jsonl``: one JSON object per line, flushed after every step."""

    path: Path

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def truncate(self, keep: Callable[[dict[str, Any]], bool]) -> None:
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:  # blank, or cut short by a kill mid-write
                continue
            if keep(record):
                kept.append(line)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(ln + "\n" for ln in kept))
        os.replace(tmp, self.path)


class Checkpoint(Protocol):
    def save(self, state: dict[str, Any]) -> None: ...

    def load(self) -> dict[str, Any] | None: ...


@dataclass
class MemoryCheckpoint:
    state: dict[str, Any] | None = None

    def save(self, state: dict[str, Any]) -> None:
        self.state = pickle.loads(pickle.dumps(state))

    def load(self) -> dict[str, Any] | None:
        return None if self.state is None else pickle.loads(pickle.dumps(self.state))


@dataclass
class FileCheckpoint:
    """The master's checkpoint file, replaced atomically after every step."""

    path: Path

    def save(self, state: dict[str, Any]) -> None:
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            pickle.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def load(self) -> dict[str, Any] | None:
        try:
            with open(self.path, "rb") as f:
                return pickle.load(f)
        except FileNotFoundError:
            return None
