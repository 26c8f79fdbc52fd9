"""Where the suite's CPU goes: the JSON lines of ``pytest --cpu-report FILE`` (tests/conftest.py)
summed by file, and the costliest tests (docs/testing.md, "Where the time goes").

    pytest --cpu-report cpu.jsonl && python scripts/suite_cpu.py cpu.jsonl
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def cpu(test: dict) -> float:
    """A test's CPU seconds: its worker's and the child processes' it waited for."""
    return test["own"] + test["children"]


def name(nodeid: str) -> str:
    return f"`{nodeid.removeprefix('tests/')}`"


def file_table(tests: list[dict], rows: int) -> list[str]:
    """The costliest files: tests, CPU seconds, share of the suite's CPU, wall seconds."""
    by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for t in tests:
        row = by_file[t["test"].split("::")[0]]
        row[0], row[1], row[2] = row[0] + cpu(t), row[1] + t["wall"], row[2] + 1
    total = sum(cpu(t) for t in tests)
    lines = ["| file | tests | CPU s | share | wall s |", "|---|---:|---:|---:|---:|"]
    for file, (seconds, wall, count) in sorted(by_file.items(), key=lambda kv: -kv[1][0])[:rows]:
        lines.append(
            f"| {name(file)} | {count} | {seconds:.1f} | {seconds / total:.1%} | {wall:.1f} |"
        )
    return lines


def test_table(tests: list[dict], rows: int) -> list[str]:
    """The costliest tests: CPU seconds and wall seconds."""
    lines = ["| test | CPU s | wall s |", "|---|---:|---:|"]
    for t in sorted(tests, key=lambda t: -cpu(t))[:rows]:
        lines.append(f"| {name(t['test'])} | {cpu(t):.1f} | {t['wall']:.1f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="the file --cpu-report wrote")
    parser.add_argument("--top", type=int, default=15, help="costliest tests listed (15)")
    parser.add_argument("--files", type=int, default=12, help="costliest files listed (12)")
    args = parser.parse_args()
    if not args.report.is_file():
        parser.error(f"{args.report}: no such file (pytest --cpu-report {args.report} writes it)")
    tests = [json.loads(line) for line in args.report.read_text().splitlines() if line]
    total, wall = sum(cpu(t) for t in tests), sum(t["wall"] for t in tests)
    print(f"{len(tests)} tests, {total:.0f} s of CPU, {wall:.0f} s of wall (summed over tests)\n")
    print("\n".join(file_table(tests, args.files)) + "\n")
    print("\n".join(test_table(tests, args.top)))


if __name__ == "__main__":
    main()
