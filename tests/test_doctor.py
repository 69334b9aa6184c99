"""``hogkit doctor`` and the preflight that ``train`` runs: real limits, real
processes (a lowered open-file limit is set in a child with ``resource.setrlimit``)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

import pytest

from hogkit import doctor
from hogkit.errors import EnvironmentProblem


def _hogkit(args, *, nofile=None, env=None, cwd=None):
    def limit():
        if nofile is not None:
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))
    return subprocess.run([sys.executable, "-m", "hogkit.cli", *args], capture_output=True,
                          text=True, timeout=120, preexec_fn=limit, env=env, cwd=cwd)


def test_every_check_says_one_line_and_passes_here():
    findings = doctor.run_checks(workers=2, with_smoke=False)
    names = [f.check for f in findings]
    assert names == ["platform", "shared memory", "open files", "processes", "cores", "threads",
                     "start method", "torch", "numba cache", "core to core"]
    assert all(f.status in (doctor.OK, doctor.WARN) for f in findings), findings
    text = doctor.format_findings(findings)
    assert len(text.splitlines()) == len(findings)


def test_shared_memory_against_the_planned_size(tmp_path):
    free = doctor.shared_memory(needed_bytes=1).status
    assert free == doctor.OK
    too_big = doctor.shared_memory(needed_bytes=1 << 60)
    assert too_big.status == doctor.FATAL and "needs" in too_big.detail
    missing = doctor.shared_memory(path=str(tmp_path / "nope"))
    assert missing.status == doctor.FATAL and "does not exist" in missing.detail


def test_the_planned_size_counts_parameters_data_and_every_workers_state():
    from hogkit import SGD, workloads
    wl = workloads.get("mf", preset="hot")
    params, data = wl.build(0)
    model = sum(a.nbytes for a in params.values())
    base = sum(a.nbytes for a in {**params, **data}.values())
    plain = doctor.planned_bytes(wl, 4)
    assert base < plain < base + 2**20                   # + streams, cursors, control
    momentum = doctor.planned_bytes(wl, 4, rule=SGD(lr=0.1, momentum=0.9))
    assert momentum - plain == 4 * model                 # one momentum per worker


def test_doctor_prints_the_planned_size_of_a_workload():
    r = _hogkit(["doctor", "--no-smoke", "--workload", "mf", "-o", "preset=hot"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the run needs" in next(x for x in r.stdout.splitlines() if "shared memory" in x)
    r = _hogkit(["doctor", "--no-smoke", "-o", "preset=hot"])
    assert r.returncode == 2 and "needs --workload" in r.stderr


def test_oversubscription_is_a_warning_not_an_error():
    f = doctor.cores(workers=10_000)
    assert f.status == doctor.WARN and "hogkit sim" in f.fix


def test_an_unwritable_numba_cache_is_flagged(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(ro))
    try:
        f = doctor.numba_cache()
    finally:
        ro.chmod(0o700)
    if os.geteuid() == 0:                   # root writes anywhere: nothing to flag
        assert f.status == doctor.OK
    else:
        assert f.status == doctor.WARN and "NUMBA_CACHE_DIR" in f.fix


def test_preflight_raises_every_fatal_problem(monkeypatch):
    from hogkit.engine import preflight
    monkeypatch.setattr(preflight, "files_needed", lambda workers: 1 << 40)
    with pytest.raises(EnvironmentProblem, match="open files: limit .* need about"):
        preflight.preflight(2)
    assert doctor.preflight is preflight.preflight        # the doctor runs the same checks


@pytest.mark.process
def test_run_refuses_up_front_under_a_tiny_file_limit(tmp_path):
    """With 40 open files allowed (2 workers need ~80), ``hogkit run`` stops before
    building anything: exit 1, one line naming the limit and the fix, no results
    folder, no segment; ``hogkit doctor`` flags the same and exits 1."""
    out = tmp_path / "run"
    r = _hogkit(["run", "--seconds", "1", "--out", str(out)], nofile=40)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "open files" in lines[0] and "ulimit -n" in lines[0]
    assert not out.exists()
    d = _hogkit(["doctor", "--no-smoke"], nofile=40)
    assert d.returncode == 1
    assert any(line.startswith("fatal") and "open files" in line
               for line in d.stdout.splitlines())


@pytest.mark.slow
@pytest.mark.process
def test_doctor_with_its_smoke_run_exits_0_here():
    r = _hogkit(["doctor"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1].startswith("ok    smoke run")


@pytest.mark.process
@pytest.mark.faults
def test_doctor_flags_a_16_mib_dev_shm():
    """Under ``unshare -m`` with a 16 MiB tmpfs on /dev/shm (skipped where not
    permitted): the shared-memory line is a warning that names the fix."""
    import shutil
    if not shutil.which("unshare"):
        pytest.skip("no unshare here")
    probe = subprocess.run(["unshare", "-m", "sh", "-c",
                            "mount -t tmpfs -o size=16m tmpfs /dev/shm"],
                           capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip("unshare -m + mount tmpfs not permitted here")
    script = (f"mount -t tmpfs -o size=16m tmpfs /dev/shm && "
              f"exec {sys.executable} -m hogkit.cli doctor --no-smoke")
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr          # a warning is not fatal
    line = next(x for x in r.stdout.splitlines() if "shared memory" in x)
    assert line.startswith("warn") and "16.0 MiB" in line and "--shm-size" in line
    # a planned run that does not fit is fatal (exit 1), with its size
    script = (f"mount -t tmpfs -o size=16m tmpfs /dev/shm && exec {sys.executable} -m "
              f"hogkit.cli doctor --no-smoke --workload mf -o preset=large")
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    line = next(x for x in r.stdout.splitlines() if "shared memory" in x)
    assert line.startswith("fatal") and "the run needs" in line
    # and `hogkit run` refuses it with exit 1, one line, before anything is built (the
    # workload's planned_bytes) or compiled
    script = (f"mount -t tmpfs -o size=16m tmpfs /dev/shm && exec {sys.executable} -m "
              f"hogkit.cli run --workload mf -o preset=large --seconds 5")
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "shared memory" in r.stderr and "the run needs" in r.stderr, r.stderr
    assert "compiling" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "building" not in r.stderr, r.stderr


def test_a_live_run_off_linux_is_refused_in_one_line(monkeypatch):
    """macOS has no /dev/shm, posix_fallocate nor PR_SET_PDEATHSIG: the run must say
    so up front (it died on os.posix_fallocate with an AttributeError)."""
    import sys

    import pytest

    from hogkit.engine import preflight as pf
    from hogkit.errors import EnvironmentProblem
    assert pf.platform("linux").status == pf.OK
    assert pf.platform("darwin").status == pf.FATAL
    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(EnvironmentProblem, match="live runs need Linux") as e:
        pf.preflight(2)
    assert "hogkit sim" in str(e.value) and "\n" not in str(e.value)


def test_a_cache_lines_hand_over_is_measured_between_two_real_cores():
    """Two pinned threads pass a line back and forth: a positive time per hand-over,
    well under a millisecond; one core alone has nothing to measure."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one usable core")
    ns = doctor.line_handover_ns(rounds=2000, timeout=60)   # a busy machine: slow, not absent
    assert ns is not None and 0 < ns < 1e6
    assert doctor.line_handover_ns(cpus=cpus[:1]) is None
    with pytest.raises(ValueError, match="rounds=1"):
        doctor.line_handover_ns(rounds=1, cpus=cpus[:1])
    with pytest.raises(ValueError, match="may run on"):
        doctor.line_handover_ns(cpus=[cpus[0], max(cpus) + 1])


@pytest.mark.timeout(120)
def test_a_probe_thread_that_fails_stops_its_peer_and_raises(monkeypatch):
    """One side cannot pin itself: the error comes back to the caller, and the other
    side, already spinning, stops at the poisoned flag instead of at the (here
    10-minute) deadline."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one usable core")
    real = os.sched_setaffinity

    def pin(pid, mask):
        if mask == {cpus[1]}:
            time.sleep(0.2)                # the other side is spinning by now
            raise PermissionError("no such core for you")
        real(pid, mask)
    monkeypatch.setattr(doctor.os, "sched_setaffinity", pin)
    with pytest.raises(PermissionError, match="no such core"):
        doctor.line_handover_ns(cpus=cpus[:2], timeout=600)


@pytest.mark.parametrize("samples,status,says", [
    ([40.0, 42.0, 41.0], doctor.OK, "CPUs 0 and 1 in 41 ns (median of 3, 40-42)"),
    ([160.0, 170.0, 165.0], doctor.WARN, "share no cache"),
    ([40.0, 165.0, 42.0], doctor.WARN, "the host moved these cores"),
    ([None, None, None], doctor.OK, "nothing to compare"),
])
def test_core_to_core_reads_the_hand_over_times(monkeypatch, samples, status, says):
    got = iter(samples)
    monkeypatch.setattr(doctor, "line_handover_ns", lambda cpus: next(got))
    monkeypatch.setattr(doctor.os, "sched_getaffinity", lambda pid: {0, 1})
    f = doctor.core_to_core(samples=len(samples), pause=0)
    assert f.status == status and says in f.detail, f
    assert (status == doctor.OK) == ("--replication worker" not in f.line())
