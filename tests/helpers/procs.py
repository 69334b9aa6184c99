"""Live child processes of a pid, read from /proc (no psutil needed)."""

from __future__ import annotations

import os


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
