"""docs/layout.md names every file of the folders it lists file by file, so a new file gets its line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LISTED = ("runner", "profiler", "harness")  # folders whose bullet in "The rest" names each file


def section(text: str, folder: str) -> str:
    """The top-level bullet `- \\`folder/\\`: ...` with its sub-bullets, up to the next top-level bullet."""
    start = text.index(f"- `{folder}/`:")
    rest = text[start + 1 :]
    ends = [i for i in (rest.find("\n- "), rest.find("\n## ")) if i >= 0]
    return text[start : start + 1 + min(ends)] if ends else text[start:]


@pytest.mark.parametrize("folder", LISTED)
def test_layout_names_every_file_of(folder):
    text = section((ROOT / "docs" / "layout.md").read_text(), folder)
    files = sorted(
        f.relative_to(ROOT / folder).as_posix()
        for f in (ROOT / folder).rglob("*")
        if f.is_file() and "__pycache__" not in f.parts and f.suffix in {".py", ".c", ".cc", ".h", ".json"}
    )
    assert len(files) >= 4  # a folder that holds none would be a typo in LISTED
    missing = [f for f in files if f"`{f}`" not in text]
    assert not missing, f"docs/layout.md's {folder}/ bullet does not name {missing}"


def walk_files(text: str) -> list[str]:
    """The files a walk names (`path/to/file.py` or `.cc`), each once, in the order the walk opens them."""
    seen: list[str] = []
    for name in re.findall(r"`([\w/]+\.(?:py|cc))`", text):
        if name not in seen:
            seen.append(name)
    return seen


def test_the_walk_of_one_batch_counts_the_files_it_names_and_each_exists():
    """The table under the walk says how many files a newcomer opens; it is counted from the walk itself."""
    text = (ROOT / "docs" / "layout.md").read_text()
    walk = text[text.index("## The walk of one batch") : text.index("### What a newcomer opens")]
    tf = walk_files(walk[walk.index("TensorFlow:") : walk.index("PyTorch:")])
    torch = walk_files(walk[walk.index("PyTorch:") :])
    # PyTorch's steps say "the same producers as TensorFlow's step 3" and "the same report": TensorFlow's files.
    shared = [f for f in tf if f.startswith(("producers/", "wire/")) or f in REPORT]
    torch += [f for f in shared if f not in torch]
    assert [f for f in tf + torch if not (ROOT / f).is_file()] == []
    table = text[text.index("### What a newcomer opens") :]
    for name, files in (("TensorFlow", tf), ("PyTorch", torch)):
        row = re.search(rf"^\| {name} \| (\d+)", table, re.M)
        assert row and int(row.group(1)) == len(files), (name, len(files), files)


REPORT = ("profiler/report.py", "profiler/verdict.py", "profiler/attribution.py")
