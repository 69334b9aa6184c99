"""What spawning workers needs from the caller's code: a main guard, and objects that
pickle.

Is this call protected by ``if __name__ == "__main__":``?

hogkit starts workers with the ``spawn`` start method: each worker imports the script
that started the run (as ``__mp_main__``) before it runs anything. A script that calls
``hogkit.train()`` / ``hogkit.spawn()`` at its top level, without the guard, would start
a run again inside every worker; Python then stops each of them with a long traceback
about the "bootstrapping phase". :func:`check_main_guard` turns that into one line that
names the fix, raised in the parent before anything is spawned:

- **in the parent**: when the call comes from the top-level code of the ``__main__``
  script (found by walking the stack) and that line is not inside an
  ``if __name__ == "__main__":`` block (found by parsing the script with ``ast``);
- **in a worker**: when the call happens while the worker is still importing the
  parent's script (``multiprocessing`` marks that phase), as a last net.

Interactive sessions, ``python -c`` and notebooks have no script to re-import: nothing
is checked there. A script read from standard input (``python - <<EOF``) names a file
that does not exist, which a worker cannot re-import: refused with the fix.
"""

from __future__ import annotations

import ast
import os
import sys

from hogkit.errors import InvalidArgument

__all__ = ["check_main_guard", "check_spawnable"]


def check_main_guard(what: str) -> None:
    """Raise :class:`~hogkit.errors.InvalidArgument` if ``what`` (e.g.
    ``"hogkit.train()"``) is being called where spawned workers would call it again."""
    import multiprocessing as mp
    if getattr(mp.current_process(), "_inheriting", False):
        raise InvalidArgument(_message(what, None))
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if path is not None and not os.path.isfile(path):
        # `python - <<EOF`: __file__ is "<stdin>"; a spawned worker would try to
        # re-import it from that path and die with FileNotFoundError at step 0
        raise InvalidArgument(
            f"{what} spawns workers that re-import the main script, and this one has no "
            f"file ({path!r}: read from standard input?); save it as a .py file with "
            f"the call under `if __name__ == \"__main__\":`, or use python -c")
    line = _unguarded_line()
    if line is not None:
        raise InvalidArgument(_message(what, line))


def _message(what, line):
    where = f" (line {line} of {sys.modules['__main__'].__file__})" if line else ""
    return (f"{what} is called at the top level of the main script{where}, so every "
            f"spawned worker would run it again; put the call under "
            f"`if __name__ == \"__main__\":`")


def _unguarded_line():
    """The line of the ``__main__`` script's top-level code that led to this call,
    when it is not under an ``if __name__ == "__main__":``; else None."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or not os.path.isfile(path):
        return None
    real = os.path.realpath(path)
    frame, outer = sys._getframe(1), None
    while frame is not None:
        code = frame.f_code
        if (code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__"
                and os.path.realpath(code.co_filename) == real):
            outer = frame
        frame = frame.f_back
    if outer is None:
        return None
    line = outer.f_lineno
    try:
        with open(real, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    return None if _guarded(tree.body, line) else line


def _guarded(body, line) -> bool:
    """True when ``line`` lies inside an ``if __name__ ...`` block of ``body``."""
    for node in body:
        start, end = getattr(node, "lineno", None), getattr(node, "end_lineno", None)
        if start is None or end is None or not start <= line <= end:
            continue
        if isinstance(node, ast.If) and _tests_name(node.test):
            return True
        children = [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)]
        for field in ("body", "orelse", "finalbody", "handlers"):
            for c in getattr(node, field, []) or []:
                if isinstance(c, ast.ExceptHandler):
                    children.extend(c.body)
        return _guarded(children, line)
    return False


def _tests_name(test) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "__name__" for n in ast.walk(test))


def check_spawnable(what: str, obj) -> None:
    """Raise :class:`~hogkit.errors.InvalidArgument` naming ``what`` unless ``obj``
    pickles: spawned workers receive it by pickle, so it (and every function or class
    it holds) must be importable by name."""
    import pickle
    try:
        pickle.dumps(obj)
    except Exception as e:  # noqa: BLE001 - any pickling failure, named
        raise InvalidArgument(
            f"{what} cannot be sent to the worker processes: pickling it failed with "
            f"{type(e).__name__}: {e}. Workers are started with 'spawn': define "
            f"functions and classes at the top level of a module or of the script (no "
            f"lambdas, no nested functions)") from None
