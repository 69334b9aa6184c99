"""hogkit.procfs: the pid space the Ray driver's clean-up relies on, against a real
process, the doctor's choice of two cores, and the spawned children the fault tests
and the soak kill."""

import os
import subprocess
import sys

from hogkit.procfs import _cpu_list, pid_space, spawned, two_cores


def test_a_child_on_this_machine_reports_the_same_pid_space():
    out = subprocess.run([sys.executable, "-c",
                          "from hogkit.procfs import pid_space; print(pid_space())"],
                         capture_output=True, text=True, check=True).stdout.strip()
    here = pid_space()
    assert out == here and here.count("/") >= 1 and "pid:[" in here


def test_two_cores_picks_cpus_on_different_physical_cores():
    assert _cpu_list("0-1,8-9\n") == {0, 1, 8, 9} and _cpu_list("3") == {3}
    assert two_cores({5}) == [5] and two_cores(set()) == []
    usable = os.sched_getaffinity(0)
    got = two_cores(usable)
    assert len(got) == min(2, len(usable)) and set(got) <= usable
    if len(got) == 2:
        path = f"/sys/devices/system/cpu/cpu{got[0]}/topology/thread_siblings_list"
        try:
            with open(path) as f:
                siblings = _cpu_list(f.read())
        except OSError:
            siblings = {got[0]}
        if not usable <= siblings:                  # a core of its own was there
            assert got[1] not in siblings


def test_spawned_lists_a_spawn_child_and_not_a_plain_one():
    import multiprocessing as mp
    import time
    ctx = mp.get_context("spawn")
    child = ctx.Process(target=time.sleep, args=(30,), daemon=True)
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    child.start()
    try:
        deadline = time.monotonic() + 30
        while child.pid not in spawned(os.getpid()) and time.monotonic() < deadline:
            time.sleep(0.05)
        got = spawned(os.getpid())
        assert child.pid in got and plain.pid not in got
    finally:
        child.kill()
        plain.kill()
        child.join()
        plain.wait()
    assert child.pid not in spawned(os.getpid())
