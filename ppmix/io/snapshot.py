"""Reading one consistent version of a saved-model directory while another process may save over it.

A save replaces the whole directory at once (:mod:`ppmix.io.atomic`), never a file inside it, so
the two files of one version are the two files of one directory *inode*. Opening the directory
once and both files through that handle (``openat``: ``os.open(name, dir_fd=...)``) gives the
files of one version even if a new save takes the path a moment later: the open descriptors keep
the old files readable after they are discarded. Only when the save swaps and discards the opened
directory between opening it and opening its files does a file vanish; then the directory now at
the path is opened again (a bounded number of times). Where the atomic swap is unavailable (not
Linux), a save replaces the directory by two renames, between which nothing is at the path; a
reader that finds the previous save set aside then waits for the new one instead of reporting the
model missing.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import time
from pathlib import Path
from typing import BinaryIO

from ppmix.io.atomic import being_replaced
from ppmix.io.schema import CONFIG_FILE, TENSOR_FILE

__all__ = ["SavedFiles", "open_saved"]

#: how many times a directory replaced while it is opened is opened again before giving up
MAX_REOPENS = 50
#: how long a reader waits for a save that is between its two renames (no atomic swap) to put the new directory in place
RENAMES_WAIT_S = 5.0
_HAS_DIR_FD = os.open in os.supports_dir_fd and hasattr(os, "O_DIRECTORY")


@dataclasses.dataclass
class SavedFiles:
    """The two files of one version of a save: ``config.json``'s bytes and ``tensors.pt`` open for reading.

    Use it as a context manager (it closes the tensor file).
    """

    config_path: Path
    tensor_path: Path
    config: bytes
    tensors: BinaryIO

    def __enter__(self) -> SavedFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.tensors.close()


def _missing(path: Path, name: str) -> FileNotFoundError:
    return FileNotFoundError(f"{path / name} not found: path must be a directory written by save()")


def _replaced(path: Path, dir_fd: int) -> bool:
    """Whether the directory now at ``path`` is another one than the open ``dir_fd`` (a save swapped it)."""
    try:
        now = os.stat(path)
    except OSError:
        return True
    opened = os.fstat(dir_fd)
    return (now.st_dev, now.st_ino) != (opened.st_dev, opened.st_ino)


def _open_files(path: Path, dir_fd: int | None) -> dict[str, int]:
    """Descriptors of both files (relative to ``dir_fd`` where given); a missing one raises ``FileNotFoundError``."""
    fds: dict[str, int] = {}
    try:
        for name in (CONFIG_FILE, TENSOR_FILE):
            try:
                if dir_fd is None:
                    fds[name] = os.open(path / name, os.O_RDONLY)
                else:
                    fds[name] = os.open(name, os.O_RDONLY, dir_fd=dir_fd)
            except (FileNotFoundError, NotADirectoryError):
                raise _missing(path, name) from None
            if not stat.S_ISREG(os.fstat(fds[name]).st_mode):
                raise _missing(path, name)
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise
    return fds


def _open_version(path: Path) -> dict[str, int]:
    if not _HAS_DIR_FD:  # Windows: no directory handles, and no directory can be renamed while a file in it is open
        return _open_files(path, None)
    reopens, deadline = 0, time.monotonic() + RENAMES_WAIT_S
    while True:
        try:
            dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except (FileNotFoundError, NotADirectoryError):
            if being_replaced(path) and time.monotonic() < deadline:  # a save between its two renames
                time.sleep(0.001)
                continue
            raise _missing(path, CONFIG_FILE) from None
        try:
            return _open_files(path, dir_fd)
        except FileNotFoundError:
            reopens += 1
            if not _replaced(path, dir_fd):
                raise
            if reopens >= MAX_REOPENS:
                raise OSError(
                    f"{path} was replaced by new saves {reopens} times while it was being opened; load it again"
                ) from None
        finally:
            os.close(dir_fd)


def open_saved(path: str | Path) -> SavedFiles:
    """Open both files of the save at ``path``, of one version even while another process saves over it.

    Raises
    ------
    FileNotFoundError
        If ``path`` is not a directory or lacks either file (the file is named).

    Examples
    --------
    >>> import tempfile, torch
    >>> from ppmix import GMM
    >>> gmm = GMM(2, seed=0, progress=False).fit(torch.randn(50, 2, generator=torch.Generator().manual_seed(0)))
    >>> with open_saved(gmm.save(tempfile.mkdtemp())) as files:
    ...     files.config.startswith(b"{")
    True
    """
    path = Path(path)
    fds = _open_version(path)
    try:
        with os.fdopen(fds.pop(CONFIG_FILE), "rb") as fh:
            config = fh.read()
    except BaseException:
        os.close(fds[TENSOR_FILE])
        raise
    return SavedFiles(path / CONFIG_FILE, path / TENSOR_FILE, config, os.fdopen(fds[TENSOR_FILE], "rb"))
