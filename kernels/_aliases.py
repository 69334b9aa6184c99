"""A repair of numba's alias analysis: an array unpacked from a tuple argument is the
argument's array.

numba's dead-code elimination keeps a write to an array only when the array may alias
an argument or is read later (``numba.core.ir_utils.find_potential_aliases``). It
follows ``a = t[2]`` (``static_getitem``) back to a tuple argument ``t``, but not
tuple unpacking, ``gh, lh, stats, ring = log``, which numba's IR spells
``exhaust_iter(log)`` then ``static_getitem``: the unpacked ``stats`` looks like a
local array, and its last writes (nothing reads them later in the function) are
removed as dead. The elimination runs after a typed ``overload(..., inline="always")``
is inlined, so a kernel that unpacks its arguments and calls such an overload (the
rule dispatch of ``rule.py``, a workload's ``sample``) lost them: ``step.python_end``
recorded each event's histograms but not its count. Registered for every
``ir.Assign`` (numba's extension point, called beside its own handling), this marks
the result of ``exhaust_iter`` an alias of the tuple it unpacks; it only ever keeps
more code, never removes any.
"""

from numba.core import ir, ir_utils

_PREVIOUS = ir_utils.alias_analysis_extensions.get(ir.Assign)


def _unpacked_aliases(instr, args, typemap, func_ir, alias_map, arg_aliases):
    if _PREVIOUS is not None:
        _PREVIOUS(instr, args, typemap, func_ir, alias_map, arg_aliases)
    expr = instr.value
    if isinstance(expr, ir.Expr) and expr.op == "exhaust_iter":
        lhs, rhs = instr.target.name, expr.value.name
        if rhs in arg_aliases:
            arg_aliases.add(lhs)
        else:
            alias_map.setdefault(rhs, set()).add(lhs)
            alias_map.setdefault(lhs, set()).add(rhs)


if getattr(_PREVIOUS, "__name__", None) != "_unpacked_aliases":    # once a process
    ir_utils.alias_analysis_extensions[ir.Assign] = _unpacked_aliases
