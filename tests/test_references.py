"""References a reader can follow: the code and the docs cite the papers by author and year
(listed in docs/references.md) and the repository's own documents, never a document the
repository does not hold."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# how earlier text named documents that are not in the repository
OUTSIDE = re.compile(
    r"seed ?`?0\d\d|seeds?/|\bdesign (section|notes?|\d)|interfaces(\.md|:)|"
    r"coded-shuffling\.md|(?<!docs/)(?<!\()architecture\.md|shared/design",
    re.IGNORECASE,
)
CITED = re.compile(r"(Attia & Tandon|Elmahdy & Mohajer|Yang et al\.) (\d{4})")
DOC_PATH = re.compile(
    r"(?<![\w/])(?:docs|coded_shuffle|coded_shuffle_train|scripts|tests|examples)/[\w./-]+"
    r"\.(?:md|py|yaml)\b"
)


def texts() -> list[Path]:
    keep = {".py", ".md", ".yaml", ".toml"}
    skip = {".venv", ".git", "outputs", "runs", "multirun", "__pycache__"}
    return sorted(
        p
        for p in REPO.rglob("*")
        if p.is_file() and p.suffix in keep and not skip & set(p.relative_to(REPO).parts)
    )


def test_no_reference_to_a_document_outside_the_repository():
    found = []
    for path in texts():
        if path == Path(__file__):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


def test_every_cited_paper_is_listed_and_every_named_file_exists():
    listed = (REPO / "docs" / "references.md").read_text()
    cited, paths = set(), set()
    for path in texts():
        text = path.read_text()
        cited |= {f"{a} {y}" for a, y in CITED.findall(text)}
        paths |= set(DOC_PATH.findall(text))
    assert len(cited) >= 4, cited
    for paper in sorted(cited):
        assert f"**{paper}**" in listed, f"{paper} is cited but not in docs/references.md"
    for doc in sorted(paths):
        assert (REPO / doc).is_file(), f"{doc} is named but does not exist (moved?)"
