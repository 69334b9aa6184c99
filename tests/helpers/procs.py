"""Live child processes of a pid (hogkit.procfs: read from /proc, no psutil)."""

from hogkit.procfs import children

__all__ = ["children"]
