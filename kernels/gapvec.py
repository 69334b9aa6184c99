"""The delayed rules' row passes as straight-line vector code: the gaps, Gap-Aware's and
adaptive DC-ASGD's update passes, and both rules' undamped step on a fresh read.

Each kernel here is the vector form of one ``kernels/delayed.py`` loop on a 2-D table of
rows ``K`` wide, entry ``i < n`` on row ``r = rows[i]``:

- ``gaps(W, rows, B, n, ahead)``: ``B[i] = W[r] - B[i]`` (:func:`delayed.gaps_into`);
- ``gap_aware(W, V, rows, G, D, n, ahead, a, gm, g1, bc, cm, tiny)``: Gap-Aware without
  momentum (:func:`delayed.gap_aware_gap_rows`'s ``mu == 0`` branch);
- ``dc_adaptive(W, MS, rows, G, D, n, ahead, a, mm, m1, l0, e)``: adaptive DC-ASGD
  (:func:`delayed.dc_adaptive_gap_rows`);
- ``undamped(W, S, rows, G, n, ahead, a, keep, fresh)``: both rules' step on a fresh
  read, no gap at all (:func:`delayed.undamped_rows`): ``S = keep·S + fresh·(g·g)``,
  ``w - a·g``, what the two passes above do on a row whose gap is all zeros.

Every one returns 0, or -1 without writing anything when the width is not covered
(:func:`fits`); ``ahead > 0`` prefetches the table's (or the state's) row of entry ``i +
ahead``. The scalars are the numba kernel's, already in the table's dtype.

**The same bits.** The numba loops run under :data:`~._intrinsics.FASTMATH`
(reassociation), and LLVM reorders their products. The IR here spells out the order
LLVM chose for them (read from ``inspect_llvm`` of the numba kernels), so every value is
the numba loop's to the bit: Gap-Aware's moved row steps ``w - (g·a)/gap``, adaptive
DC-ASGD's ``w - a·(g + ((g·g)·(d·l0)) / sqrt(ms + e))``, with a select for a zero gap
where the loop had its branch. ``tests/test_kernels.py`` holds each one to its numba
loop on random batches with repeated rows, both dtypes, every covered width; the
simulated experiments' stored cells depend on those bits.

**Why.** numba's row loops have a trip count known only at run time, and their stores
may alias their loads (``W``, ``V``, ``G``, ``D`` are four arrays), so LLVM emits a
runtime overlap test, a vector body, a remainder and a scalar fallback for each, and the
all-zero check on a gap row is a loop of its own before them. Here a ``switch`` on the
width runs once per call into a loop whose entry body is straight line: the rows loaded
once into vectors, the check an ``or`` of vector compares. Gap-Aware's update pass on
mf's rows (rank 32, float32) took 12.2 ns a row against numba's 17.5 (one thread,
scratch run); ``benchmarks/RESULTS.md`` has the rules' live figures.

Only for what :func:`fits` accepts (the widths of :data:`.rowvec.VECTORS`, every row
contiguous); the callers keep their numba loops for the rest, and wherever the kernels
are called from Python (the race explorer, ``NUMBA_DISABLE_JIT``: they return -1).
Nothing is checked here; nothing here imports hogkit.
"""

from numba import njit
from numba.core import config

from .rowvec import VECTOR_BYTES, VECTORS
from .rowvec import fits as _fits


@njit(cache=True, nogil=True, inline="always")
def fits(W, S, G, D):
    """True when the kernels cover the table ``W`` with state ``S`` and entry buffers
    ``G``, ``D`` (pass ``W`` again for one that is absent): :func:`.rowvec.fits` for each
    pair (one width of whole vectors, a number of them in :data:`VECTORS`, every row
    contiguous)."""
    return _fits(W, S) and _fits(G, D) and _fits(W, G)


def gaps(W, rows, B, n, ahead):
    """The gap pass (module docstring). Called from Python (the race explorer runs a
    kernel's Python source; ``NUMBA_DISABLE_JIT``): -1, and the caller runs its loop."""
    return -1


def gap_aware(W, V, rows, G, D, n, ahead, a, gm, g1, bc, cm, tiny):
    """Gap-Aware's update pass (module docstring); from Python -1, as :func:`gaps`."""
    return -1


def dc_adaptive(W, MS, rows, G, D, n, ahead, a, mm, m1, l0, e):
    """Adaptive DC-ASGD's update pass (module docstring); from Python -1, as
    :func:`gaps`."""
    return -1


def undamped(W, S, rows, G, n, ahead, a, keep, fresh):
    """The undamped step of a fresh read (module docstring); from Python -1, as
    :func:`gaps`."""
    return -1


if not config.DISABLE_JIT:
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic, overload

    from .rowvec import item_at, prefetch_lines, splat, tables_ok, vptr, width_switch

    _F = ("reassoc",)                      # delayed.py's flags (_intrinsics.FASTMATH)

    class _Pass:
        """What one pass's IR needs: its first ``arrays`` arguments (the tables,
        ``rows``, the entry buffers), then ``n``, ``ahead`` and the scalars, cast to the
        table's dtype."""

        def __init__(self, context, builder, sig, args, arrays):
            self.c, self.b = context, builder
            self.tys = sig.args[:arrays]
            self.arr = [context.make_array(t)(context, builder, v)
                        for t, v in zip(self.tys, args[:arrays])]
            self.T = T = sig.args[0].dtype
            self.lt = context.get_value_type(T)
            self.vty = ir.VectorType(self.lt, VECTOR_BYTES * 8 // T.bitwidth)
            self.al = T.bitwidth // 8
            self.n, self.ahead = (context.cast(builder, v, t, types.int64)
                                  for v, t in zip(args[arrays:arrays + 2],
                                                  sig.args[arrays:arrays + 2]))
            self.s = [context.cast(builder, v, t, T)
                      for v, t in zip(args[arrays + 2:], sig.args[arrays + 2:])]
            self.zero = context.get_constant(types.intp, 0)

        def ptr(self, k, row):
            """Pointer to row ``row`` of array ``k``."""
            return cgutils.get_item_pointer(self.c, self.b, self.tys[k], self.arr[k],
                                            [row, self.zero])

        def row_of(self, rows_k, i):
            c, b = self.c, self.b
            rty = self.tys[rows_k]
            return c.cast(b, item_at(c, b, rty, self.arr[rows_k], i), rty.dtype, types.intp)

        def load(self, p, nv):
            return [self.b.load(vptr(self.b, p, c, self.vty), align=self.al)
                    for c in range(nv)]

        def store(self, vs, p):
            for c, v in enumerate(vs):
                self.b.store(v, vptr(self.b, p, c, self.vty), align=self.al)

        def splat(self, x):
            return splat(self.b, x, self.vty)

        def loop(self, nv, rows_k, pf_k, body, done):
            """``for i in range(n)``: prefetch row ``rows[i + ahead]`` of array ``pf_k``
            (while inside and ``ahead > 0``), then ``body(self, nv, i, r)``."""
            b, i64 = self.b, ir.IntType(64)
            pos = cgutils.alloca_once_value(b, i64(0))
            cond, blk = (b.append_basic_block(f"rows.k{nv}.{x}") for x in ("cond", "body"))
            b.branch(cond)
            b.position_at_end(cond)
            i = b.load(pos)
            b.cbranch(b.icmp_signed("<", i, self.n), blk, done)
            b.position_at_end(blk)
            ia = b.add(i, self.ahead)
            pf = b.and_(b.icmp_signed(">", self.ahead, i64(0)), b.icmp_signed("<", ia, self.n))
            with b.if_then(pf):
                prefetch_lines(b, self.ptr(pf_k, self.row_of(rows_k, ia)), nv * VECTOR_BYTES)
            body(self, nv, i, self.row_of(rows_k, i))
            b.store(b.add(i, i64(1)), pos)
            b.branch(cond)

    def _codegen(arrays, rows_k, pf_k, body):
        """A pass's IR: a switch on the width, once, into one loop per width; -1 for a
        width not covered."""
        def codegen(context, builder, sig, args):
            s = _Pass(context, builder, sig, args, arrays)
            out = cgutils.alloca_once_value(builder, ir.IntType(64)(0))
            return width_switch(builder, builder.extract_value(s.arr[0].shape, 1), s.vty,
                                "rows", lambda n, done: s.loop(n, rows_k, pf_k, body, done),
                                out)

        return codegen

    def _gaps_body(s, nv, i, r):
        W, B = s.ptr(0, r), s.ptr(2, i)
        b = s.b
        s.store([b.fsub(w, x, flags=_F) for w, x in zip(s.load(W, nv), s.load(B, nv))], B)

    @intrinsic
    def _gaps_ir(typingctx, W, rows, B, n, ahead):
        if not tables_ok(W, B):
            return None
        return types.int64(W, rows, B, n, ahead), _codegen(3, 1, 0, _gaps_body)

    def _vfn(s, name):
        """The vector form of the one-argument intrinsic ``llvm.<name>``."""
        vty = s.vty
        return cgutils.get_or_insert_function(
            s.b.module, ir.FunctionType(vty, [vty]),
            f"llvm.{name}.v{vty.count}{vty.element.intrinsic_name}")

    def _moved(s, ds):
        """True when any lane of the gap row ``ds`` is not 0 (NaN counts as moved)."""
        b = s.b
        zero = ir.Constant(s.vty, None)
        nz = None
        for d in ds:
            m = b.fcmp_unordered("!=", d, zero)
            nz = m if nz is None else b.or_(nz, m)
        bits = b.bitcast(nz, ir.IntType(s.vty.count))
        return b.icmp_unsigned("!=", bits, bits.type(0))

    def _mean_square(s, keep, fresh, olds, gs):
        """``keep·old + fresh·(g·g)`` per vector: the second moment / mean square."""
        b = s.b
        kv, fv = s.splat(keep), s.splat(fresh)
        return [b.fadd(b.fmul(kv, o, flags=_F), b.fmul(fv, b.fmul(g, g, flags=_F),
                                                       flags=_F), flags=_F)
                for o, g in zip(olds, gs)]

    def _rule_body(moved_step):
        """An update pass's entry for a rule with a per-coordinate state ``S`` (arrays
        ``W, S, rows, G, D``; scalars ``a, keep, fresh, ...``): ``S = keep·S +
        fresh·(g·g)``, then ``w - moved_step(...)`` on a row whose gap is not all zeros,
        else ``w - a·g``."""
        def body(s, nv, i, r):
            b = s.b
            Wp, Sp, Gp, Dp = s.ptr(0, r), s.ptr(1, r), s.ptr(3, i), s.ptr(4, i)
            gs, ds = s.load(Gp, nv), s.load(Dp, nv)
            vs = _mean_square(s, s.s[1], s.s[2], s.load(Sp, nv), gs)
            ws = s.load(Wp, nv)
            av = s.splat(s.s[0])
            s.store(vs, Sp)
            with b.if_else(_moved(s, ds)) as (then, other):
                with then:
                    s.store([b.fsub(w, step, flags=_F) for w, step in
                             zip(ws, moved_step(s, gs, ds, vs, av))], Wp)
                with other:
                    s.store([b.fsub(w, b.fmul(av, g, flags=_F), flags=_F)
                             for w, g in zip(ws, gs)], Wp)
        return body

    def _ga_step(s, gs, ds, vs, av):
        """Gap-Aware's damped step ``(g·a)/gap``, ``gap = 1 + |d|/(cm·(sqrt(v·bc) +
        tiny))`` (1 where ``d`` is 0); scalars ``a, gm, g1, bc, cm, tiny``."""
        b = s.b
        bc, cm, tiny = s.s[3:]
        one, zero = ir.Constant(s.vty, [1.0] * s.vty.count), ir.Constant(s.vty, None)
        fabs, sqrt = _vfn(s, "fabs"), _vfn(s, "sqrt")
        bcv, cmv, tv = s.splat(bc), s.splat(cm), s.splat(tiny)
        out = []
        for g, d, v in zip(gs, ds, vs):
            dl = b.call(fabs, [d])
            den = b.fmul(cmv, b.fadd(b.call(sqrt, [b.fmul(v, bcv, flags=_F)]), tv, flags=_F),
                         flags=_F)
            gap = b.select(b.fcmp_unordered("!=", dl, zero),
                           b.fadd(one, b.fdiv(dl, den, flags=_F), flags=_F), one)
            out.append(b.fdiv(b.fmul(g, av, flags=_F), gap, flags=_F))
        return out

    @intrinsic
    def _gap_aware_ir(typingctx, W, V, rows, G, D, n, ahead, a, gm, g1, bc, cm, tiny):
        if not tables_ok(W, V, G, D):
            return None
        sig = types.int64(W, V, rows, G, D, n, ahead, a, gm, g1, bc, cm, tiny)
        return sig, _codegen(5, 2, 1, _rule_body(_ga_step))

    def _dca_step(s, gs, ds, vs, av):
        """Adaptive DC-ASGD's step ``a·(g + ((g·g)·(d·l0))/sqrt(ms + e))`` (``a·g``
        where ``d`` is 0); scalars ``a, mm, m1, l0, e``."""
        b = s.b
        l0, e = s.s[3:]
        zero = ir.Constant(s.vty, None)
        sqrt = _vfn(s, "sqrt")
        ev, lv = s.splat(e), s.splat(l0)
        out = []
        for g, d, v in zip(gs, ds, vs):
            root = b.call(sqrt, [b.fadd(v, ev, flags=_F)])
            corr = b.fdiv(b.fmul(b.fmul(g, g, flags=_F), b.fmul(d, lv, flags=_F), flags=_F),
                          root, flags=_F)
            step = b.select(b.fcmp_ordered("==", d, zero), g, b.fadd(g, corr, flags=_F))
            out.append(b.fmul(step, av, flags=_F))
        return out

    @intrinsic
    def _dc_adaptive_ir(typingctx, W, MS, rows, G, D, n, ahead, a, mm, m1, l0, e):
        if not tables_ok(W, MS, G, D):
            return None
        sig = types.int64(W, MS, rows, G, D, n, ahead, a, mm, m1, l0, e)
        return sig, _codegen(5, 2, 1, _rule_body(_dca_step))

    def _undamped_body(s, nv, i, r):
        """A fresh read's entry (arrays ``W, S, rows, G``; scalars ``a, keep, fresh``):
        :func:`_rule_body`'s unmoved branch, with no gap row loaded or checked."""
        b = s.b
        Wp, Sp, Gp = s.ptr(0, r), s.ptr(1, r), s.ptr(3, i)
        gs = s.load(Gp, nv)
        vs = _mean_square(s, s.s[1], s.s[2], s.load(Sp, nv), gs)
        ws = s.load(Wp, nv)
        av = s.splat(s.s[0])
        s.store(vs, Sp)
        s.store([b.fsub(w, b.fmul(av, g, flags=_F), flags=_F) for w, g in zip(ws, gs)], Wp)

    @intrinsic
    def _undamped_ir(typingctx, W, S, rows, G, n, ahead, a, keep, fresh):
        if not tables_ok(W, S, G):
            return None
        sig = types.int64(W, S, rows, G, n, ahead, a, keep, fresh)
        return sig, _codegen(4, 2, 1, _undamped_body)

    # compiled callers get the IR; Python callers the functions above
    @overload(gaps, inline="always")
    def _gaps_compiled(W, rows, B, n, ahead):
        return lambda W, rows, B, n, ahead: _gaps_ir(W, rows, B, n, ahead)

    @overload(gap_aware, inline="always")
    def _gap_aware_compiled(W, V, rows, G, D, n, ahead, a, gm, g1, bc, cm, tiny):
        return lambda W, V, rows, G, D, n, ahead, a, gm, g1, bc, cm, tiny: _gap_aware_ir(
            W, V, rows, G, D, n, ahead, a, gm, g1, bc, cm, tiny)

    @overload(dc_adaptive, inline="always")
    def _dc_adaptive_compiled(W, MS, rows, G, D, n, ahead, a, mm, m1, l0, e):
        return lambda W, MS, rows, G, D, n, ahead, a, mm, m1, l0, e: _dc_adaptive_ir(
            W, MS, rows, G, D, n, ahead, a, mm, m1, l0, e)

    @overload(undamped, inline="always")
    def _undamped_compiled(W, S, rows, G, n, ahead, a, keep, fresh):
        return lambda W, S, rows, G, n, ahead, a, keep, fresh: _undamped_ir(
            W, S, rows, G, n, ahead, a, keep, fresh)
