"""hogkit.procfs: the pid helpers the Ray driver's clean-up relies on, against real
processes."""

import subprocess
import sys
import time

from hogkit.procfs import pid_space, wait_gone


def test_wait_gone_returns_the_pids_still_running_and_counts_a_zombie_as_gone():
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    quick = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
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
