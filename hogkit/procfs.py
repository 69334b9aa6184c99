"""Processes and the machine as Linux's /proc and /sys show them (no psutil needed): a
parent's live children, a process's parent, its resident memory and CPU time (the soak
benchmark, the tests' orphan and leak checks, the peers benchmark's LIBMF watchdog),
which pid space a process's pid means something in (the Ray driver's clean-up of
killed actors); a core's cache size (the mf lane's prefetch) and
two CPUs on different physical cores (the doctor's hand-over probe)."""

from __future__ import annotations

import functools
import os
import time

__all__ = ["cache_bytes", "children", "cpu_ticks", "parent", "pid_space", "rss_kb",
           "spawned", "state", "two_cores"]


def _fields(pid):
    """The fields of /proc/<pid>/stat after the command name, which may hold spaces
    and ``)`` (raises OSError when ``pid`` is gone): [0] the state, [1] the parent pid,
    [11] and [12] the user and system CPU ticks."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def _stat(pid):
    """``(state, parent pid)`` of ``pid`` (raises OSError when it is gone)."""
    fields = _fields(pid)
    return fields[0], int(fields[1])


def state(pid):
    """``pid``'s state letter in /proc (``"R"``, ``"S"``, ``"Z"`` for a zombie: dead,
    not reaped yet, ...), or None when it is gone or unreadable."""
    try:
        return _fields(pid)[0]
    except OSError:
        return None


def cpu_ticks(pid):
    """User plus system CPU ticks ``pid`` has used (its threads' included), or None when
    it is gone."""
    try:
        fields = _fields(pid)
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])


def children(ppid):
    """``[(pid, cmdline)]`` of the live (not zombie) children of ``ppid``."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            state, up = _stat(pid)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if up == ppid and state != "Z":
            out.append((int(pid), cmd))
    return out


def spawned(ppid):
    """The pids of ``ppid``'s live children started by multiprocessing's ``spawn``
    (hogkit's workers), not its resource tracker."""
    return [pid for pid, cmd in children(ppid)
            if "spawn_main" in cmd and "resource_tracker" not in cmd]


def parent(pid):
    """``pid``'s parent pid, or None when ``pid`` is gone."""
    try:
        return _stat(pid)[1]
    except OSError:
        return None


def pid_space() -> str:
    """Where this process's pid means something: the machine's boot id and the pid
    namespace, so two processes that return the same string can see each other's pids
    (a Ray actor on this machine, in this container) and others cannot."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:                        # no /proc: nothing can be compared
        return f"unknown/{os.getpid()}/{time.time_ns()}"


def rss_kb(pid) -> int:
    """Resident memory of ``pid`` in KiB (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


@functools.cache
def cache_bytes(level=2, default=1 << 20) -> int:
    """The size in bytes of CPU 0's data (or unified) cache of ``level``, as
    ``/sys/devices/system/cpu/cpu0/cache`` lists it; ``default`` when it is not
    listed (another OS, a container without /sys). Read once a process."""
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = os.listdir(root)
    except OSError:
        return default
    for name in sorted(entries):
        try:
            with open(f"{root}/{name}/level") as f:
                lv = int(f.read())
            with open(f"{root}/{name}/type") as f:
                kind = f.read().strip()
            with open(f"{root}/{name}/size") as f:
                size = f.read().strip()
        except (OSError, ValueError):
            continue
        if lv != level or kind not in ("Data", "Unified"):
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        try:
            return int(size.rstrip("KMG")) * mult
        except ValueError:
            return default
    return default


def two_cores(cpus) -> list:
    """Two of ``cpus`` (CPU numbers) on different physical cores: the lowest, and the
    lowest not among its hardware-thread siblings
    (``/sys/devices/system/cpu/cpuN/topology/thread_siblings_list``); the two lowest
    where /sys does not say; fewer when ``cpus`` has fewer than two."""
    cpus = sorted(cpus)
    if len(cpus) < 2:
        return cpus
    first = cpus[0]
    try:
        with open(f"/sys/devices/system/cpu/cpu{first}/topology/thread_siblings_list") as f:
            siblings = _cpu_list(f.read())
    except (OSError, ValueError):
        siblings = {first}
    other = next((c for c in cpus[1:] if c not in siblings), cpus[1])
    return [first, other]


def _cpu_list(text) -> set:
    """The CPUs of a /sys list such as ``0,4`` or ``0-1,8-9``."""
    out = set()
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out
