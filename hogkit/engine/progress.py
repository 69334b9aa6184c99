"""What a live run shows while it goes: a line for each stage, then a bar over its budget.

A first run on a machine spends most of its time before training: numba compiles the
step kernels (~15 s for mf; later runs load them from numba's cache in well under a
second). A run therefore says what it is doing from its first second: one line per
stage on standard error (building the data, compiling, starting the workers, training,
writing the results), each with the seconds since the run began, and on a terminal a
bar over the training budget once training has started (not before, where it would
sit at 0 %).

``progress`` as :func:`hogkit.train` takes it: ``None`` (stages and bar on a terminal,
nothing otherwise), ``True`` (both, even into a file), ``"lines"`` (the stage lines
only: for logs; ``hogkit run`` uses it when stderr is not a terminal) or ``False``.
"""

from __future__ import annotations

import sys
import time

from hogkit.errors import InvalidArgument

__all__ = ["Progress", "MODES"]

MODES = (None, True, False, "lines")


class Progress:
    """A run's stage lines and training bar (see the module doc)."""

    def __init__(self, progress=None, *, stream=None):
        if not (progress is None or isinstance(progress, bool) or progress == "lines"):
            raise InvalidArgument(f"progress must be None, True, False or 'lines', got "
                                  f"{progress!r}")
        self.stream = stream if stream is not None else sys.stderr
        tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.show_bar = progress is True or (progress is None and tty)
        self.lines = self.show_bar or progress == "lines"
        self.t0 = time.monotonic()
        self.bar = None

    def stage(self, text: str) -> None:
        """Say what the run does now (one line, with the seconds since it began)."""
        if self.lines:
            print(f"[{time.monotonic() - self.t0:5.1f} s] {text}", file=self.stream,
                  flush=True)

    def training(self, steps=None, seconds=None) -> None:
        """Training has started: a bar over ``seconds`` (or ``steps``) on a terminal."""
        if not self.show_bar or self.bar is not None:
            return
        try:
            from tqdm import tqdm
        except ImportError:  # pragma: no cover - tqdm is a dependency
            return
        if steps is None and seconds is not None:
            fmt = "{l_bar}{bar}| {n:.1f}/{total:g} s"
            self.bar = tqdm(total=seconds, bar_format=fmt, desc="training",
                            file=self.stream, dynamic_ncols=True, leave=False)
        else:
            self.bar = tqdm(total=steps, unit="step", desc="training", file=self.stream,
                            dynamic_ncols=True, leave=False)

    def update(self, n) -> None:
        """The bar at ``n`` (seconds or steps so far)."""
        if self.bar is not None:
            self.bar.n = n
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
