"""The cluster tasks' preloaded library comes only from a folder and a file of this user that no one else can write."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from runner.bind_host import library_name

ROOT = Path(__file__).resolve().parent.parent


def library_in(cache: Path) -> subprocess.CompletedProcess:
    """runner.bind_host.library() in a process of its own whose cache is under `cache`."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    code = "from runner.bind_host import library\nfrom core.errors import FeedbenchError\n"
    code += "try:\n    print(library())\nexcept FeedbenchError as e:\n    raise SystemExit(f'error: {e}')\n"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def planted(folder: Path) -> Path:
    """A 'library' at the name the shim is built under, as another user would put it there in advance."""
    folder.mkdir(parents=True, exist_ok=True)
    lib = folder / library_name()
    lib.write_bytes(b"not the shim")
    return lib


def test_a_folder_of_this_user_gets_the_shim_built(tmp_path) -> None:
    out = library_in(tmp_path)
    assert out.returncode == 0, out.stderr
    lib = Path(out.stdout.strip())
    assert lib.parent == tmp_path / "feedbench" and lib.read_bytes().startswith(b"\x7fELF")


@pytest.mark.skipif(os.geteuid() != 0, reason="a folder of another user needs root to make")
def test_a_folder_of_another_user_is_refused(tmp_path) -> None:
    lib = planted(tmp_path / "feedbench")
    nobody = pwd.getpwnam("nobody").pw_uid
    os.chown(lib.parent, nobody, -1)
    out = library_in(tmp_path)
    assert out.returncode != 0 and out.stdout == "", out.stdout
    assert out.stderr.strip() == (
        f"error: the cache folder {lib.parent} belongs to uid {nobody}, not to this user (uid 0): "
        "refusing to preload a library from it into the cluster's tasks"
    )
    os.chown(lib.parent, 0, -1)
    os.chown(lib, nobody, -1)  # the folder is ours, the library is not
    out = library_in(tmp_path)
    assert f"the library {lib} belongs to uid {nobody}" in out.stderr and out.stdout == ""


def test_a_folder_others_can_write_is_refused(tmp_path) -> None:
    lib = planted(tmp_path / "feedbench")
    lib.parent.chmod(0o777)
    out = library_in(tmp_path)
    assert out.returncode != 0 and out.stdout == "", out.stdout
    assert f"the cache folder {lib.parent} is writable by others (mode 777)" in out.stderr
