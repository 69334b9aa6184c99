"""hogkit.procfs: the pid helpers the Ray driver's clean-up relies on, against real
processes."""

import os
import subprocess
import sys
import time

from hogkit.procfs import _cpu_list, pid_space, two_cores, wait_gone


def test_wait_gone_returns_the_pids_still_running_and_counts_a_zombie_as_gone():
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    quick = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        assert wait_gone([quick.pid], 60) == []     # ended (a zombie: not reaped yet)
        t0 = time.monotonic()
        assert wait_gone([slow.pid, quick.pid], 0.3) == [slow.pid]
        assert time.monotonic() - t0 >= 0.3        # it waited for the running one
        slow.kill()                                 # not reaped: a zombie until wait()
        assert wait_gone([slow.pid, quick.pid], 30) == []
        assert slow.poll() is not None              # and it is reaped only now
    finally:
        slow.kill()
        slow.wait()
        quick.wait()
    assert wait_gone([], 5) == []


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
