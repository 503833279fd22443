"""docs/layout.md names every file of the folders it lists file by file, so a new file gets its line."""

from __future__ import annotations

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
