"""Shared fixtures: every test must leave no hogkit segment in /dev/shm and no
orphan worker process behind, and hypothesis runs a CI profile with deadline=None."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", deadline=None, max_examples=40, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=100)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

SHM_DIR = "/dev/shm"


def hogkit_segments():
    try:
        return sorted(n for n in os.listdir(SHM_DIR) if n.startswith("hogkit_"))
    except FileNotFoundError:  # pragma: no cover - not Linux
        return []


def _children():
    """Live child processes of this test process (psutil-free: read /proc)."""
    me = os.getpid()
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, ppid = fields[0], int(fields[1])
        if ppid == me and state != "Z":
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                cmd = ""
            # The multiprocessing resource tracker is shared by design and lives
            # as long as this interpreter; it is not a worker.
            if "resource_tracker" in cmd or "forkserver" in cmd:
                continue
            out.append((int(pid), cmd.strip()))
    return out


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
