"""Processes as Linux's /proc shows them (no psutil needed): a parent's live children
and a process's resident memory. Used by the soak benchmark and the tests' orphan
checks."""

from __future__ import annotations

import os

__all__ = ["children", "rss_kb"]


def children(ppid):
    """``[(pid, cmdline)]`` of the live (not zombie) children of ``ppid``."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if int(fields[1]) == ppid and fields[0] != "Z":
            out.append((int(pid), cmd))
    return out


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
