"""The small exception tree of hogkit.

Every error that bad input can cause is also a built-in exception of the matching
kind, so ``except ValueError`` in user code keeps working:

    HogkitError
    ├── InvalidArgument      (also ValueError)  a value breaks a constraint
    ├── InvalidType          (also TypeError)   wrong type or dtype
    ├── RunFailed                               the run failed, or this machine cannot
    │   │                                       run it (the CLI's exit status 1)
    │   ├── WorkerFailed                        a worker process died or raised
    │   ├── NonFiniteGradient (FloatingPointError) a NaN/inf reached the guard
    │   ├── ShmCapacityError  (OSError)         /dev/shm cannot hold a segment
    │   ├── EnvironmentProblem (OSError)        limits, shared memory, start method
    │   ├── OutputFailed      (OSError)         a results file could not be written
    │   ├── CheckpointDamaged (ValueError)      a checkpoint file cannot be read
    │   └── PolicyTimeout     (TimeoutError)    a consistency wait ran out of time
    └── Stopped                                 the run was asked to stop (inside
                                                hogkit.spawn: ends the user's loop)

(A cluster run's ``NodeFailed`` and ``ShardFailed`` are ``RunFailed`` too.) Everything
else a command raises on purpose is bad usage: the CLI's exit status 2. Messages name
the offending value, the constraint and the fix.
"""

from __future__ import annotations

import sys


class HogkitError(Exception):
    """Base class of every error hogkit raises on purpose."""


class InvalidArgument(HogkitError, ValueError):
    """A value is outside what the call accepts."""


class InvalidType(HogkitError, TypeError):
    """A value has the wrong type or dtype."""


class RunFailed(HogkitError):
    """The run failed, or this machine cannot run it (not bad usage): ``hogkit``
    exits 1 with the message."""


class NonFiniteGradient(RunFailed, FloatingPointError):
    """A gradient with NaN or inf was stopped before it reached shared parameters."""

    @classmethod
    def at(cls, who, step, where=""):
        """The error for ``who`` (e.g. "worker 1") at ``step``; ``where`` adds context."""
        return cls(f"{who} produced a non-finite gradient at step {step}{where}; nothing "
                   f"was written. Lower the learning rate, or pass nonfinite='skip' to "
                   f"drop such updates and count them")


class ShmCapacityError(RunFailed, OSError):
    """Shared memory (/dev/shm) has too little room for a segment."""


class EnvironmentProblem(RunFailed, OSError):
    """This machine cannot run it (limits, shared memory, start method): what
    ``hogkit doctor`` flags as fatal, raised before anything is built."""


class OutputFailed(RunFailed, OSError):
    """A results file (events, checkpoint, summary) could not be written: the folder is
    full or gone. The message names the file, the free space and the fix."""

    @classmethod
    def writing(cls, path, err, *, kept=""):
        """The error for ``err`` (an ``OSError``) writing ``path``; ``kept`` says what
        was saved anyway."""
        import errno as _errno
        import os
        import shutil
        folder = os.path.dirname(os.path.abspath(path)) or "."
        if err.errno in (_errno.ENOSPC, _errno.EDQUOT, _errno.EFBIG):
            try:
                free = f"{shutil.disk_usage(folder).free / 2**20:.1f} MiB free there"
            except OSError:
                free = "free space unknown"
            fix = "free space there or give --out on a larger disk"
            what = f"the disk is full ({free})"
        elif err.errno == _errno.ENOENT:
            what, fix = "its folder is gone", "keep the out folder while the run writes"
        else:
            what, fix = err.strerror or str(err), "check the out folder's permissions"
        msg = f"cannot write {path}: {what}; {fix}"
        if kept:
            msg += f". {kept}"
        return cls(err.errno, msg)

    def __str__(self):
        return self.strerror or super().__str__()


class CheckpointDamaged(RunFailed, ValueError):
    """A checkpoint file is not readable (truncated, overwritten, not a checkpoint)."""


class PolicyTimeout(RunFailed, TimeoutError):
    """A consistency policy waited longer than its timeout."""


class Stopped(HogkitError):
    """The run was asked to stop (its time budget ran out, the parent was interrupted,
    a peer failed). Inside :func:`hogkit.spawn`, a hogkit optimizer's ``step()``
    raises it so the user's loop ends wherever it is; the worker treats it as a normal
    end (wrap the loop in ``try/finally`` for clean-up of your own)."""


class DamagedFile(UserWarning):
    """A results file had a damaged part (a torn line), which was skipped; the message
    names the file and where."""


class RunNotice(UserWarning):
    """A run may not go, or did not go, as well as its settings or counts suggest (a
    block grid too small for its workers; a large share of its updates skipped for
    non-finite gradients); the message says what to do."""


class EngineNotice(UserWarning):
    """A run falls back from the compiled step core to the Python step (the message
    says why); filter it with ``warnings.simplefilter("ignore", EngineNotice)``."""


class WorkerFailed(RunFailed):
    """A worker process died, was killed, or raised.

    Attributes: ``rank``, ``step`` (last step the worker reported, or None),
    ``exitcode`` (None if unknown), ``signal`` (signal name if killed by one),
    ``traceback`` (the worker's formatted traceback, or ""), ``cause`` (the type of
    the exception the worker raised, from its traceback).
    """

    def __init__(self, rank, *, step=None, exitcode=None, signal=None, traceback="",
                 reason="", budget=None):
        self.rank = rank
        self.step = step
        self.exitcode = exitcode
        self.signal = signal
        self.traceback = traceback
        self.reason = reason
        what = reason or (
            f"was killed by {signal}" if signal else f"exited with code {exitcode}")
        msg = f"worker {rank} {what}"
        if step is not None:
            msg += f" (at step {step})"
        if budget:              # --on-failure restart: every restart was spent
            msg += f"; restart budget ({budget}) used up"
        if traceback:
            msg += f"\n--- worker {rank} traceback ---\n{traceback.rstrip()}"
        super().__init__(msg)

    @property
    def cause(self) -> str:
        """The worker's exception type as its traceback names it (e.g.
        ``"hogkit.errors.NonFiniteGradient"``); "" when it died without raising."""
        lines = [line for line in self.traceback.splitlines() if line.strip()]
        if not lines or lines[-1][:1].isspace():
            return ""
        return lines[-1].split(":", 1)[0].strip()

    def __reduce__(self):
        return (_rebuild_worker_failed,
                (self.rank, self.step, self.exitcode, self.signal, self.traceback,
                 self.reason))


def _rebuild_worker_failed(rank, step, exitcode, signal, traceback, reason):
    return WorkerFailed(rank, step=step, exitcode=exitcode, signal=signal,
                        traceback=traceback, reason=reason)


class Interrupted(KeyboardInterrupt):
    """The parent got SIGINT or SIGTERM; the run was shut down in order.

    A ``KeyboardInterrupt`` (not a ``HogkitError``) so that ``except Exception``
    never swallows it. ``signum`` is the signal that arrived.
    """

    def __init__(self, signum):
        import signal as _signal
        self.signum = signum
        super().__init__(f"interrupted by {_signal.Signals(signum).name}; workers stopped "
                         f"and shared memory released")

    #: signals a handler raised this for, in arrival order: a raise inside a C callback
    #: (numba compiling, llvmlite's object cache) is swallowed there, so whoever raised
    #: it also records it, and :func:`Interrupted.check` raises it again where Python can
    _requested: list = []

    @classmethod
    def request(cls, signum) -> "Interrupted":
        """Record ``signum`` and return the exception to raise for it."""
        cls._requested.append(signum)
        return cls(signum)

    @classmethod
    def check(cls) -> None:
        """Raise the recorded interruption, if any (after a stage that runs C code)."""
        if cls._requested:
            raise cls(cls._requested[-1])

    @classmethod
    def pending(cls):
        """The last recorded signal, or None."""
        return cls._requested[-1] if cls._requested else None

    @classmethod
    def clear(cls) -> None:
        cls._requested.clear()


def message(err) -> str:
    """``err``'s message and its notes (what a failed run kept: ``add_note``), one
    paragraph."""
    notes = getattr(err, "__notes__", None) or []
    return "; ".join([str(err), *notes]) if notes else str(err)


def exit_on_interrupt() -> None:
    """Make an uncaught :class:`Interrupted` end a script as ``hogkit run`` ends: its one
    line on stderr and exit status 128 + the signal (130 SIGINT, 143 SIGTERM). Python
    exits 130 only for the exact ``KeyboardInterrupt`` class; a subclass left a
    traceback and status 1. Installed (once, chaining ``sys.excepthook``) by every live
    run; the run has stopped its workers and released its memory before it raises."""
    import os
    import sys
    prev = sys.excepthook
    if getattr(prev, "hogkit_interrupt_hook", False):
        return

    def hook(tp, value, tb):
        if isinstance(value, Interrupted):
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # pragma: no cover - a closed stream
                    pass
            print(message(value), file=sys.stderr, flush=True)
            os._exit(128 + int(value.signum))
        prev(tp, value, tb)

    hook.hogkit_interrupt_hook = True
    sys.excepthook = hook


def user_stacklevel() -> int:
    """The ``stacklevel`` for a warning raised by the caller of this function that
    names the first frame outside hogkit (the user's line, whichever front door led
    there)."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_globals.get("__name__", "").startswith("hogkit"):
        frame, level = frame.f_back, level + 1
    return level
