"""Store lifecycle under faults, with real outside processes (docs/algorithms.md §4).

* an outside process attaching by name and exiting (without close, via os._exit) leaves
  the segment alone;
* SIGKILL of the owner: the resource tracker the owner registered with unlinks it;
* a spawned child attaching and exiting does not drop the owner's registration (the
  tracker still cleans up after a later SIGKILL of the owner);
* a small /dev/shm (unshare -m + 16 MiB tmpfs): ShmCapacityError naming needed vs free
  bytes, nothing left behind.
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
