"""The small exception tree of hogkit.

Every error that bad input can cause is also a built-in exception of the matching
kind, so ``except ValueError`` in user code keeps working:

    HogkitError
    ├── InvalidArgument      (also ValueError)  a value breaks a constraint
    ├── InvalidType          (also TypeError)   wrong type or dtype
    ├── NonFiniteGradient    (also FloatingPointError) a NaN/inf reached the guard
    ├── ShmCapacityError     (also OSError)     /dev/shm cannot hold a segment
    ├── PolicyTimeout        (also TimeoutError) a consistency wait ran out of time
    ├── WorkerFailed                            a worker process died or raised
    └── Stopped                                 the run was asked to stop (inside
                                                hogkit.spawn: ends the user's loop)

Messages name the offending value, the constraint and the fix.
"""

from __future__ import annotations


class HogkitError(Exception):
    """Base class of every error hogkit raises on purpose."""


class InvalidArgument(HogkitError, ValueError):
    """A value is outside what the call accepts."""


class InvalidType(HogkitError, TypeError):
    """A value has the wrong type or dtype."""


class NonFiniteGradient(HogkitError, FloatingPointError):
    """A gradient with NaN or inf was stopped before it reached shared parameters."""

    @classmethod
    def at(cls, who, step, where=""):
        """The error for ``who`` (e.g. "worker 1") at ``step``; ``where`` adds context."""
        return cls(f"{who} produced a non-finite gradient at step {step}{where}; nothing "
                   f"was written. Lower the learning rate, or pass nonfinite='skip' to "
                   f"drop such updates and count them")


class ShmCapacityError(HogkitError, OSError):
    """Shared memory (/dev/shm) has too little room for a segment."""


class EnvironmentProblem(HogkitError, OSError):
    """This machine cannot run it (limits, shared memory, start method): what
    ``hogkit doctor`` flags as fatal, raised before anything is built."""


class PolicyTimeout(HogkitError, TimeoutError):
    """A consistency policy waited longer than its timeout."""


class Stopped(HogkitError):
    """The run was asked to stop (its time budget ran out, the parent was interrupted,
    a peer failed). Inside :func:`hogkit.spawn`, a hogkit optimizer's ``step()``
    raises it so the user's loop ends wherever it is; the worker treats it as a normal
    end (wrap the loop in ``try/finally`` for clean-up of your own)."""


class EngineNotice(UserWarning):
    """A run falls back from the compiled step core to the Python step (the message
    says why); filter it with ``warnings.simplefilter("ignore", EngineNotice)``."""


class WorkerFailed(HogkitError):
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
            print(f"{value}", file=sys.stderr, flush=True)
            os._exit(128 + int(value.signum))
        prev(tp, value, tb)

    hook.hogkit_interrupt_hook = True
    sys.excepthook = hook
