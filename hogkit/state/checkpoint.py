"""Checkpoint files: every array of a store and a JSON ``meta``, written atomically.

Format: an uncompressed ``.npz`` (numpy zip) with one ``<name>.npy`` entry per array
plus a ``__hogkit_meta__`` uint8 entry holding UTF-8 JSON ``{"format", "meta"}``.
:func:`save` writes to a temporary file in the same directory, flushes, fsyncs, then
``os.replace``-s it over the path and fsyncs the directory: a crash at any point leaves
either the old file or the new one, never a torn one. ``ParamStore.save/load/read_file``
are the usual way in; the runtime writes ``checkpoint.npz`` with the run's config,
clocks and counters in ``meta``.
"""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np

from hogkit.errors import CheckpointDamaged, InvalidArgument, InvalidType, OutputFailed

FORMAT = "hogkit.state.store/1"
META_KEY = "__hogkit_meta__"

__all__ = ["save", "read", "load_into"]


def save(path, arrays, *, meta=None):
    """Write ``arrays`` (name -> ndarray) and ``meta`` (a JSON-able dict) to ``path``,
    atomically (see the module docstring)."""
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise InvalidType(f"meta must be a JSON-able dict, got {type(meta).__name__}")
    try:
        blob = json.dumps({"format": FORMAT, "meta": meta}).encode()
    except (TypeError, ValueError) as e:
        raise InvalidType(f"meta is not JSON-able ({e}); keep to dict/list/str/"
                          f"int/float/bool/None") from None
    arrays = dict(arrays)
    arrays[META_KEY] = np.frombuffer(blob, dtype=np.uint8)
    path = os.fspath(path)
    try:
        _save_atomically(path, arrays)
    except OSError as e:              # full disk, folder gone: one line that says which
        raise OutputFailed.writing(path, e) from None


def _save_atomically(path, arrays):
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(path) + ".",
                               suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            _write_npz(f, arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dfd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def read(path):
    """Read a file :func:`save` wrote: returns ``(arrays, meta)``. A plain ``.npz``
    without hogkit metadata reads with ``meta == {}``."""
    path = os.fspath(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise
    except Exception as e:
        raise CheckpointDamaged(f"{path!r} is not a readable hogkit checkpoint (.npz): "
                                f"{type(e).__name__}: {e}; resume from another run "
                                f"folder, or start afresh") from None
    blob = arrays.pop(META_KEY, None)
    meta = {}
    if blob is not None:
        try:
            meta = json.loads(blob.tobytes().decode())["meta"]
        except Exception as e:
            raise CheckpointDamaged(f"{path!r}: metadata entry is corrupt ({e}); resume "
                                    f"from another run folder, or start afresh") from None
    return arrays, meta


def load_into(views, path, *, what="the store"):
    """Copy the arrays of ``path`` into ``views`` (name -> ndarray); returns the meta.
    The file must hold exactly these names, shapes and dtypes; everything is checked
    before anything is written."""
    arrays, meta = read(path)
    missing = sorted(set(views) - set(arrays))
    extra = sorted(set(arrays) - set(views))
    if missing or extra:
        raise InvalidArgument(f"{os.fspath(path)!r} does not match {what}: missing "
                              f"{missing}, unexpected {extra}; load a checkpoint saved "
                              f"from a store with the same arrays")
    for nm, v in views.items():
        a = arrays[nm]
        if a.shape != v.shape:
            raise InvalidArgument(f"{os.fspath(path)!r}: array {nm!r} has shape {a.shape}, "
                                  f"{what} holds {v.shape}")
        if a.dtype != v.dtype:
            raise InvalidType(f"{os.fspath(path)!r}: array {nm!r} has dtype {a.dtype}, "
                              f"{what} holds {v.dtype}")
    for nm, v in views.items():
        np.copyto(v, arrays[nm])
    return meta


def _write_npz(f, arrays):
    """The one write of :func:`save`; a seam tests replace to simulate a crash mid-write.

    Writes the .npz layout (an uncompressed zip of ``<name>.npy`` members) directly:
    ``np.savez(f, **arrays)`` breaks on arrays named ``file`` or ``allow_pickle``
    (its own parameters), which are valid store names.
    """
    import zipfile
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, a in arrays.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(a), allow_pickle=False)
