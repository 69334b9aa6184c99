"""Shared fixtures: every test must leave no hogkit segment in /dev/shm and no
orphan worker process behind, and hypothesis runs a CI profile with deadline=None."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, settings

from helpers.procs import children

settings.register_profile(
    "ci", deadline=None, max_examples=40, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=100)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

SHM_DIR = "/dev/shm"


def hogkit_segments():
    """This test process's hogkit segments (``hogkit_<pid>_...``): another process's
    (a benchmark, a second test run) are none of this check's business."""
    mine = f"hogkit_{os.getpid()}_"
    try:
        return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(mine))
    except FileNotFoundError:  # pragma: no cover - not Linux
        return []


#: processes of the session's Ray instance (the ``ray_cluster`` fixture): shared by
#: design, like the resource tracker
_SHARED = set()


def _children():
    """Live child processes of this test process, less the shared helpers."""
    # The multiprocessing resource tracker is shared by design and lives as long as
    # this interpreter; it is not a worker.
    return [(pid, cmd) for pid, cmd in children(os.getpid())
            if "resource_tracker" not in cmd and "forkserver" not in cmd
            and pid not in _SHARED]


def pytest_collection_modifyitems(config, items):
    """Tests marked ``ray`` run last: the session's Ray instance (its raylet, GCS and
    workers) then lives only while they run, not beside every later test."""
    items.sort(key=lambda item: item.get_closest_marker("ray") is not None)


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray instance for every test marked ``ray`` (``-m "not ray"`` skips
    them). The tests' helpers are importable in its actors (PYTHONPATH)."""
    ray = pytest.importorskip("ray", reason='the ray extra: pip install -e ".[ray]"')
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             configure_logging=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    _SHARED.update(pid for pid, _ in children(os.getpid()))
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(autouse=True)
def no_leaks():
    """Fail the test if it leaves a hogkit_* segment or a live child process."""
    before = set(hogkit_segments())
    yield
    deadline = time.monotonic() + 5.0
    while True:
        leaked = sorted(set(hogkit_segments()) - before)
        orphans = _children()
        if not leaked and not orphans:
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for name in leaked:  # clean up so one leak does not fail every later test
        try:
            os.unlink(os.path.join(SHM_DIR, name))
        except OSError:
            pass
    for pid, _ in orphans:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    msg = []
    if leaked:
        msg.append(f"leaked shared-memory segments: {leaked}")
    if orphans:
        msg.append(f"orphan child processes: {orphans}")
    pytest.fail("; ".join(msg))
