"""Atomic replacement of a saved-model directory: temporary sibling, fsync, swap."""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
import secrets
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

from ppmix.io.schema import CONFIG_FILE, FORMAT_NAME, TENSOR_FILE

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------ saving
def check_save_target(path: str | Path) -> Path:
    """Check that :func:`save_model` may write to ``path``; returns the directory it will replace or create.

    ``path`` may be new, an empty directory, or a directory holding only a previous ppmix save
    (``config.json`` + ``tensors.pt``). Call it before a long fit to fail early.

    Raises
    ------
    FileExistsError
        If ``path`` is a file, or a directory holding other files (they are never clobbered).
    ValueError
        If ``path`` is the current working directory or contains it (replacing it would pull the
        directory from under the running process).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> check_save_target(d / "model") == (d / "model").resolve()
    True
    >>> (d / "notes.txt").write_text("mine")
    4
    >>> check_save_target(d)
    Traceback (most recent call last):
    ...
    FileExistsError: cannot save to ...: the directory holds files that are not a ppmix save (notes.txt); ...
    """
    given = Path(path)
    target = given.resolve()
    if target.exists() and not target.is_dir():
        raise FileExistsError(f"cannot save to {given}: it is a file, not a directory; choose a directory path")
    if target.is_dir():
        entries = sorted(os.listdir(target))
        if entries and not _is_previous_save(target, entries):
            shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
            raise FileExistsError(
                f"cannot save to {given}: the directory holds files that are not a ppmix save ({shown}); "
                "save into a new or empty directory"
            )
        cwd = Path.cwd().resolve()
        if target == cwd or target in cwd.parents:
            raise ValueError(
                f"cannot save to {given}: it is (or contains) the current working directory, which an atomic "
                "save would replace; save into a subdirectory"
            )
    return target


def _is_previous_save(directory: Path, entries: list[str]) -> bool:
    """Whether ``directory`` holds only a previous ppmix save (its ``config.json`` is a ppmix config)."""
    if not set(entries) <= {CONFIG_FILE, TENSOR_FILE} or CONFIG_FILE not in entries:
        return False
    if any(not (directory / name).is_file() or (directory / name).is_symlink() for name in entries):
        return False
    try:
        config = json.loads((directory / CONFIG_FILE).read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(config, dict) and config.get("format") == FORMAT_NAME


def _fsync_dir(path: Path) -> None:
    if os.name != "posix":  # directories cannot be opened for fsync on Windows
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@lru_cache(maxsize=1)
def _renameat2() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap the directories ``a`` and ``b`` (Linux ``renameat2(RENAME_EXCHANGE)``).

    Returns ``False``, having changed nothing, where the platform or file system cannot swap.
    """
    fn = _renameat2()
    if fn is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), os.fspath(b))


#: characters of the target's name kept in its temporary sibling's name (which must stay a legal name)
_NAME_KEPT = 24


def _temp_name(target: Path) -> Path:
    """A fresh name ``.{name}.tmp-XXXXXXXXXXXXXXXX`` beside ``target``, ``name`` cut to a few characters so that
    a target of any legal name length has a legal temporary name."""
    return target.with_name(f".{target.name[:_NAME_KEPT]}.tmp-{secrets.token_hex(8)}")


def _aside(tmp: Path) -> Path:
    """Where two renames put the previous save while the new one takes its place."""
    return tmp.with_name(tmp.name + ".old")


def being_replaced(target: Path) -> bool:
    """Whether a save is between its two renames at ``target`` (the previous save is aside, nothing at
    ``target`` yet): then a reader waits a moment instead of reporting the model missing."""
    prefix = f".{target.name[:_NAME_KEPT]}.tmp-"
    try:
        return any(n.startswith(prefix) and n.endswith(".old") for n in os.listdir(target.parent))
    except OSError:
        return False


def _clean_up(tmp: Path, target: Path, new: os.stat_result | None) -> None:
    """Discard what a save leaves beside ``target``: ``tmp`` (the new files after a failure, the previous save
    after a swap) and, once the new save (the directory ``new``) is at ``target``, the previous save that two
    renames moved aside. Runs to its end even if interrupted (``KeyboardInterrupt``), then re-raises."""
    interrupted: BaseException | None = None
    while True:
        try:
            try:
                now = os.stat(target)
                installed = new is not None and (now.st_dev, now.st_ino) == (new.st_dev, new.st_ino)
            except OSError:
                installed = False
            _discard(tmp)
            if installed:
                _discard(_aside(tmp))
            break
        except BaseException as err:  # a Ctrl-C during the clean-up: finish it, then raise it
            interrupted = interrupted or err
    if interrupted is not None:
        raise interrupted


def _install(tmp: Path, target: Path) -> None:
    """Put the complete save in ``tmp`` at ``target``.

    What was at ``target`` ends in ``tmp`` (after a swap) or in ``_aside(tmp)`` (after two renames), for
    :func:`_clean_up` to discard. On failure ``target`` is as it was (or the error names where the
    previous save was kept).
    """
    if not os.path.lexists(target):
        os.replace(tmp, target)
        return
    if _exchange(tmp, target):  # one atomic swap: target holds the new save, tmp the previous one
        previous = tmp

        def undo() -> None:
            if not _exchange(tmp, target):
                raise OSError(errno.EIO, "could not swap back", os.fspath(target))

    else:  # two renames; between them nothing is at target, and a failure puts the previous save back
        previous = _aside(tmp)
        try:
            os.replace(target, previous)
            os.replace(tmp, target)
        except BaseException:  # a failure or a Ctrl-C after the first rename: the previous save goes back
            if os.path.lexists(previous) and not os.path.lexists(target):
                _restore(previous, target)
            raise

        def undo() -> None:
            os.replace(target, tmp)
            os.replace(previous, target)

    # files that appeared in the target between the check and the swap are never discarded: swap back
    foreign = sorted(set(os.listdir(previous)) - {CONFIG_FILE, TENSOR_FILE})
    if foreign:
        try:
            undo()
        except OSError as err:
            raise OSError(
                f"cannot save to {target}: files that are not a ppmix save appeared in it during the save "
                f"and could not be moved back; they are kept in {previous}"
            ) from err
        raise FileExistsError(
            f"cannot save to {target}: files that are not a ppmix save appeared in it during the save "
            f"({', '.join(foreign[:5])}); nothing was replaced"
        )


def _restore(previous: Path, target: Path) -> None:
    try:
        os.replace(previous, target)
    except OSError as err:
        raise OSError(
            f"saving to {target} failed and the previous model could not be moved back: it is kept in {previous}"
        ) from err


def _discard(directory: Path) -> None:
    """Remove a temporary save directory: only the two files a save writes, then the directory (never raises)."""
    if not directory.is_dir() or directory.is_symlink():
        return
    for name in (CONFIG_FILE, TENSOR_FILE):
        try:
            (directory / name).unlink(missing_ok=True)
        except OSError:
            pass
    try:
        directory.rmdir()
    except OSError:
        logger.warning("kept %s: it holds files a ppmix save did not write (%s)", directory, os.listdir(directory))
