"""The rule contract of the kernels: one parameter's update through the rule its
configuration names, on sparse rows (:func:`apply_rows`) or a dense flat buffer
(:func:`apply_flat`).

A rule is a ``NamedTuple`` class of its hyper-parameters (its *configuration*, e.g.
``delayed.GapAwareCfg(lr, mu, gamma, lr_max)``; ``lr`` is always a field), registered
here with the two kernels that apply it (:func:`register`). Every engine calls the two
stubs below, and numba's ``overload`` picks the kernels by the configuration's class
when it compiles the caller: a loop runs the one rule it was compiled for, with no
branch on a kind, and a configuration whose class nothing registered fails to compile,
naming the class and the fix. The registered classes:

=====================  ==================================================  ==============
configuration          rule                                                module
=====================  ==================================================  ==============
``SGDCfg``             ``w -= lr·g``                                       ``sgd``
``MomentumCfg``        ``m = mu·m + g; w -= lr·m``                         ``sgd``
``StalenessCfg``       the same at ``g / max(tau, 1)`` (Zhang et al.)      ``delayed``
``DCCfg``              DC-ASGD, constant ``lam`` (Zheng et al.)            ``delayed``
``DCAdaptiveCfg``      DC-ASGD, adaptive ``lam0 / sqrt(MS + eps)``         ``delayed``
``GapAwareCfg``        Gap-Aware damping, optional momentum (Barkai et     ``delayed``
                       al.)
``AdaGradCfg``         AdaGrad, per coordinate or row-wise (Duchi et al.)  ``adaptive``
``RMSPropCfg``         RMSProp, per coordinate or row-wise                 ``adaptive``
``AdamCfg``            Adam, lazy on rows (Kingma & Ba; SparseAdam's)      ``adam``
=====================  ==================================================  ==============

**The kernels' arguments** (both stubs; nothing is checked here: ``hogkit.rules``
checks): ``c`` the configuration; the parameter (``W`` 2-D rows, or ``w`` flat); the
rule's state: ``S1``, ``S2`` (its first and second state arrays, the parameter's shape,
or ``(rows, 1)`` for a row-wise one; any array of the right type where unused) and
``K[ki]`` (this parameter's own step count, for a rule that counts steps); the
gradient (``rows``/``G``/``n``: its first ``n`` rows, ``n < 0`` every row; or ``g``);
``R`` / ``read`` the parameter values it was computed from (rules that need them; the
row kernels may turn ``R`` into the gaps in place); ``tau`` the update gap (updates by
others since the read); ``fresh`` (rows) the caller's clock says no other update
landed since the read, so every gap is zero and need not be measured; ``t`` the update
count of the rule's state, this update included, where the caller knows it (a state
every worker shares: the clocks' total, so a bias correction counts every worker's
updates), or -1: the rule counts in ``K[ki]`` itself.

**One call.** Each stub is an overload that is *called*, not inlined: its body, the
registered kernel (inlined into it when the kernel is ``inline="always"``, as plain
SGD's rows), is compiled once per configuration and array types, under the step
core's flags, and shared by every loop that applies that rule; a step loop carries
none of the rules' bodies. (Inlining a typed overload also set off a fault of numba's
dead-code elimination: ``_aliases.py``.)
"""

from numba import njit
from numba.core.errors import TypingError
from numba.extending import overload

from ._intrinsics import FASTMATH

_ROWS = {}
_FLAT = {}


def register(cfg_cls, *, rows, flat):
    """Register the kernels of the rule whose configuration class is ``cfg_cls`` (a
    ``NamedTuple`` with an ``lr`` field, defined at a module's top level: numba's cache
    refers to it by name): ``rows(c, W, S1, S2, K, ki, rows, G, R, n, tau, fresh, t)``
    and ``flat(c, w, s1, s2, K, ki, g, read, tau, t)`` (njit; the module docstring
    says what each argument is). Registering the same kernels again is a no-op; other
    kernels for a registered class are refused."""
    if "lr" not in getattr(cfg_cls, "_fields", ()):
        raise ValueError(f"{cfg_cls!r} is not a NamedTuple class with an 'lr' field; a "
                         f"rule's configuration is one")
    if cfg_cls in _ROWS:
        if (_ROWS[cfg_cls], _FLAT[cfg_cls]) != (rows, flat):
            raise ValueError(f"{cfg_cls.__name__} is already registered with other "
                             f"kernels; give each rule its own configuration class")
        return
    _ROWS[cfg_cls] = rows
    _FLAT[cfg_cls] = flat


def registered(cfg_cls) -> bool:
    """Whether kernels are registered for the configuration class ``cfg_cls``."""
    return cfg_cls in _ROWS


def _missing(c, which):
    name = getattr(getattr(c, "instance_class", None), "__name__", str(c))
    return TypingError(f"no {which} kernel is registered for the rule configuration "
                       f"{name}; register the rule's kernels with hogkit.kernels.rule."
                       f"register({name}, rows=..., flat=...) in the module that defines "
                       f"it, and import that module before the step compiles")


def apply_rows(c, W, S1, S2, K, ki, rows, G, R, n, tau, fresh, t):
    """Apply the first ``n`` rows of gradient ``G`` to the 2-D parameter ``W`` under
    the rule ``c`` names (module docstring). Dispatched by ``c``'s class (an overload
    when compiled; interpreted, with ``NUMBA_DISABLE_JIT``, this body)."""
    _ROWS[type(c)](c, W, S1, S2, K, ki, rows, G, R, n, tau, fresh, t)


def apply_flat(c, w, s1, s2, K, ki, g, read, tau, t):
    """The dense twin of :func:`apply_rows`: every array flat, as long as ``w`` (a
    row-wise state ``s1`` has one entry per row)."""
    _FLAT[type(c)](c, w, s1, s2, K, ki, g, read, tau, t)


@overload(apply_rows, jit_options={"fastmath": FASTMATH, "nogil": True})
def _apply_rows_jit(c, W, S1, S2, K, ki, rows, G, R, n, tau, fresh, t):
    kernel = _ROWS.get(getattr(c, "instance_class", None))
    if kernel is None:
        raise _missing(c, "rows")

    def impl(c, W, S1, S2, K, ki, rows, G, R, n, tau, fresh, t):
        kernel(c, W, S1, S2, K, ki, rows, G, R, n, tau, fresh, t)
    return impl


@overload(apply_flat, jit_options={"fastmath": FASTMATH, "nogil": True})
def _apply_flat_jit(c, w, s1, s2, K, ki, g, read, tau, t):
    kernel = _FLAT.get(getattr(c, "instance_class", None))
    if kernel is None:
        raise _missing(c, "flat")

    def impl(c, w, s1, s2, K, ki, g, read, tau, t):
        kernel(c, w, s1, s2, K, ki, g, read, tau, t)
    return impl


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def rows_now(c, W, S1, S2, K, ki, rows, G, R, n, tau, fresh, t):
    """:func:`apply_rows` called from Python (``hogkit.rules``), compiled per rule."""
    apply_rows(c, W, S1, S2, K, ki, rows, G, R, n, tau, fresh, t)


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def flat_now(c, w, s1, s2, K, ki, g, read, tau, t):
    """:func:`apply_flat` called from Python (``hogkit.rules``), compiled per rule."""
    apply_flat(c, w, s1, s2, K, ki, g, read, tau, t)
