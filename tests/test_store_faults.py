"""Store lifecycle under faults, with real outside processes (docs/algorithms.md §4).

* an outside process attaching by name and exiting (without close, via os._exit) leaves
  the segment alone;
* SIGKILL of the owner: the resource tracker the owner registered with unlinks it;
* a spawned child attaching and exiting does not drop the owner's registration (the
  tracker still cleans up after a later SIGKILL of the owner);
* a small /dev/shm (unshare -m + 16 MiB tmpfs): ShmCapacityError naming needed vs free
  bytes, nothing left behind;
* an owner in another PID namespace sharing /dev/shm (unshare -p), whose pid is dead
  here: a sweep from this namespace keeps its segment while it lives.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from hogkit.state.store import ParamStore

HELPER = os.path.join(os.path.dirname(__file__), "helpers", "store_procs.py")
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(
    [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}


def _gone_within(name, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not os.path.exists(f"/dev/shm/{name}"):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.process
@pytest.mark.faults
def test_outside_process_attaching_by_name_and_exiting_leaves_segment():
    with ParamStore.create({"w": np.zeros(4, np.float32)}, tag="faults") as s:
        for expected in (1.0, 2.0):
            out = subprocess.run([sys.executable, HELPER, "attach", s.name], env=ENV,
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            assert float(out.stdout) == expected
            time.sleep(0.2)  # give any (wrongly) registered tracker time to act
            assert os.path.exists(f"/dev/shm/{s.name}")
            assert s["w"][0] == expected
        assert "leaked" not in out.stderr


def _start_owner(*extra):
    p = subprocess.Popen([sys.executable, HELPER, "owner", "1", *extra], env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    name = p.stdout.readline().strip()
    if not name:
        p.kill()
        _, err = p.communicate(timeout=30)
        pytest.fail(f"owner process printed no segment name; stderr:\n{err}")
    assert name.startswith(f"hogkit_{p.pid}_faults_")
    assert os.path.exists(f"/dev/shm/{name}")
    return p, name


@pytest.mark.process
@pytest.mark.faults
def test_sigkill_of_owner_is_cleaned_by_resource_tracker():
    p, name = _start_owner()
    try:
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        assert p.returncode == -signal.SIGKILL
        assert _gone_within(name, 10), f"{name} survived its owner's SIGKILL"
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=30)


@pytest.mark.process
@pytest.mark.faults
def test_spawned_attacher_keeps_owner_registration():
    """The child shares the owner's tracker; had it registered or unregistered, either the
    segment would vanish when it exits, or survive the owner's SIGKILL."""
    p, name = _start_owner("--spawn-attacher")
    try:
        time.sleep(0.3)
        assert os.path.exists(f"/dev/shm/{name}"), "attacher's exit unlinked the segment"
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        assert _gone_within(name, 10), f"{name} survived its owner's SIGKILL"
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=30)


def _can_unshare():
    if not shutil.which("unshare"):
        return False
    r = subprocess.run(["unshare", "-m", "sh", "-c",
                        "mount -t tmpfs -o size=16m tmpfs /dev/shm"],
                       capture_output=True, timeout=30)
    return r.returncode == 0


@pytest.mark.process
@pytest.mark.faults
def test_small_dev_shm_is_a_clear_capacity_error():
    if not _can_unshare():
        pytest.skip("unshare -m + mount tmpfs not permitted here")
    script = (f"mount -t tmpfs -o size=16m tmpfs /dev/shm && "
              f"exec {sys.executable} {HELPER} capacity 32")
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], env=ENV,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    assert rep["small_ok"], "a 1 MiB store should fit in 16 MiB"
    assert rep["errno"] == 28  # ENOSPC
    msg = rep["error"]
    needed = int(re.search(r"needs (\d+) bytes", msg).group(1))
    free = int(re.search(r"(\d+) bytes free", msg).group(1))
    assert needed >= 32 * 2**20 > 16 * 2**20 >= free > 0, msg
    assert rep["left"] == [], rep["left"]
    assert "Traceback" not in r.stderr


def _dead_host_pid():
    """A pid with no process in this namespace, from the top of the pid range."""
    with open("/proc/sys/kernel/pid_max") as f:
        top = int(f.read())
    return next(p for p in range(top - 2, top - 2000, -1) if not os.path.exists(f"/proc/{p}"))


@pytest.mark.process
@pytest.mark.faults
def test_sweep_keeps_a_live_owners_segment_from_another_pid_namespace():
    """The fault an operator met: a job in a container sharing /dev/shm had its segments
    deleted by a run started on the host, whose sweep took the container's pids for
    dead ones. The owner runs in a new PID namespace as a pid that is dead here."""
    if not shutil.which("unshare"):
        pytest.skip("no unshare here")
    pid = _dead_host_pid()
    script = (f"echo {pid - 1} > /proc/sys/kernel/ns_last_pid && "
              f"{{ {sys.executable} {HELPER} owner 1 & wait; }}")
    try:
        p = subprocess.Popen(["unshare", "-pf", "--mount-proc", "sh", "-c", script],
                             env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    except OSError as e:
        pytest.skip(f"unshare -p not permitted here ({e})")
    try:
        line = p.stdout.readline().strip()
        if not line:
            err = p.communicate(timeout=30)[1]
            pytest.skip(f"unshare -p + ns_last_pid not permitted here: {err.strip()[-200:]}")
        assert line.startswith(f"hogkit_{pid}_"), (line, pid)
        assert not os.path.exists(f"/proc/{pid}")      # its pid means nothing here
        from hogkit.state.store import sweep_dead_segments
        assert line not in sweep_dead_segments()
        assert os.path.exists(os.path.join("/dev/shm", line))
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate(timeout=30)
    # the whole group died (its resource tracker too): the lock went with the owner,
    # so now a sweep may remove the segment
    sweep_dead_segments()
    assert not os.path.exists(os.path.join("/dev/shm", line))
