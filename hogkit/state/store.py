"""Named arrays in one POSIX shared-memory segment: the parameters workers update in place.

One :class:`ParamStore` owns one segment ``/dev/shm/hogkit_<ownerpid>_<tag>_<8 hex>``.
The segment starts with a small self-describing header (magic, JSON layout), then every
array at a 64-byte aligned offset (a cache line, so two arrays never share a line).
Dtypes: float32/float64 (parameters) and int32/int64 (data, clocks, logs).

Lifecycle (docs/algorithms.md §4, "one owner per segment"):

* :meth:`ParamStore.create` / :meth:`ParamStore.from_module` make the **owner**. The owner
  reserves the pages with ``os.posix_fallocate`` (a full /dev/shm is a clear
  :class:`~hogkit.errors.ShmCapacityError` naming needed vs free bytes, never a SIGBUS on
  first touch), registers the name with the ``multiprocessing`` resource tracker, and
  unlinks exactly once: on :meth:`close`, on context exit, or at interpreter exit
  (``atexit``), whichever comes first. Dropping the last reference to an owner does *not*
  unlink (views bound into a module may still be in use); the atexit hook does.
* If the owner is SIGKILLed, its atexit hook never runs. The safety net is the resource
  tracker registration the owner keeps: the tracker process sees EOF on its pipe once the
  owner and every spawned child (they inherit the pipe) are gone, and unlinks what is still
  registered (tested in tests/test_store_faults.py). :func:`sweep_dead_segments` is the
  second net for a tracker that was itself killed.
* :meth:`ParamStore.attach` (any process, by handle or by name) maps the segment and
  **never** talks to the resource tracker. Design choice: the segment is opened with
  ``_posixshmem.shm_open`` + ``mmap`` directly instead of
  ``multiprocessing.shared_memory.SharedMemory``, which on Python <= 3.12 registers every
  attach; an attaching process that exits would then unlink the owner's segment, and a
  spawned child (which shares its parent's tracker) calling ``unregister`` would drop the
  owner's own registration. An attacher's :meth:`close` only unmaps.

Concurrency (what is racy and what is not): the store takes no locks. A read of one aligned
float32/float64/int32/int64 element never tears on the platforms hogkit supports (x86-64,
aarch64): it sees the old or the new value. A read of a vector or matrix is *not* a
snapshot: other workers may write some elements while it is being read (Hogwild! accepts
this by design). :meth:`snapshot` and :meth:`save` copy element by element, so they are
consistent only when workers are quiesced; otherwise they are "fuzzy" and the caller
should label them so (with a version vector from :class:`hogkit.state.clocks.Clocks`).

Views stay valid after :meth:`close`: the mapping is released when the last numpy/torch
view of it is garbage collected (unlinking only removes the name).
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import json
import mmap
import os
import re
import secrets
import struct
import time
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from hogkit import procfs
from hogkit.errors import InvalidArgument, InvalidType, ShmCapacityError
from hogkit.validation import check_int

try:  # CPython's own binding of shm_open/shm_unlink (what multiprocessing uses).
    from _posixshmem import shm_open as _shm_open, shm_unlink as _shm_unlink
except ImportError:  # pragma: no cover - other interpreters: Linux maps it to /dev/shm
    def _shm_open(path, flags, mode):
        return os.open(os.path.join(SHM_DIR, path.lstrip("/")), flags | os.O_CLOEXEC, mode)

    def _shm_unlink(path):
        os.unlink(os.path.join(SHM_DIR, path.lstrip("/")))

__all__ = ["ParamStore", "StoreHandle", "bind_module", "module_arrays", "sweep_dead_segments",
           "sweep_segments_of", "SHM_DIR", "ALIGN", "DTYPES"]

SHM_DIR = "/dev/shm"
ALIGN = 64
DTYPES = tuple(np.dtype(d) for d in (np.float32, np.float64, np.int32, np.int64))
PREFIX = "hogkit_"
_MAGIC = b"HOGKIT1\0"
_HDR = struct.Struct("<8sQ")  # magic, length of the JSON layout that follows
_FORMAT = "hogkit.state.store/1"
_TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,31}$")
_SEGMENT_RE = re.compile(r"^hogkit_(\d+)_")


def _align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


# --------------------------------------------------------------------------- handle


@dataclass(frozen=True)
class StoreHandle:
    """What another process needs to attach: small and picklable.

    ``layout`` is a tuple of ``(name, offset, shape, dtype_str)``; ``size`` is the
    segment's byte size; ``owner_pid`` the creating process.
    """

    name: str
    size: int
    layout: tuple
    owner_pid: int


# --------------------------------------------------------------------------- owner registry

# name -> creating pid, for segments this process created and has not unlinked yet. The
# atexit hook unlinks whatever is left, so an owner that forgot close() still cleans up.
# The pid guards against a plain os.fork() child (which inherits this dict and runs
# atexit hooks) unlinking its parent's segments.
_OWNED: dict[str, int] = {}
# name -> an open descriptor of the segment on which the owner holds a shared flock for
# the segment's life: the proof of life a sweep tests (a pid proves nothing across PID
# namespaces that share /dev/shm). The kernel drops the lock when the owner dies.
_LOCKS: dict[str, int] = {}


def _tracker_register(name):
    from multiprocessing import resource_tracker
    resource_tracker.register("/" + name, "shared_memory")


def _tracker_unregister(name):
    from multiprocessing import resource_tracker
    try:
        resource_tracker.unregister("/" + name, "shared_memory")
    except Exception:  # pragma: no cover - tracker gone at interpreter exit
        pass


def _unlink_owned(name):
    """Unlink ``name`` and drop the tracker registration, exactly once per process."""
    pid = _OWNED.pop(name, None)
    if pid != os.getpid():  # not ours (or inherited through fork): leave it
        return False
    try:
        _shm_unlink("/" + name)
    except FileNotFoundError:  # someone (a sweep) removed it already: nothing to do
        pass
    _tracker_unregister(name)
    fd = _LOCKS.pop(name, None)
    if fd is not None:
        os.close(fd)
    return True


@atexit.register
def _unlink_all_owned():
    for name in list(_OWNED):
        _unlink_owned(name)


def _free_bytes():
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:  # pragma: no cover
        return None
    return st.f_bavail * st.f_frsize


def _capacity_error(name, size, cause):
    free = _free_bytes()
    free_s = "an unknown number of" if free is None else f"{free}"
    return ShmCapacityError(
        errno.ENOSPC,
        f"shared memory {SHM_DIR} cannot hold segment {name!r}: needs {size} bytes "
        f"({size / 2**20:.1f} MiB), {free_s} bytes free ({cause}); free space there "
        f"(stale segments: hogkit.state.store.sweep_dead_segments()), enlarge it "
        f"(mount -o remount,size=2G {SHM_DIR}; docker run --shm-size=2g), or use a "
        f"smaller model")


# --------------------------------------------------------------------------- store


def _check_name(name):
    if not isinstance(name, str):
        raise InvalidType(f"array name {name!r} must be a str, got {type(name).__name__}")
    if not name or name.startswith("__hogkit"):
        raise InvalidArgument(f"array name {name!r} must be non-empty and must not start "
                              f"with '__hogkit' (reserved)")
    return name


def _check_dtype(name, dtype):
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise InvalidType(f"array {name!r}: {dtype!r} is not a numpy dtype; use one of "
                          f"float32, float64, int32, int64") from None
    if dt not in DTYPES:
        raise InvalidType(f"array {name!r} has dtype {dt}, which a store cannot hold; "
                          f"supported: float32, float64 (parameters), int32, int64 (data, "
                          f"clocks); convert with .astype(np.float32)")
    return dt


def _check_shape(name, shape):
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)):
        raise InvalidType(f"array {name!r}: shape {shape!r} must be a tuple of ints")
    return tuple(check_int(f"shape of {name!r}", s, min_value=0) for s in shape)


def _plan(arrays):
    """Validate the mapping; return (entries, sources, size) of the segment to make."""
    if not isinstance(arrays, Mapping):
        raise InvalidType(f"arrays must be a mapping of name -> ndarray or (shape, dtype), "
                          f"got {type(arrays).__name__}")
    if not arrays:
        raise InvalidArgument("arrays is empty; a store needs at least one named array, "
                              "e.g. {'w': np.zeros(10, np.float32)}")
    specs, sources = [], {}
    for name, value in arrays.items():
        _check_name(name)
        if isinstance(value, np.ndarray):
            dt = _check_dtype(name, value.dtype)
            shape = value.shape
            sources[name] = value
        elif isinstance(value, tuple) and len(value) == 2:
            shape = _check_shape(name, value[0])
            dt = _check_dtype(name, value[1])
        else:
            raise InvalidType(f"array {name!r} is a {type(value).__name__}; give a numpy "
                              f"array (copied in) or a (shape, dtype) spec (zero-filled), "
                              f"e.g. np.asarray(value) or ((10, 4), np.float32)")
        specs.append((name, tuple(int(s) for s in shape), dt.str))
    return specs, sources


def _layout(name, specs, owner_pid):
    """Offsets after the header; returns (header bytes, entries, size)."""
    # The header's length depends on the offsets, which depend on the header length:
    # iterate to a fixed point (two rounds at most in practice).
    start = ALIGN
    while True:
        entries, off = [], start
        for nm, shape, dt in specs:
            off = _align(off)
            entries.append((nm, off, shape, dt))
            off += int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
        size = max(_align(off), ALIGN)
        body = json.dumps({"format": _FORMAT, "name": name, "owner_pid": owner_pid,
                           "size": size, "arrays": [list(e) for e in entries]},
                          separators=(",", ":")).encode()
        need = _align(_HDR.size + len(body))
        if need <= start:
            return _HDR.pack(_MAGIC, len(body)) + body, tuple(entries), size
        start = need


def _read_header(buf, name):
    if len(buf) < _HDR.size:
        raise InvalidArgument(f"segment {name!r} is too small to be a hogkit store")
    magic, n = _HDR.unpack_from(buf, 0)
    if magic != _MAGIC:
        raise InvalidArgument(f"segment {name!r} is not a hogkit store (bad magic "
                              f"{magic!r}); attach only to names a ParamStore created")
    hdr = json.loads(bytes(buf[_HDR.size:_HDR.size + n]))
    layout = tuple((nm, int(off), tuple(shape), dt) for nm, off, shape, dt in hdr["arrays"])
    return StoreHandle(name=hdr["name"], size=int(hdr["size"]), layout=layout,
                       owner_pid=int(hdr["owner_pid"]))


class ParamStore:
    """Named numpy/torch arrays in one shared-memory segment (see the module docstring).

    Build with :meth:`create`, :meth:`from_module` (owner) or :meth:`attach` (any
    process); never with the constructor. Use as a context manager, or call
    :meth:`close`.
    """

    def __init__(self, _mm, handle, owner):
        self._mm = _mm
        self._handle = handle
        self._owner = owner
        self._closed = False
        self._views = {}
        for nm, off, shape, dt in handle.layout:
            # frombuffer (unlike ndarray(buffer=...)) holds a buffer export on the mmap,
            # so the mapping cannot be closed under a live view (see close()).
            v = np.frombuffer(_mm, dtype=np.dtype(dt), count=int(np.prod(shape, dtype=np.int64)),
                              offset=off).reshape(shape)
            self._views[nm] = v
        self._torch = {}

    # ------------------------------------------------------------------ building

    @classmethod
    def create(cls, arrays, *, tag="params"):
        """Create (and own) a segment holding ``arrays``.

        ``arrays`` maps name -> ndarray (copied in; non-contiguous input is fine) or
        -> ``(shape, dtype)`` (zero-filled). Dtypes: float32, float64, int32, int64;
        zero-size arrays are allowed. ``tag`` (letters, digits, '-') goes into the name
        ``hogkit_<pid>_<tag>_<8 hex>``. Raises ShmCapacityError if /dev/shm is too small
        (nothing is left behind).
        """
        if not isinstance(tag, str) or not _TAG_RE.match(tag):
            raise InvalidArgument(f"tag={tag!r} must be 1-32 letters, digits or '-', "
                                  f"starting with a letter or digit; e.g. tag='params'")
        specs, sources = _plan(arrays)
        pid = os.getpid()
        while True:
            name = f"{PREFIX}{pid}_{tag}_{secrets.token_hex(4)}"
            header, entries, size = _layout(name, specs, pid)
            try:
                fd = _shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR,
                                          0o600)
            except FileExistsError:  # 1 in 4e9: draw another suffix
                continue
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.ENOMEM):
                    raise _capacity_error(name, size, e.strerror) from e
                raise
            break
        # From here the name exists: lock it (the owner's proof of life for any sweep,
        # in any PID namespace) and register it, so a SIGKILL of this process at any
        # later point still leaves the tracker able to unlink it.
        fcntl.flock(fd, fcntl.LOCK_SH)
        _OWNED[name] = pid
        try:
            _tracker_register(name)
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
                    raise _capacity_error(name, size, e.strerror) from e
                if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                # No fallocate on this filesystem: size it and check room by hand.
                free = _free_bytes()
                if free is not None and free < size:
                    raise _capacity_error(name, size, "posix_fallocate unsupported") from e
                os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
        except BaseException:
            _LOCKS[name] = fd
            _unlink_owned(name)
            raise
        _LOCKS[name] = fd          # kept open (and locked) until the owner unlinks
        mm[:len(header)] = header
        handle = StoreHandle(name=name, size=size, layout=entries, owner_pid=pid)
        store = cls(mm, handle, owner=True)
        for nm, src in sources.items():
            np.copyto(store._views[nm], src, casting="no")
        return store

    @classmethod
    def from_module(cls, module, *, tag="params"):
        """Copy a torch module's parameters into a new store and rebind them to it.

        Every parameter (``module.named_parameters()``, names like ``"0.weight"``) gets
        ``p.data = store.torch(name)``: the module now reads and writes shared memory.
        Gradients (``p.grad``) stay private to the process. Parameters must be CPU
        float32/float64.
        """
        arrays = module_arrays(module, "module", copy=False)
        store = cls.create(arrays, tag=tag)
        try:
            store.bind(module)
        except BaseException:
            store.close()
            raise
        return store

    @classmethod
    def attach(cls, handle):
        """Map an existing store by :class:`StoreHandle` or by segment name (str).

        Never registers with the resource tracker, so this process exiting (cleanly or
        not) leaves the segment alone. The owner alone unlinks it. A handle is checked
        against the segment's own header (a stale handle is a clear error).
        """
        if isinstance(handle, StoreHandle):
            name = handle.name
        elif isinstance(handle, str):
            name = handle
        else:
            raise InvalidType(f"attach() takes a StoreHandle (store.handle) or a segment "
                              f"name str, got {type(handle).__name__}")
        name = name.lstrip("/")
        if not name.startswith(PREFIX):
            raise InvalidArgument(f"segment name {name!r} does not start with {PREFIX!r}; "
                                  f"pass store.handle or store.name of a ParamStore")
        try:
            fd = _shm_open("/" + name, os.O_RDWR, 0o600)
        except FileNotFoundError:
            raise InvalidArgument(f"no shared-memory segment {name!r} in {SHM_DIR}: its "
                                  f"owner closed it or exited") from None
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                raise InvalidArgument(f"segment {name!r} is empty (its owner is still "
                                      f"creating it, or it is not a hogkit store)")
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        try:
            found = _read_header(mm, name)
            if isinstance(handle, StoreHandle) and found != handle:
                raise InvalidArgument(f"handle does not match segment {name!r} (layout or "
                                      f"size differ): the handle is stale")
            if found.size > size:
                raise InvalidArgument(f"segment {name!r} is {size} bytes, its header says "
                                      f"{found.size}")
        except BaseException:
            mm.close()
            raise
        return cls(mm, found, owner=False)

    def __reduce__(self):
        raise InvalidType("a ParamStore is not pickled; send store.handle to the other "
                          "process and call ParamStore.attach(handle) there")

    # ------------------------------------------------------------------ views

    @property
    def handle(self) -> StoreHandle:
        """Small picklable :class:`StoreHandle` for :meth:`attach` in another process."""
        return self._handle

    @property
    def name(self) -> str:
        """Segment name (in /dev/shm), without a leading slash."""
        return self._handle.name

    @property
    def names(self) -> tuple:
        """Array names, in layout order."""
        return tuple(e[0] for e in self._handle.layout)

    @property
    def layout(self) -> dict:
        """name -> (offset, shape, dtype)."""
        return {nm: (off, shape, np.dtype(dt)) for nm, off, shape, dt in self._handle.layout}

    @property
    def nbytes(self) -> int:
        """Byte size of the segment (header and padding included)."""
        return self._handle.size

    @property
    def is_owner(self) -> bool:
        return self._owner

    @property
    def closed(self) -> bool:
        return self._closed

    def _view(self, name):
        if self._closed:
            raise InvalidArgument(f"store {self.name!r} is closed; attach again or keep "
                                  f"it open while its arrays are used")
        try:
            return self._views[name]
        except (KeyError, TypeError):
            raise InvalidArgument(f"no array named {name!r} in store {self.name!r}; "
                                  f"it holds {list(self._views)}") from None

    def numpy(self, name) -> np.ndarray:
        """Zero-copy numpy view of array ``name`` (writes go to shared memory)."""
        return self._view(name)

    __getitem__ = numpy

    def __contains__(self, name):
        return name in self._views

    def views(self) -> dict:
        """name -> zero-copy numpy view, for every array."""
        if self._closed:
            self._view(None)
        return dict(self._views)

    def torch(self, name):
        """Zero-copy torch tensor view of array ``name`` (imports torch on first use)."""
        t = self._torch.get(name)
        if t is None or self._closed:
            v = self._view(name)
            t = self._torch[name] = _torch().from_numpy(v)
        return t

    def bind(self, module):
        """Rebind ``module``'s parameters (by name) to this store's views; returns module.

        For a worker: ``ParamStore.attach(handle).bind(model)`` makes the worker's own
        copy of the model read and write the shared parameters. Values are *not* copied
        (the store's values win). Every parameter must exist in the store with the same
        shape and dtype; all are checked before any is rebound (:func:`bind_module`).
        """
        return bind_module(module, self.views(), where=f"store {self.name!r}",
                           tensor=self.torch)

    # ------------------------------------------------------------------ copies, files

    def snapshot(self) -> dict:
        """Private copies of every array. Consistent only if writers are quiesced."""
        return {nm: v.copy() for nm, v in self.views().items()}

    def save(self, path, *, meta=None):
        """Write every array and ``meta`` (a JSON-able dict) to ``path``, atomically
        (:func:`hogkit.state.checkpoint.save`: tmp → fsync → ``os.replace``). Values are
        copied from live memory (see :meth:`snapshot` on consistency)."""
        from hogkit.state import checkpoint
        checkpoint.save(path, self.snapshot(), meta=meta)

    @staticmethod
    def read_file(path):
        """Read a file :meth:`save` wrote: ``(arrays, meta)``
        (:func:`hogkit.state.checkpoint.read`)."""
        from hogkit.state import checkpoint
        return checkpoint.read(path)

    def load(self, path) -> dict:
        """Write the arrays of ``path`` into this store; returns the file's meta. The
        file must hold exactly this store's names, shapes and dtypes; everything is
        checked before anything is written (:func:`hogkit.state.checkpoint.load_into`)."""
        from hogkit.state import checkpoint
        return checkpoint.load_into(self.views(), path, what=f"store {self.name!r}")

    # ------------------------------------------------------------------ closing

    def close(self):
        """Owner: unlink the segment (exactly once) and unmap. Attacher: unmap only.

        Idempotent. Views handed out earlier stay valid until they are garbage collected.
        """
        if self._closed:
            return
        self._closed = True
        if self._owner and self._handle.owner_pid == os.getpid():
            _unlink_owned(self.name)
        self._views = {}
        self._torch = {}
        try:
            self._mm.close()
        except BufferError:
            pass  # views still exported: the mapping goes with the last of them
        self._mm = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        role = "owner" if self._owner else "attached"
        state = ", closed" if self._closed else ""
        return (f"ParamStore({self.name!r}, {role}, {len(self._handle.layout)} arrays, "
                f"{self.nbytes} bytes{state})")


def module_arrays(module, what="module", *, copy=True):
    """``{name: numpy array}`` of a module's parameters (names as
    ``module.named_parameters()``), checked: a ``torch.nn.Module`` with at least one
    parameter, each on the CPU and float32/float64. ``copy=False`` gives zero-copy
    views of the parameters' data."""
    torch = _torch()
    if not isinstance(module, torch.nn.Module):
        raise InvalidType(f"{what} must be a torch.nn.Module, got {type(module).__name__}")
    out = {}
    for name, p in module.named_parameters():
        if p.device.type != "cpu":
            raise InvalidArgument(f"parameter {name!r} of {what} is on {p.device}; hogkit "
                                  f"shares CPU memory only: call module.cpu() first")
        if p.dtype not in (torch.float32, torch.float64):
            raise InvalidType(f"parameter {name!r} of {what} is {p.dtype}; hogkit's rules "
                              f"update float32 or float64: call module.float() first")
        a = p.detach().numpy()
        out[name] = a.copy() if copy else a
    if not out:
        raise InvalidArgument(f"{what} ({type(module).__name__}) has no parameters to "
                              f"share")
    return out


def bind_module(module, arrays, *, where="params", tensor=None):
    """Make ``module``'s parameters zero-copy torch views of ``arrays`` (name -> numpy
    array, names as ``module.named_parameters()``): ``p.data = from_numpy(arrays[name])``.
    Every parameter is checked (present, same shape and dtype) before any is rebound.
    ``tensor(name)`` may supply the view (a store's cached one). Returns ``module``."""
    torch = _torch()
    if not isinstance(module, torch.nn.Module):
        raise InvalidType(f"module must be a torch.nn.Module, got "
                          f"{type(module).__name__}")
    params = dict(module.named_parameters())
    missing = [nm for nm in params if nm not in arrays]
    if missing:
        raise InvalidArgument(f"parameters {missing} of {type(module).__name__} are not "
                              f"in {where} (it holds {sorted(arrays)}); build it from "
                              f"the same architecture (ParamStore.from_module)")
    for nm, p in params.items():
        v = arrays[nm]
        if tuple(p.shape) != v.shape:
            raise InvalidArgument(f"parameter {nm!r} has shape {tuple(p.shape)}, {where} "
                                  f"holds {v.shape}")
        if _torch_dtype_str(p.dtype) != v.dtype.str:
            raise InvalidType(f"parameter {nm!r} has dtype {p.dtype}, {where} holds "
                              f"{v.dtype}; convert the module (module.float()/double())")
    with torch.no_grad():
        for nm, p in params.items():
            p.data = tensor(nm) if tensor is not None else torch.from_numpy(arrays[nm])
    return module


def _torch():
    import torch
    return torch


def _torch_dtype_str(dt):
    torch = _torch()
    return {torch.float32: "<f4", torch.float64: "<f8", torch.int32: "<i4",
            torch.int64: "<i8"}.get(dt, str(dt))


def sweep_dead_segments(*, shm_dir=SHM_DIR) -> list:
    """Remove the ``hogkit_<pid>_*`` segments whose owner is provably gone; returns their
    names.

    Gone means both: no process holds the segment's lock (every owner holds a shared
    ``flock`` on it while it lives; the kernel drops it when the owner dies, in whatever
    PID namespace it ran), and the pid in its name is not alive here. A segment whose
    owner runs in another PID namespace (a container sharing /dev/shm) has a pid that
    means nothing here, but its lock is held: it is kept. A live pid's segment is never
    touched either (a reused pid looks alive: the safe side), nor another user's. The
    lock is taken exclusively before the unlink, so an owner cannot be starting on it.
    ``shm_dir`` exists for tests.
    """
    removed = []
    try:
        entries = os.listdir(shm_dir)
    except FileNotFoundError:
        return removed
    for nm in sorted(entries):
        m = _SEGMENT_RE.match(nm)
        if not m:
            continue
        pid = int(m.group(1))
        if pid == os.getpid() or _pid_alive(pid):
            continue
        if _remove_unlocked(os.path.join(shm_dir, nm)):
            removed.append(nm)
    return removed


def sweep_segments_of(pids, timeout, *, shm_dir=SHM_DIR) -> list:
    """Sweep (:func:`sweep_dead_segments`) until no segment named for one of ``pids`` is
    left, for up to ``timeout`` seconds; returns the names still left.

    For processes just killed (the Ray driver's node actors): a kill returns before its
    process has ended, and a process can look ended before its segments are free. A
    multi-threaded one's first thread shows as a zombie while the others still exit,
    and its open files (the segments' locks) close only with the last one. So this
    waits on what the sweep needs, the segments, not on the pids."""
    pids = {int(p) for p in pids}
    deadline = time.monotonic() + timeout
    while True:
        sweep_dead_segments(shm_dir=shm_dir)
        try:
            entries = os.listdir(shm_dir)
        except FileNotFoundError:
            return []
        left = sorted(nm for nm in entries
                      if (m := _SEGMENT_RE.match(nm)) and int(m.group(1)) in pids)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def _remove_unlocked(path) -> bool:
    """Unlink ``path`` if this user owns it and no process holds its lock."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:               # gone already, or not permitted: leave it
        return False
    try:
        if os.fstat(fd).st_uid != os.getuid():
            return False          # another user's: not ours to judge (or to remove)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:           # held: its owner lives (maybe in another namespace)
            return False
        os.unlink(path)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _pid_alive(pid):
    if pid <= 0:
        return True  # not a real owner pid: leave it alone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is dead for our purpose (its segments are orphans); unreadable: alive
    return procfs.state(pid) != "Z"
