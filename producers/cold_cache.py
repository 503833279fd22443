"""`--cold-cache`: drop a dataset's files from the page cache, so a run reads them from storage.

A decode figure measured on files the kernel already holds in memory leaves
out the storage reads a first epoch (or a dataset larger than memory) pays.
`drop_pages` asks the kernel to forget each file's cached pages
(`posix_fadvise(POSIX_FADV_DONTNEED)`); the files are opened read-only and
left unchanged. Dirty pages are written back first; pages of a file some process has
mapped stay; `resident_share` tells how much of a set is still in memory
(`mincore`), so a report can say how cold the run really was.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterable
from pathlib import Path

_PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def drop_pages(paths: Iterable[str | Path], unreadable: list[str] | None = None) -> int:
    """Drop the cached pages of each file; the bytes they hold in all. A file that cannot be opened (missing,
    unreadable) is skipped, its path added to `unreadable`: its reader skips and counts it too."""
    total = 0
    for path in paths:
        fd = _open_quietly(path)
        if fd is None:
            if unreadable is not None:
                unreadable.append(str(path))
            continue
        try:
            total += os.fstat(fd).st_size
            os.fdatasync(fd)  # pages not yet written back (a freshly made dataset) cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return total


def _open_quietly(path: str | Path) -> int | None:
    """A read-only descriptor that leaves the access time alone where it may; None where it cannot be opened."""
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_NOATIME", 0))
    except PermissionError:  # O_NOATIME needs the file's owner; or the file is unreadable
        pass
    except OSError:
        return None
    try:
        return os.open(path, os.O_RDONLY)
    except OSError:
        return None


def _resident(path: str | Path) -> tuple[int, int]:
    """(pages in the page cache, pages) of one file: mincore over a read-only mapping that touches nothing."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return 0, 0
        pages = (size + _PAGE - 1) // _PAGE
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"cannot map {path}")
        try:
            vec = ctypes.create_string_buffer(pages)
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore on {path}")
            return sum(b & 1 for b in vec.raw[:pages]), pages
        finally:
            _libc.munmap(addr, size)


def resident_share(paths: Iterable[str | Path]) -> float:
    """The share of the files' pages that are in the page cache now (0.0 to 1.0); files that cannot be read
    do not count."""
    cached = total = 0
    for path in paths:
        try:
            c, t = _resident(path)
        except OSError:
            continue
        cached, total = cached + c, total + t
    return cached / total if total else 0.0
