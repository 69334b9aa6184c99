"""ParamStore: layout, views, attach across spawn, torch, save/load, bad input."""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
import pickle

import numpy as np
import pytest

from hogkit.errors import CheckpointDamaged, InvalidArgument, InvalidType, ShmCapacityError
from hogkit.state.store import (ALIGN, ParamStore, StoreHandle, sweep_dead_segments,
                                sweep_segments_of)
import hogkit.state.store as store_mod
from hogkit.state import checkpoint
from helpers import store_procs

SPAWN = mp.get_context("spawn")


def _run(target, *args):
    p = SPAWN.Process(target=target, args=args)
    p.start()
    p.join(60)
    assert p.exitcode == 0, f"child exited with {p.exitcode}"


@pytest.fixture
def store():
    with ParamStore.create({"w": np.arange(12, dtype=np.float32).reshape(3, 4),
                            "b": np.ones(5, np.float64),
                            "idx": np.array([3, 1, 2], np.int64),
                            "c": ((2, 2), np.int32)}, tag="test") as s:
        yield s


# ----------------------------------------------------------------------- layout, views

def test_create_copies_in_and_zero_fills(store):
    assert store.names == ("w", "b", "idx", "c")
    np.testing.assert_array_equal(store["w"], np.arange(12).reshape(3, 4))
    np.testing.assert_array_equal(store.numpy("b"), np.ones(5))
    assert store["idx"].dtype == np.int64 and store["idx"].tolist() == [3, 1, 2]
    assert store["c"].dtype == np.int32 and not store["c"].any()
    assert store.is_owner and not store.closed


def test_layout_is_64_byte_aligned_and_disjoint(store):
    lay = store.layout
    spans = []
    for name, (off, shape, dt) in lay.items():
        assert off % ALIGN == 0, name
        assert store[name].ctypes.data % ALIGN == 0
        spans.append((off, off + int(np.prod(shape)) * dt.itemsize))
        assert store[name].shape == shape and store[name].dtype == dt
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert spans[-1][1] <= store.nbytes
    assert store.name.startswith(f"hogkit_{os.getpid()}_test_")
    assert os.path.exists(f"/dev/shm/{store.name}")


def test_views_are_zero_copy(store):
    store["w"][1, 2] = -7
    assert store.views()["w"][1, 2] == -7
    other = ParamStore.attach(store.handle)
    try:
        assert other["w"][1, 2] == -7
        other["b"][:] = 3.5
        assert store["b"].tolist() == [3.5] * 5
        assert not other.is_owner
    finally:
        other.close()
    assert os.path.exists(f"/dev/shm/{store.name}")  # attacher close does not unlink


def test_attach_by_name_reads_the_header(store):
    other = ParamStore.attach(store.name)
    try:
        assert other.handle == store.handle
        assert other.layout == store.layout
    finally:
        other.close()


def test_non_contiguous_input_and_zero_size_arrays():
    src = np.arange(20, dtype=np.float64).reshape(4, 5)[:, ::2]
    with ParamStore.create({"nc": src, "empty": np.zeros((0, 3), np.float32),
                            "e2": ((0,), np.int64), "scalar": np.array(2.5, np.float32)}) as s:
        np.testing.assert_array_equal(s["nc"], src)
        assert s["nc"].flags.c_contiguous
        assert s["empty"].shape == (0, 3) and s["e2"].shape == (0,)
        assert s["scalar"].shape == () and s["scalar"] == 2.5
        snap = s.snapshot()
        assert snap["empty"].shape == (0, 3)


def test_only_zero_size_arrays():
    with ParamStore.create({"e": ((0,), np.float32)}) as s:
        assert s["e"].size == 0 and s.nbytes >= ALIGN


def test_handle_is_small_and_picklable(store):
    h = pickle.loads(pickle.dumps(store.handle))
    assert isinstance(h, StoreHandle) and h == store.handle
    assert len(pickle.dumps(store.handle)) < 1024
    with pytest.raises(TypeError, match="store.handle"):
        pickle.dumps(store)


def test_snapshot_is_private(store):
    snap = store.snapshot()
    snap["w"][:] = 99
    assert store["w"][0, 0] == 0


@pytest.mark.process
def test_attach_across_spawn_child_writes_parent_sees(store):
    _run(store_procs.child_write, store.handle, "b", 42.0)
    assert store["b"].tolist() == [42.0] * 5
    assert os.path.exists(f"/dev/shm/{store.name}")  # child exit did not unlink


# ----------------------------------------------------------------------- lifecycle

def test_close_unlinks_exactly_once_and_is_idempotent():
    s = ParamStore.create({"w": np.zeros(3, np.float32)})
    name = s.name
    v = s["w"]
    s.close()
    s.close()
    assert not os.path.exists(f"/dev/shm/{name}")
    assert s.closed
    v[0] = 1.0  # a view handed out earlier keeps the mapping alive
    assert v[0] == 1.0
    with pytest.raises(InvalidArgument, match="closed"):
        s["w"]
    with pytest.raises(InvalidArgument, match="closed"):
        s.views()
    assert name not in store_mod._OWNED


def test_atexit_hook_unlinks_forgotten_stores():
    s = ParamStore.create({"w": np.zeros(3, np.float32)})
    name = s.name
    store_mod._unlink_all_owned()  # what atexit runs
    assert not os.path.exists(f"/dev/shm/{name}")
    s.close()  # still fine afterwards: nothing left to unlink


def test_attach_errors(store):
    with pytest.raises(InvalidArgument, match="no shared-memory segment"):
        ParamStore.attach("hogkit_1_nothere_00000000")
    with pytest.raises(InvalidArgument, match="does not start with"):
        ParamStore.attach("psm_abc")
    with pytest.raises(InvalidType):
        ParamStore.attach(42)
    stale = StoreHandle(store.name, store.nbytes, (("w", 64, (1,), "<f4"),), os.getpid())
    with pytest.raises(InvalidArgument, match="stale"):
        ParamStore.attach(stale)


def test_capacity_error_is_clear_and_leaves_nothing(monkeypatch):
    def no_room(fd, off, size):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "posix_fallocate", no_room)
    before = set(os.listdir("/dev/shm"))
    with pytest.raises(ShmCapacityError) as ei:
        ParamStore.create({"w": ((1000,), np.float64)}, tag="full")
    msg = str(ei.value)
    assert "needs" in msg and "free" in msg and "bytes" in msg and "--shm-size" in msg
    assert isinstance(ei.value, OSError) and ei.value.errno == errno.ENOSPC
    assert set(os.listdir("/dev/shm")) == before
    assert not [n for n in store_mod._OWNED if "_full_" in n]


# ----------------------------------------------------------------------- bad input

@pytest.mark.parametrize("arrays, exc, match", [
    ({}, InvalidArgument, "empty"),
    ([("w", np.zeros(2))], InvalidType, "mapping"),
    ({"w": np.zeros(2, np.float16)}, InvalidType, "float16"),
    ({"w": np.zeros(2, np.complex64)}, InvalidType, "complex64"),
    ({"w": np.array(["a"])}, InvalidType, "cannot hold"),
    ({"w": [1.0, 2.0]}, InvalidType, "np.asarray"),
    ({"w": ((2,), "not-a-dtype")}, InvalidType, "dtype"),
    ({"w": ((-1,), np.float32)}, InvalidArgument, ">= 0"),
    ({"w": ((2.5,), np.float32)}, InvalidType, "int"),
    ({"": np.zeros(2, np.float32)}, InvalidArgument, "non-empty"),
    ({"__hogkit_meta__": np.zeros(2, np.float32)}, InvalidArgument, "reserved"),
    ({3: np.zeros(2, np.float32)}, InvalidType, "str"),
])
def test_bad_arrays(arrays, exc, match):
    with pytest.raises(exc, match=match):
        ParamStore.create(arrays)


@pytest.mark.parametrize("tag", ["", "a_b", "x" * 40, "bad/tag", 3])
def test_bad_tag(tag):
    with pytest.raises(InvalidArgument, match="tag"):
        ParamStore.create({"w": np.zeros(2, np.float32)}, tag=tag)


def test_unknown_name(store):
    with pytest.raises(InvalidArgument, match="no array named 'nope'.*holds") as ei:
        store["nope"]
    assert isinstance(ei.value, ValueError)
    with pytest.raises(InvalidArgument, match="no array named"):
        store.torch("nope")
    assert "w" in store and "nope" not in store


# ----------------------------------------------------------------------- save / load

def test_save_load_round_trip(store, tmp_path):
    store["w"][:] = 1.5
    path = tmp_path / "ckpt.npz"
    store.save(path, meta={"step": 7, "note": "quiesced"})
    arrays, meta = ParamStore.read_file(path)
    assert meta == {"step": 7, "note": "quiesced"}
    assert set(arrays) == set(store.names)
    store["w"][:] = 0
    store["idx"][:] = 0
    assert store.load(path) == meta
    assert (store["w"] == 1.5).all() and store["idx"].tolist() == [3, 1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.npz"]  # no temp file left


def test_crash_mid_save_leaves_old_file_intact(store, tmp_path, monkeypatch):
    path = tmp_path / "ckpt.npz"
    store.save(path, meta={"v": 1})
    old = path.read_bytes()

    def torn_write(f, arrays):
        f.write(b"PK\x03\x04 half a zip")
        raise OSError(errno.EIO, "disk went away")
    monkeypatch.setattr(checkpoint, "_write_npz", torn_write)
    store["w"][:] = 9
    with pytest.raises(OSError, match="disk went away"):
        store.save(path, meta={"v": 2})
    assert path.read_bytes() == old
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.npz"]
    assert ParamStore.read_file(path)[1] == {"v": 1}


def test_load_validates_before_writing(store, tmp_path):
    small = tmp_path / "small.npz"
    with ParamStore.create({"w": np.zeros((3, 4), np.float32)}) as other:
        other.save(small)
    store["w"][:] = 5
    with pytest.raises(InvalidArgument, match=r"missing \['b', 'c', 'idx'\]"):
        store.load(small)
    assert (store["w"] == 5).all()  # nothing written
    full = tmp_path / "full.npz"
    store.save(full)
    specs = {"w": ((3, 4), np.float32), "b": ((5,), np.float64),
             "idx": ((3,), np.int64), "c": ((2, 2), np.int32)}
    with ParamStore.create({**specs, "w": ((4, 3), np.float32)}) as other:
        with pytest.raises(InvalidArgument, match=r"shape \(3, 4\).*\(4, 3\)"):
            other.load(full)
        assert not other["b"].any()
    with ParamStore.create({**specs, "w": ((3, 4), np.float64)}) as other:
        with pytest.raises(InvalidType, match="dtype float32"):
            other.load(full)
    with ParamStore.create({**specs, "extra": ((1,), np.int64)}) as other:
        with pytest.raises(InvalidArgument, match=r"missing \['extra'\]"):
            other.load(full)


def test_read_file_errors(tmp_path, store):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(CheckpointDamaged, match="not a readable"):
        ParamStore.read_file(bad)
    with pytest.raises(FileNotFoundError):
        ParamStore.read_file(tmp_path / "missing.npz")
    with pytest.raises(InvalidType, match="JSON"):
        store.save(tmp_path / "x.npz", meta={"f": object()})
    with pytest.raises(InvalidType, match="dict"):
        store.save(tmp_path / "x.npz", meta=[1])
    assert not list(tmp_path.glob("*.tmp"))
    plain = tmp_path / "plain.npz"
    np.savez(plain, w=np.zeros(2))
    arrays, meta = ParamStore.read_file(plain)
    assert meta == {} and list(arrays) == ["w"]


# ----------------------------------------------------------------------- torch

def test_torch_view_shares_memory(store):
    t = store.torch("w")
    t[0, 0] = 123.0
    assert store["w"][0, 0] == 123.0
    store["w"][2, 3] = -1.0
    assert float(t[2, 3]) == -1.0
    assert t.data_ptr() == store["w"].ctypes.data
    assert store.torch("w") is t  # cached


def test_from_module_round_trip():
    import torch
    torch.manual_seed(0)
    model = store_procs.make_module()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with ParamStore.from_module(model, tag="mod") as s:
        assert set(s.names) == set(before)
        for n, p in model.named_parameters():
            np.testing.assert_array_equal(s[n], before[n].numpy())
            assert p.data_ptr() == s[n].ctypes.data and p.requires_grad
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        w = s["0.weight"]
        assert not np.allclose(w, before["0.weight"].numpy())  # store sees training
        g = model[0].weight.grad
        assert g is not None and g.data_ptr() != w.ctypes.data  # grads stay private


def test_from_module_errors():
    import torch
    with pytest.raises(InvalidArgument, match="no parameters"):
        ParamStore.from_module(torch.nn.Tanh())
    with pytest.raises(InvalidType, match="float16"):
        ParamStore.from_module(torch.nn.Linear(2, 2).half())
    with pytest.raises(InvalidType, match="torch.nn.Module"):
        ParamStore.from_module(np.zeros(3))


def test_bind_checks_everything_first():
    import torch
    with ParamStore.create({"weight": np.zeros((2, 3), np.float32)}) as s:
        lin = torch.nn.Linear(3, 2)
        with pytest.raises(InvalidArgument, match=r"\['bias'\]"):
            s.bind(lin)
        assert lin.weight.data_ptr() != s["weight"].ctypes.data  # untouched
        s2 = torch.nn.Linear(3, 2, bias=False)
        s.bind(s2)
        assert s2.weight.data_ptr() == s["weight"].ctypes.data
        with pytest.raises(InvalidArgument, match="shape"):
            s.bind(torch.nn.Linear(2, 3, bias=False))
        with pytest.raises(InvalidType, match="dtype"):
            s.bind(torch.nn.Linear(3, 2, bias=False).double())


@pytest.mark.process
def test_bind_in_another_process_trains_the_shared_module():
    import torch
    torch.manual_seed(1)
    model = store_procs.make_module()
    with ParamStore.from_module(model, tag="mod") as s:
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        _run(store_procs.child_bind_train, s.handle, 2)
        for n, p in model.named_parameters():  # the parent's module sees the child's step
            assert not torch.equal(p.detach(), before[n]), n


# ----------------------------------------------------------------------- sweep

def test_sweep_removes_only_dead_owners(tmp_path):
    p = SPAWN.Process(target=os.getpid)
    p.start()
    p.join()
    dead = p.pid
    p.close()
    names = [f"hogkit_{dead}_params_deadbeef", f"hogkit_{os.getpid()}_params_0000aaaa",
             f"hogkit_{os.getppid()}_data_0000bbbb", "psm_other", "hogkit_nopid"]
    for n in names:
        (tmp_path / n).write_bytes(b"x")
    removed = sweep_dead_segments(shm_dir=str(tmp_path))
    assert removed == [f"hogkit_{dead}_params_deadbeef"]
    assert sorted(os.listdir(tmp_path)) == sorted(names[1:])
    assert sweep_dead_segments(shm_dir=str(tmp_path / "none")) == []


def test_sweep_keeps_a_dead_pids_segment_whose_lock_is_held(tmp_path):
    """A pid means nothing across PID namespaces: a segment whose owner holds its lock
    is kept even when the pid in its name is dead here; once the lock is released (the
    owner died), it goes."""
    import fcntl
    p = SPAWN.Process(target=os.getpid)
    p.start()
    p.join()
    dead = p.pid
    p.close()
    path = tmp_path / f"hogkit_{dead}_params_0123abcd"
    path.write_bytes(b"x")
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        assert sweep_dead_segments(shm_dir=str(tmp_path)) == []
        assert path.exists()
    finally:
        os.close(fd)
    assert sweep_dead_segments(shm_dir=str(tmp_path)) == [path.name]
    assert not path.exists()


def test_sweep_of_killed_owners_waits_for_their_locks_to_go(tmp_path):
    """What the Ray driver does after killing its actors: their pids may be dead while
    their segments' locks are still held (a multi-threaded process's last threads still
    exiting); the sweep goes on until the segments named for those pids are gone, and
    names those left when its time runs out. Others' segments are not waited on."""
    import fcntl
    import threading
    dead = []
    for _ in range(2):
        p = SPAWN.Process(target=os.getpid)
        p.start()
        p.join()
        dead.append(p.pid)
        p.close()
    held = tmp_path / f"hogkit_{dead[0]}_params_0123abcd"
    other = tmp_path / f"hogkit_{dead[1]}_data_4567cdef"
    for path in (held, other):
        path.write_bytes(b"x")
    fd = os.open(held, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    try:
        assert sweep_segments_of(dead[:1], 0.2, shm_dir=str(tmp_path)) == [held.name]
        assert not other.exists()         # swept on the way: its owner is gone
    finally:
        releaser = threading.Timer(0.3, os.close, (fd,))
        releaser.start()
    assert sweep_segments_of(dead[:1], 30, shm_dir=str(tmp_path)) == []
    assert not held.exists() and not releaser.is_alive()
    mine = tmp_path / f"hogkit_{os.getpid()}_ctl_89abcdef"     # a live owner: kept
    mine.write_bytes(b"x")
    assert sweep_segments_of([], 30, shm_dir=str(tmp_path)) == [] and mine.exists()
    assert sweep_segments_of([dead[0]], 1, shm_dir=str(tmp_path / "none")) == []


def test_owner_holds_its_segments_lock_until_close():
    import fcntl
    s = ParamStore.create({"w": np.zeros(4, np.float32)}, tag="lock")
    path = os.path.join("/dev/shm", s.name)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        s.close()
        assert not os.path.exists(path)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # released with the unlink
    finally:
        os.close(fd)


@pytest.mark.process
def test_forked_child_exit_hook_does_not_unlink_parents_segment():
    with ParamStore.create({"w": np.zeros(2, np.float32)}, tag="fork") as s:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            try:
                store_mod._unlink_all_owned()  # what the child's atexit would run
                s.close()                      # an inherited owner object
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert os.path.exists(f"/dev/shm/{s.name}")
        assert s.name in store_mod._OWNED


def test_save_load_arrays_named_like_savez_parameters(tmp_path):
    """np.savez(f, **arrays) breaks on 'file' and swallows 'allow_pickle'."""
    arrays = {"file": np.arange(3, dtype=np.float32), "allow_pickle": np.ones(2)}
    with ParamStore.create(arrays) as store:
        store.save(tmp_path / "c.npz", meta={"k": 1})
        got, meta = ParamStore.read_file(tmp_path / "c.npz")
        assert set(got) == {"file", "allow_pickle"} and meta == {"k": 1}
        np.testing.assert_array_equal(got["file"], arrays["file"])
        store["file"][:] = 0
        assert store.load(tmp_path / "c.npz") == {"k": 1}
        np.testing.assert_array_equal(store["file"], arrays["file"])
