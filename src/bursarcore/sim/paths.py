"""The command line's output paths, checked before any work is done: a directory to write
files into (``--out``) and a file to write (``--journal``). Checking changes nothing; a
path that breaks a rule raises :class:`~bursarcore.errors.InvalidArgument` naming the
option and the rule."""

from __future__ import annotations

import os

from ..errors import InvalidArgument

__all__ = ["check_output_dir", "check_output_file"]


def _nearest_existing(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def check_output_dir(path: str | os.PathLike, field: str = "--out") -> str:
    """``path`` if it is a directory this process may write into, or one it may create
    (its nearest existing ancestor is a writable directory)."""
    s = os.fspath(path)
    if not s:
        raise InvalidArgument(field, "must be a directory path", s)
    if os.path.exists(s):
        if not os.path.isdir(s):
            raise InvalidArgument(field, "is an existing file, not a directory", s)
        if not os.access(s, os.W_OK | os.X_OK):
            raise InvalidArgument(field, "is a directory this user cannot write into", s)
        return s
    anc = _nearest_existing(s)
    if not os.path.isdir(anc):
        raise InvalidArgument(field, f"cannot be created: {anc} is a file, not a directory", s)
    if not os.access(anc, os.W_OK | os.X_OK):
        raise InvalidArgument(field, f"cannot be created: {anc} is not writable", s)
    return s


def check_output_file(path: str | os.PathLike, field: str) -> str:
    """``path`` if it names a file this process may write (replacing it if it exists): not
    a directory, in an existing directory it may write into."""
    s = os.fspath(path)
    if not s:
        raise InvalidArgument(field, "must be a file path", s)
    if os.path.isdir(s):
        raise InvalidArgument(field, "is a directory, not a file", s)
    parent = os.path.dirname(os.path.abspath(s))
    if not os.path.isdir(parent):
        raise InvalidArgument(field, f"is in {parent}, which is not an existing directory", s)
    if os.path.exists(s) and not os.access(s, os.W_OK):
        raise InvalidArgument(field, "is a file this user cannot write", s)
    if not os.path.exists(s) and not os.access(parent, os.W_OK | os.X_OK):
        raise InvalidArgument(field, f"is in {parent}, which this user cannot write into", s)
    return s
