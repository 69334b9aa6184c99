"""Results on disk: an append-only JSONL event log, ``summary.json``, CSV and PNG plots.

- :class:`EventLog` appends one JSON object per line, each batch whole or not at all:
  a write the disk cannot take is cut back to the last whole line and raises
  :class:`~hogkit.errors.OutputFailed`; a file left with a partial last line (a crash
  mid-write) is repaired when it is opened again (a resume), and :func:`read_events`
  skips a damaged line with a warning that names it, reading on.
- :func:`write_summary` writes ``summary.json`` atomically (tmp → fsync → replace).
- :func:`plot_run` draws loss vs time and the staleness histograms from saved
  results (matplotlib, Agg backend; skipped with a note when matplotlib is absent).
  Plotting reads files; it never trains.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import sys
import time

import numpy as np

from hogkit.errors import DamagedFile, OutputFailed
from hogkit.kernels.staleness import width_at


class EventLog:
    """Append-only JSONL file; ``write(records)`` appends whole lines or nothing.

    Opening cuts off a partial last line a crash left (``repaired``: the bytes cut), so
    a resumed run never appends onto one. A write the disk refuses (full, folder gone)
    truncates the file back to its last whole line and raises
    :class:`~hogkit.errors.OutputFailed` naming the file, the free space and the fix;
    with ``quiet`` set (a run already ending on another error) it drops the batch
    instead.
    """

    quiet = False

    def __init__(self, path):
        self.path = os.fspath(path)
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                               0o644)
            self._size, self.repaired = _cut_partial_line(self._fd)
        except OSError as e:
            if getattr(self, "_fd", None) is not None:
                os.close(self._fd)
            raise OutputFailed.writing(self.path, e) from None

    def write(self, records) -> None:
        if not records:
            return
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as e:
            try:                        # never leave a partial line behind
                os.ftruncate(self._fd, self._size)
            except OSError:             # pragma: no cover - the folder's disk is gone
                pass
            if self.quiet:
                return
            raise OutputFailed.writing(self.path, e) from None
        self._size += len(data)

    @property
    def closed(self) -> bool:
        return self._fd is None

    def close(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.fsync(fd)
        except OSError as e:
            if not self.quiet:
                raise OutputFailed.writing(self.path, e) from None
        finally:
            os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _cut_partial_line(fd):
    """Truncate ``fd``'s file after its last newline; returns ``(size, bytes cut)``."""
    size = os.fstat(fd).st_size
    end = size
    while end > 0:
        start = max(0, end - (1 << 16))
        nl = os.pread(fd, end - start, start).rfind(b"\n")
        if nl >= 0:
            end = start + nl + 1
            break
        end = start
    if end != size:
        os.ftruncate(fd, end)
    return end, size - end


def read_events(path) -> list:
    """Read a JSONL event log. A damaged line (a torn write, a disk error) is skipped
    with a :class:`~hogkit.errors.DamagedFile` warning naming its line number; the
    lines after it are read."""
    out, bad = [], []
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            try:
                out.append(json.loads(line))
            except (json.JSONDecodeError, UnicodeDecodeError):
                bad.append(n)
    if bad:
        import warnings
        shown = ", ".join(map(str, bad[:5])) + (f" and {len(bad) - 5} more" if len(bad) > 5
                                                else "")
        warnings.warn(f"{path}: {len(bad)} damaged line(s) skipped (line {shown}); the "
                      f"other {len(out)} events were read", DamagedFile, stacklevel=2)
    return out


@functools.lru_cache(maxsize=None)
def _processor() -> str:
    """The CPU's model name (``/proc/cpuinfo``; else ``platform.processor()``): float
    results of vectorised kernels (torch's, BLAS) can differ in the last bits between
    instruction sets, so a result file says which processor made it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def environment() -> dict:
    """Versions and settings recorded with every run."""
    import numpy
    env = {"python": sys.version.split()[0], "platform": platform.platform(),
           "processor": _processor(), "numpy": numpy.__version__,
           "cpus": os.cpu_count(), "start_method": "spawn",
           "thread_caps": 1, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    try:
        import numba
        env["numba"] = numba.__version__
    except ImportError:  # pragma: no cover
        pass
    if "torch" in sys.modules:
        env["torch"] = sys.modules["torch"].__version__
    env["hogkit"] = _hogkit_version()
    return env


@functools.lru_cache(maxsize=None)
def _hogkit_version() -> str:
    """hogkit's version from its installed distribution's metadata (the package face,
    ``hogkit.__version__``, sits above this module); "unknown" in a tree that was never
    installed."""
    from importlib import metadata
    try:
        return metadata.version("hogkit")
    except metadata.PackageNotFoundError:     # pragma: no cover - an uninstalled tree
        return "unknown"


def write_json(path, obj) -> None:
    """Write JSON atomically: tmp in the same folder → fsync → os.replace."""
    path = os.fspath(path)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=False, default=_jsonable)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _jsonable(x):
    import numpy as np
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


def write_summary(run, out_dir) -> str:
    path = os.path.join(out_dir, "summary.json")
    for name, write in ((path, lambda: write_json(path, run.summary())),
                        (os.path.join(out_dir, "loss.csv"),
                         lambda: write_loss_csv(run, os.path.join(out_dir, "loss.csv")))):
        try:
            write()
        except OSError as e:          # the file it names, not a temporary one
            raise OutputFailed.writing(name, e) from None
    return path


def write_outputs(run, out_dir) -> None:
    """What every run writes to its results folder (both front doors):
    ``summary.json``, ``loss.csv`` and the plots."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        run.out = os.fspath(out_dir)
        write_summary(run, out_dir)
        plot_run(run.summary(), out_dir)
    except OutputFailed:
        raise
    except OSError as e:
        raise OutputFailed.writing(e.filename or os.fspath(out_dir), e) from None


def write_loss_csv(run, path) -> None:
    with open(path, "w") as f:
        f.write("t_s,updates,loss\n")
        for p in run.loss_curve:
            f.write(f"{p['t']:.4f},{p['updates']},{p['loss']!r}\n")


def hist_steps(hist: dict):
    """``(edges, counts)`` of a summary's staleness histogram (``{bin's lowest value:
    reads}``, keys as ints or strings) on its own log-linear bins (one per value below
    128, then 64 per power of two: ``kernels.staleness``), every bin from 0 to the last
    non-empty one, empty ones 0: what ``matplotlib``'s ``stairs`` draws."""
    lows = sorted(int(k) for k in hist)
    if not lows:
        return np.array([0.0, 1.0]), np.array([0.0])
    edges = [0]
    while edges[-1] <= lows[-1]:
        edges.append(edges[-1] + width_at(edges[-1]))
    counts = np.zeros(len(edges) - 1)
    index = {e: n for n, e in enumerate(edges[:-1])}
    for k, v in hist.items():
        counts[index[int(k)]] += v
    return np.asarray(edges, dtype=float), counts


def _staleness_panel(ax, s, label):
    """One staleness histogram: reads per bin on the bins' real edges, both axes log
    (x symmetric-log: 0 is a bin of its own), the share at 0 and the tail in the title."""
    edges, counts = hist_steps(s.get("histogram") or {})
    n = max(int(s.get("count", counts.sum())), 1)
    at0 = counts[0] / n if len(counts) else 0.0
    ax.stairs(counts, edges, fill=True, baseline=0.5, alpha=0.8)
    ax.set_ylim(0.5, max(counts.max(), 1) * 3)
    ax.set_xscale("symlog", linthresh=1, linscale=0.5)
    ax.set_yscale("log")
    ax.set_xlim(0, max(edges[-1], 2))
    ax.set_title(f"{label}\n{n:,} reads: {at0:.1%} at 0, mean {s.get('mean', 0):.3g}, "
                 f"p99 {s.get('p99', 0)}, max {s.get('max', 0)}", fontsize=9)
    ax.set_xlabel("value (bins: one per value below 128, then 64 per doubling)")
    ax.set_ylabel("reads per bin")
    ax.grid(True, alpha=0.3)


def plot_run(summary: dict, out_dir) -> list:
    """Draw ``loss.png`` and ``staleness.png`` from a summary dict; returns the paths.

    Returns an empty list if matplotlib is not installed (``pip install hogkit[plot]``).
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    paths = []
    time_label = "simulated time (s)" if summary.get("simulated") else "wall time (s)"
    curve = summary.get("loss_curve") or []
    if curve:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([p["t"] for p in curve], [p["loss"] for p in curve], marker=".")
        ax.set_xlabel(time_label)
        ax.set_ylabel("loss")
        ax.set_yscale("log")
        cfg = summary.get("config", {})
        ax.set_title(f"{cfg.get('workload', '')}: {summary.get('workers')} workers, "
                     f"{cfg.get('policy', {}).get('name', '')}")
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        p = os.path.join(out_dir, "loss.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    st = summary.get("staleness", {})
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "update_gap", "update gap: updates by other workers "
                                                   "between a read and its write"),
                           (axes[1], "clock_lag", "clock lag: iterations ahead of the "
                                                  "slowest worker at a read")):
        _staleness_panel(ax, st.get(key) or {}, label)
    fig.tight_layout()
    p = os.path.join(out_dir, "staleness.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    return paths
