"""Matrix factorisation's per-sample spans (SGD, row-wise AdaGrad) and its minibatch
gradient with read copies as straight-line vector code.

``sgd_span(P, Q, u, i, r, t0, m, ahead, pf_end, a, keep, lim, skip)`` runs the ratings
``t = t0 .. t0+m-1`` in order (Hogwild!, Niu et al. 2011; LIBMF's inner loop), each on
its rows ``p = P[u[t]]``, ``q = Q[i[t]]`` of width ``K``::

    e = p·q - r[t]
    if |e| < lim:  p, q = keep·p - (a·e)·q,  keep·q - (a·e)·p     (both from the rows as read)
    else:          left out, counted; with ``skip`` False the span stops there

and returns the ratings left out. ``sgd_span_plain`` drops the ``keep`` multiply (no L2
term: ``keep`` is 1); the ``_pf`` twins first prefetch the rows of rating ``t + ahead``
while it is below ``pf_end`` (``kernels/mf.py``: tables bigger than the cache).
``rowwise_span(P, Q, u, i, r, t0, m, ahead, pf_end, a, reg, lim, skip, SP, SQ, decay,
fresh, eps)`` is the same loop for row-wise AdaGrad / RMSProp (LIBMF's per-row step, the
arithmetic of ``mf._adaptive_body``'s row-wise branch): the three sums ``p·q``, ``|p|²``,
``|q|²`` in one pass, each row's mean square into its one-column state ``SP``/``SQ``,
and ``p -= a / (sqrt(s_p) + eps) · (e·q + reg·p)``.

It is emitted as LLVM IR on vectors of 32 bytes (8 float32 or 4 float64 lanes): a
``switch`` on ``K / lanes``, once per span, picks a loop whose rating body is straight
line for that width. The body loads both rows once, forms the dot product as lane-wise
products summed pairwise then halved across the lanes, and stores both rows as fused
multiply-adds ``fma(-a·e, q, keep·p)`` (``llvm.fmuladd``: fused where the target has FMA).

Why not numba loops: a row loop ``for k in range(K)`` has a trip count known only at run
time, and the stores to ``P`` may alias the loads from ``Q``, so LLVM emits for each of
the rating's three row loops a runtime overlap test, a vector body, a remainder and a
scalar fallback, and loads the rows twice. The plain compiled loop a user writes runs
that code too; this body runs none of it: ~1.6x the plain loop's ratings a second on
mf's default preset, one thread (``benchmarks/RESULTS.md``), and row-wise AdaGrad ~1.6x
numba's loops. A switch per rating in place of per span gave back most of that (~1.25x
the plain loop); AdaGrad's two square roots and divisions as one 2-lane vector gained
nothing (scratch runs).

``grad_rows(P, Q, u, i, r, idx, nb, GP, GQ, RP, RQ, DP, DQ, reg)`` is mf's minibatch
gradient with the read copies (``mf._mf_rows`` with ``copy``: what DC-ASGD and
Gap-Aware need): for ``b < nb`` the rating ``t = idx[b]``'s rows into ``RP[b]``,
``RQ[b]``, its factor rows copied into ``DP[b]``, ``DQ[b]``, and ``GP[b] = e·q + reg·p``,
``GQ[b] = e·p + reg·q`` from the copies. Its dot product is summed in the order LLVM's
loop vectoriser gave numba's loop under reassociation on an Intel Xeon with 32-byte
vectors (:func:`_dot_in_llvm_order`), so every bit is that loop's: the simulated
experiments' stored cells, computed there, depend on them (what it saves the rules'
step: ``benchmarks/RESULTS.md``). numba compiles for the host: on an AMD EPYC (Zen 4)
the loop sums in another order for most widths, while this IR keeps its own, so a
contiguous table gets the same bits on both hosts. Returns 0 when every gradient value
it wrote is finite (checked in registers as it writes them, the guard's sum of ``g -
g``: the step core then skips its scan of the buffers, ~3-5 ns a rating on mf in a
scratch A/B), 1 when one is not, or -1 for a width not covered (:func:`grad_fits`).
The check needs ``x - x`` kept: ``_FLAGS_GRAD`` must not gain ``nnan``/``ninf`` (which
fold it to 0) nor ``nsz`` (under which LLVM folds ``acc + (x - x)`` to ``acc``).

Only for rows :func:`fits` accepts (2-D float tables of one dtype, each row contiguous,
``K`` a whole number of vectors, one to eight or sixteen: :data:`VECTORS`); the span returns -1 for
any other width, and the callers keep their numba loops for those. Rows of ``P`` and
``Q`` must not overlap (two tables), and every index must be inside its table: nothing
is checked here, nothing here imports hogkit.
"""

import numpy as np
from numba import njit
from numba.core import config

#: the vector width in bytes (AVX2's; LLVM splits it on narrower targets) and the row
#: widths covered, in vectors: 8 to 64 float32 coordinates (4 to 32 float64) and 128
#: (64). Each width is a loop of its own; all sixteen up to 128 cost a cold start 1.7 s
#: more compiling than these nine (``benchmarks/RESULTS.md``, the vector spans' compile
#: time)
VECTOR_BYTES, VECTORS = 32, (1, 2, 3, 4, 5, 6, 7, 8, 16)


@njit(cache=True, nogil=True, inline="always")
def fits(P, Q):
    """True when the spans cover the rows of ``P`` and ``Q``: equal widths ``K`` of
    whole vectors, a number of them in :data:`VECTORS`, every row contiguous."""
    K = P.shape[1]
    lanes = VECTOR_BYTES // P.itemsize
    return (Q.shape[1] == K and K % lanes == 0 and K // lanes in VECTORS
            and P.strides[1] == P.itemsize and Q.strides[1] == Q.itemsize)


@njit(cache=True, nogil=True, inline="always")
def grad_fits(P, Q, GP, GQ, DP, DQ):
    """True when :func:`grad_rows` covers factors ``P``, ``Q`` with gradient rows
    ``GP``, ``GQ`` and read copies ``DP``, ``DQ``: :func:`fits` for each pair."""
    return fits(P, Q) and fits(GP, GQ) and fits(DP, DQ) and fits(P, GP) and fits(P, DP)


def grad_rows(P, Q, u, i, r, idx, nb, GP, GQ, RP, RQ, DP, DQ, reg):
    """mf's minibatch gradient with the read copies (module docstring). Called from
    Python (the race explorer runs a kernel's Python source; ``NUMBA_DISABLE_JIT``): -1,
    and the caller runs its loop."""
    return -1


if config.DISABLE_JIT:
    def _py_span(plain):
        def span(P, Q, u, i, r, t0, m, ahead, pf_end, a, keep, lim, skip):
            if not fits(P, Q):
                return -1
            T = P.dtype.type
            bad = 0
            for t in range(t0, t0 + m):
                p, q = P[u[t]].copy(), Q[i[t]].copy()
                e = T(T(p @ q) - T(r[t]))
                if not abs(e) < lim:
                    bad += 1
                    if not skip:
                        return bad
                    continue
                ae = T(a) * e
                P[u[t]] = (p if plain else T(keep) * p) - ae * q
                Q[i[t]] = (q if plain else T(keep) * q) - ae * p
            return bad
        return span

    def _py_rowwise(P, Q, u, i, r, t0, m, ahead, pf_end, a, reg, lim, skip, SP, SQ, decay,
                    fresh, eps):
        if not fits(P, Q):
            return -1
        T = P.dtype.type
        K = T(P.shape[1])
        bad = 0
        for t in range(t0, t0 + m):
            p, q = P[u[t]].copy(), Q[i[t]].copy()
            pred = T(p @ q)
            e = T(pred - T(r[t]))
            if not abs(e) < lim:
                bad += 1
                if not skip:
                    return bad
                continue
            cross = T(2.0) * e * T(reg) * pred
            for W, S, row, mine, other, g in ((P, SP, u[t], p, q, e * q + T(reg) * p),
                                              (Q, SQ, i[t], q, p, e * p + T(reg) * q)):
                ss = max(T(0.0), e * e * T(other @ other) + cross + T(reg) * T(reg) * T(
                    mine @ mine))
                S[row, 0] = S[row, 0] * T(decay) + T(fresh) * (ss / K)
                W[row] = mine - (T(a) / (np.sqrt(S[row, 0]) + T(eps))) * g
        return bad

    sgd_span = sgd_span_pf = _py_span(False)
    sgd_span_plain = sgd_span_pf_plain = _py_span(True)
    rowwise_span = rowwise_span_pf = _py_rowwise

else:
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic, overload

    _FLAGS = ("reassoc", "contract")           # the lane's flags (kernels/mf.py)
    _I32 = ir.IntType(32)

    def vptr(builder, base, c, vty):
        return builder.bitcast(builder.gep(base, [ir.IntType(64)(c * vty.count)]),
                               vty.as_pointer())

    def splat(builder, x, vty):
        v = builder.insert_element(ir.Constant(vty, ir.Undefined), x, _I32(0))
        return builder.shuffle_vector(v, ir.Constant(vty, ir.Undefined),
                                      ir.Constant(ir.VectorType(_I32, vty.count),
                                                  [0] * vty.count))

    def _sum(builder, xs):
        """Pairwise sum of a list of vectors, then halving across the lanes."""
        while len(xs) > 1:
            xs = [builder.fadd(xs[j], xs[j + 1], flags=_FLAGS) if j + 1 < len(xs)
                  else xs[j] for j in range(0, len(xs), 2)]
        v = xs[0]
        n = v.type.count
        undef = ir.Constant(v.type, ir.Undefined)
        while n > 1:
            h = n // 2
            lo = builder.shuffle_vector(v, undef, ir.Constant(ir.VectorType(_I32, h),
                                                              list(range(h))))
            hi = builder.shuffle_vector(v, undef, ir.Constant(ir.VectorType(_I32, h),
                                                              list(range(h, n))))
            v, undef = builder.fadd(lo, hi, flags=_FLAGS), ir.Constant(lo.type,
                                                                     ir.Undefined)
            n = h
        return builder.extract_element(v, _I32(0))

    def _fma(builder, vty):
        """``llvm.fmuladd``: one rounding where the target has fused multiply-add, a
        multiply and an add where it has not (``llvm.fma`` would call libm's ``fmaf``
        per lane there), as the lane's "contract" flag lets numba's loops do."""
        name = f"llvm.fmuladd.v{vty.count}{vty.element.intrinsic_name}"
        return cgutils.get_or_insert_function(builder.module,
                                              ir.FunctionType(vty, [vty] * 3), name)

    def _rating(builder, nv, pp, qq, vty, al, rt, a, keep, lim, plain):
        """One rating on rows of ``nv`` vectors at ``pp``, ``qq``: the error, the guard,
        the update when it passes. Returns ``ok`` (the guard passed); the builder ends in
        a block after the update."""
        ps = [builder.load(vptr(builder, pp, c, vty), align=al) for c in range(nv)]
        qs = [builder.load(vptr(builder, qq, c, vty), align=al) for c in range(nv)]
        dot = _sum(builder, [builder.fmul(p, q, flags=_FLAGS) for p, q in zip(ps, qs)])
        e = builder.fsub(dot, rt, flags=_FLAGS)
        fabs = builder.module.declare_intrinsic("llvm.fabs", [e.type])
        ok = builder.fcmp_ordered("<", builder.call(fabs, [e]), lim)
        with builder.if_then(ok, likely=True):
            nae = splat(builder, builder.fneg(builder.fmul(a, e, flags=_FLAGS)), vty)
            fma = _fma(builder, vty)
            kv = None if plain else splat(builder, keep, vty)
            for c, (p, q) in enumerate(zip(ps, qs)):
                kp = p if plain else builder.fmul(kv, p, flags=_FLAGS)
                kq = q if plain else builder.fmul(kv, q, flags=_FLAGS)
                builder.store(builder.call(fma, [nae, q, kp]), vptr(builder, pp, c, vty),
                              align=al)
                builder.store(builder.call(fma, [nae, p, kq]), vptr(builder, qq, c, vty),
                              align=al)
        return ok

    def item_at(context, builder, aryty, ary, t):
        """``ary[t]`` of a 1-D array (no wraparound: ``t`` is inside)."""
        return builder.load(cgutils.get_item_pointer(context, builder, aryty, ary, [t]))

    def prefetch_lines(builder, base, nbytes):
        """``llvm.prefetch`` (write intent, high locality) of every 64-byte line of the
        ``nbytes`` from ``base``."""
        i8p = ir.IntType(8).as_pointer()
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, _I32, _I32, _I32]),
            "llvm.prefetch.p0")
        raw = builder.bitcast(base, i8p)
        for off in range(0, max(nbytes, 1), 64):
            builder.call(fn, [builder.gep(raw, [ir.IntType(64)(off)]), _I32(1), _I32(3),
                              _I32(1)])

    class _Span:
        """What one span's IR needs: the arrays, the scalars cast to the factors' dtype,
        the accumulators."""

        def __init__(self, context, builder, sig, args):
            self.c, self.b = context, builder
            (self.pty, self.qty, self.uty, self.ity, self.rty) = sig.args[:5]
            self.T = T = self.pty.dtype
            self.lt = context.get_value_type(T)
            self.vty = ir.VectorType(self.lt, VECTOR_BYTES * 8 // T.bitwidth)
            arr = [context.make_array(t)(context, builder, v)
                   for t, v in zip(sig.args[:5], args[:5])]
            self.P, self.Q, self.u, self.i, self.r = arr
            cast = context.cast
            self.t0, self.m, self.ahead, self.pf_end = (
                cast(builder, v, t, types.int64) for v, t in zip(args[5:9], sig.args[5:9]))
            self.a, self.keep, self.lim = (
                cast(builder, v, t, T) for v, t in zip(args[9:12], sig.args[9:12]))
            self.skip = cast(builder, args[12], sig.args[12], types.boolean)
            self.zero = context.get_constant(types.intp, 0)

        def rating(self, n, t, pp, qq, rt, plain):
            """SGD on one rating (:func:`_rating`); returns ``ok``."""
            return _rating(self.b, n, pp, qq, self.vty, self.T.bitwidth // 8, rt, self.a,
                           self.keep, self.lim, plain)

        def prefetch_more(self, ta):
            """What else the ``_pf`` spans prefetch for rating ``ta`` (SGD: nothing)."""

        def row(self, table, tty, index, ity, t):
            """Pointer to ``table[index[t], 0]``."""
            c, b = self.c, self.b
            k = c.cast(b, item_at(c, b, ity, index, t), ity.dtype, types.intp)
            return cgutils.get_item_pointer(c, b, tty, table, [k, self.zero])

        def loop(self, n, plain, prefetching, bad, done):
            """The loop over the span's ratings for rows of ``n`` vectors."""
            b, i64 = self.b, ir.IntType(64)
            pos = cgutils.alloca_once_value(b, i64(0))
            cond, body, fail, nxt = (b.append_basic_block(f"span.k{n}.{x}")
                                     for x in ("cond", "body", "fail", "next"))
            b.branch(cond)
            b.position_at_end(cond)
            k = b.load(pos)
            b.cbranch(b.icmp_signed("<", k, self.m), body, done)
            b.position_at_end(body)
            t = b.add(self.t0, k)
            if prefetching:
                ta = b.add(t, self.ahead)
                with b.if_then(b.icmp_signed("<", ta, self.pf_end)):
                    prefetch_lines(b, self.row(self.P, self.pty, self.u, self.uty, ta),
                              n * VECTOR_BYTES)
                    prefetch_lines(b, self.row(self.Q, self.qty, self.i, self.ity, ta),
                              n * VECTOR_BYTES)
                    self.prefetch_more(ta)
            pp = self.row(self.P, self.pty, self.u, self.uty, t)
            qq = self.row(self.Q, self.qty, self.i, self.ity, t)
            rt = self.c.cast(b, item_at(self.c, b, self.rty, self.r, t), self.rty.dtype, self.T)
            ok = self.rating(n, t, pp, qq, rt, plain)
            b.cbranch(ok, nxt, fail)
            b.position_at_end(fail)
            b.store(b.add(b.load(bad), i64(1)), bad)
            b.cbranch(self.skip, nxt, done)
            b.position_at_end(nxt)
            b.store(b.add(k, i64(1)), pos)
            b.branch(cond)

    def tables_ok(*tables):
        return all(isinstance(A, types.Array) and A.ndim == 2 for A in tables) and \
            all(A.dtype == tables[0].dtype for A in tables) and \
            isinstance(tables[0].dtype, types.Float)

    def _span_intrinsic(plain, prefetching):
        """The SGD span kernel for one (``plain``, ``prefetching``) pair (constants of
        its code): see the module docstring."""
        def typer(typingctx, P, Q, u, i, r, t0, m, ahead, pf_end, a, keep, lim, skip):
            if not tables_ok(P, Q):
                return None
            sig = types.int64(P, Q, u, i, r, t0, m, ahead, pf_end, a, keep, lim, skip)
            return sig, _span_codegen(_Span, plain, prefetching)

        return intrinsic(typer)

    def width_switch(builder, K, vty, name, emit, out):
        """A switch on the row width ``K`` (in vectors of type ``vty``), once, into
        ``emit(n, done)`` for each width of :data:`VECTORS`, which emits that width's
        loop and branches to ``done``; any other width stores -1 into ``out`` (an i64
        slot). Returns ``out``'s value after the switch."""
        i64 = ir.IntType(64)
        done = builder.append_basic_block(f"{name}.done")
        uncovered = builder.append_basic_block(f"{name}.uncovered")
        lanes = K.type(vty.count)
        whole = builder.icmp_unsigned("==", builder.urem(K, lanes), K.type(0))
        nv = builder.select(whole, builder.udiv(K, lanes), K.type(0))   # 0: uncovered
        sw = builder.switch(nv, uncovered)
        for n in VECTORS:
            head = builder.append_basic_block(f"{name}.k{n}")
            sw.add_case(K.type(n), head)
            builder.position_at_end(head)
            emit(n, done)
        builder.position_at_end(uncovered)
        builder.store(i64(-1), out)
        builder.branch(done)
        builder.position_at_end(done)
        return builder.load(out)

    def _span_codegen(cls, plain, prefetching):
        """The IR of a span whose rating body is ``cls``'s: a switch on the row width,
        once, into one loop per width."""
        def codegen(context, builder, signature, args):
            s = cls(context, builder, signature, args)
            bad = cgutils.alloca_once_value(builder, ir.IntType(64)(0))
            return width_switch(builder, builder.extract_value(s.P.shape, 1), s.vty, "span",
                                lambda n, done: s.loop(n, plain, prefetching, bad, done), bad)

        return codegen

    class _RowwiseSpan(_Span):
        """Row-wise AdaGrad / RMSProp (LIBMF's per-row step): the first 13 arguments as
        SGD's, with ``reg`` in ``keep``'s place, then ``SP, SQ, decay, fresh, eps``."""

        def __init__(self, context, builder, sig, args):
            super().__init__(context, builder, sig, args)
            self.reg = self.keep
            self.spty, self.sqty = sig.args[13:15]
            self.SP, self.SQ = (context.make_array(t)(context, builder, v)
                                for t, v in zip(sig.args[13:15], args[13:15]))
            self.decay, self.fresh, self.eps = (
                context.cast(builder, v, t, self.T) for v, t in zip(args[15:18],
                                                                    sig.args[15:18]))

        def prefetch_more(self, ta):
            b = self.b
            prefetch_lines(b, self.row(self.SP, self.spty, self.u, self.uty, ta), 1)
            prefetch_lines(b, self.row(self.SQ, self.sqty, self.i, self.ity, ta), 1)

        def rating(self, n, t, pp, qq, rt, plain):
            """One rating of ``mf._adaptive_body``'s row-wise branch: the three sums in
            one pass, the error, the guard, each row's mean square into its state, and
            ``p -= a / (sqrt(s_p) + eps) · (e·q + reg·p)`` (as fused multiply-adds)."""
            b, vty, lt = self.b, self.vty, self.lt
            al = self.T.bitwidth // 8
            ps = [b.load(vptr(b, pp, c, vty), align=al) for c in range(n)]
            qs = [b.load(vptr(b, qq, c, vty), align=al) for c in range(n)]
            f = _FLAGS
            pred = _sum(b, [b.fmul(p, q, flags=f) for p, q in zip(ps, qs)])
            spp = _sum(b, [b.fmul(p, p, flags=f) for p in ps])
            sqq = _sum(b, [b.fmul(q, q, flags=f) for q in qs])
            e = b.fsub(pred, rt, flags=f)
            fabs = b.module.declare_intrinsic("llvm.fabs", [lt])
            ok = b.fcmp_ordered("<", b.call(fabs, [e]), self.lim)
            with b.if_then(ok, likely=True):
                reg, zero = self.reg, ir.Constant(lt, 0.0)
                cross = b.fmul(b.fmul(b.fmul(ir.Constant(lt, 2.0), e, flags=f), reg,
                                      flags=f), pred, flags=f)
                ee, rr = b.fmul(e, e, flags=f), b.fmul(reg, reg, flags=f)
                K = b.sitofp(b.extract_value(self.P.shape, 1), lt)
                sqrt = b.module.declare_intrinsic("llvm.sqrt", [lt])
                steps = []
                for mine, other, S, sty, idx, ity in (
                        (spp, sqq, self.SP, self.spty, self.u, self.uty),
                        (sqq, spp, self.SQ, self.sqty, self.i, self.ity)):
                    ss = b.fadd(b.fadd(b.fmul(ee, other, flags=f), cross, flags=f),
                                b.fmul(rr, mine, flags=f), flags=f)
                    ss = b.select(b.fcmp_ordered(">", ss, zero), ss, zero)
                    sptr = self.row(S, sty, idx, ity, t)
                    sv = b.fadd(b.fmul(b.load(sptr), self.decay, flags=f),
                                b.fmul(self.fresh, b.fdiv(ss, K, flags=f), flags=f), flags=f)
                    b.store(sv, sptr)
                    den = b.fadd(b.call(sqrt, [sv]), self.eps, flags=f)
                    steps.append(splat(b, b.fneg(b.fdiv(self.a, den, flags=f)), vty))
                fma = _fma(b, vty)
                ev, rv = splat(b, e, vty), splat(b, reg, vty)
                for c, (p, q) in enumerate(zip(ps, qs)):
                    gp = b.call(fma, [ev, q, b.fmul(rv, p, flags=f)])
                    gq = b.call(fma, [ev, p, b.fmul(rv, q, flags=f)])
                    b.store(b.call(fma, [steps[0], gp, p]), vptr(b, pp, c, vty), align=al)
                    b.store(b.call(fma, [steps[1], gq, q]), vptr(b, qq, c, vty), align=al)
            return ok

    def _rowwise_intrinsic(prefetching):
        """The row-wise adaptive span kernel, with or without the prefetch."""
        def typer(typingctx, P, Q, u, i, r, t0, m, ahead, pf_end, a, reg, lim, skip, SP, SQ,
                  decay, fresh, eps):
            if not tables_ok(P, Q, SP, SQ):
                return None
            sig = types.int64(P, Q, u, i, r, t0, m, ahead, pf_end, a, reg, lim, skip, SP, SQ,
                              decay, fresh, eps)
            return sig, _span_codegen(_RowwiseSpan, False, prefetching)

        return intrinsic(typer)

    rowwise_span = _rowwise_intrinsic(False)
    rowwise_span_pf = _rowwise_intrinsic(True)
    sgd_span = _span_intrinsic(False, False)
    sgd_span_plain = _span_intrinsic(True, False)
    sgd_span_pf = _span_intrinsic(False, True)
    sgd_span_pf_plain = _span_intrinsic(True, True)

    def _dot_in_llvm_order(b, ps, qs, vty):
        """``p·q`` in the order LLVM's loop vectoriser summed ``mf._dot``'s reduction under
        reassociation on the Intel Xeon it was read on (the numba kernel's optimised IR),
        so the value is that loop's to the bit (another host's LLVM may choose other
        vectors: ``tests/test_kernels.py`` holds this order to a numpy reference): a
        main loop of four accumulators of one vector each (32 bytes) over blocks of
        four vectors, the first starting at ``<0, -0, ...>`` and the others at
        ``-0``, summed ``((a1 + a0) + a2) + a3`` and halved across the lanes; then an
        epilogue of 4 lanes from ``<that sum, -0, -0, -0>`` over what is left (rows
        narrower than four vectors: all of it, from ``<0, -0, -0, -0>``), halved. Each
        stage ends in ``-0 + x``."""
        f = _FLAGS_GRAD
        lt, lanes = vty.element, vty.count
        prods = [b.fmul(p, q, flags=f) for p, q in zip(ps, qs)]
        nz = ir.Constant(lt, -0.0)

        def halve(v):
            n = v.type.count
            undef = ir.Constant(v.type, ir.Undefined)
            while n > 1:
                h = n // 2
                mask = list(range(h, n)) + [0] * (v.type.count - h)
                shuf = b.shuffle_vector(v, undef, ir.Constant(
                    ir.VectorType(_I32, v.type.count), mask))
                v = b.fadd(v, shuf, flags=f)
                n = h
            return b.fadd(nz, b.extract_element(v, _I32(0)), flags=f)

        total = ir.Constant(lt, 0.0)
        main = len(prods) // 4
        if main:
            accs = [ir.Constant(vty, [0.0] + [-0.0] * (lanes - 1))] + \
                [ir.Constant(vty, [-0.0] * lanes)] * 3
            for j in range(main):
                accs = [b.fadd(a, prods[4 * j + c], flags=f) for c, a in enumerate(accs)]
            acc = b.fadd(b.fadd(b.fadd(accs[1], accs[0], flags=f), accs[2], flags=f),
                         accs[3], flags=f)
            total = halve(acc)
        rest = prods[4 * main:]
        if rest:
            v4 = ir.VectorType(lt, 4)
            acc = b.insert_element(ir.Constant(v4, [0.0, -0.0, -0.0, -0.0]), total, _I32(0))
            undef = ir.Constant(vty, ir.Undefined)
            for v in rest:
                for lo in range(0, lanes, 4):
                    piece = v if lanes == 4 else b.shuffle_vector(
                        v, undef, ir.Constant(ir.VectorType(_I32, 4), list(range(lo, lo + 4))))
                    acc = b.fadd(acc, piece, flags=f)
            total = halve(acc)
        return total

    _FLAGS_GRAD = ("reassoc",)          # mf_gradient's flags (kernels/mf.py: _FM); no
    #                                     nnan/ninf/nsz: the finite check sums g - g

    def _grad_codegen(context, builder, sig, args):
        """:func:`grad_rows`'s IR: a switch on the width, once, into a loop per width."""
        b = builder
        tys = sig.args
        P, Q, u, i, r, idx, _, GP, GQ, RP, RQ, DP, DQ, _ = (
            context.make_array(t)(context, b, v) if isinstance(t, types.Array) else v
            for t, v in zip(tys, args))
        T = tys[0].dtype
        lt = context.get_value_type(T)
        vty = ir.VectorType(lt, VECTOR_BYTES * 8 // T.bitwidth)
        al = T.bitwidth // 8
        nb = context.cast(b, args[6], tys[6], types.int64)
        reg = context.cast(b, args[13], tys[13], T)
        zero = context.get_constant(types.intp, 0)
        dbl = ir.DoubleType()

        def rowp(aty, ary, row):
            return cgutils.get_item_pointer(context, b, aty, ary, [row, zero])

        def item(k, ary, t):
            return item_at(context, b, tys[k], ary, t)

        out = cgutils.alloca_once_value(b, ir.IntType(64)(0))
        chk = cgutils.alloca_once_value(b, ir.Constant(vty, None))   # sum of g - g

        def emit(nv, done):
            with cgutils.for_range(b, nb) as loop:
                k = loop.index
                t = context.cast(b, item(5, idx, k), tys[5].dtype, types.intp)
                uu = context.cast(b, item(2, u, t), tys[2].dtype, types.intp)
                ii = context.cast(b, item(3, i, t), tys[3].dtype, types.intp)
                for rk, R, x in ((9, RP, uu), (10, RQ, ii)):
                    b.store(context.cast(b, x, types.intp, tys[rk].dtype),
                            cgutils.get_item_pointer(context, b, tys[rk], R, [k]))
                pp, qq = rowp(tys[0], P, uu), rowp(tys[1], Q, ii)
                ps = [b.load(vptr(b, pp, c, vty), align=al) for c in range(nv)]
                qs = [b.load(vptr(b, qq, c, vty), align=al) for c in range(nv)]
                dp, dq = rowp(tys[11], DP, k), rowp(tys[12], DQ, k)
                for c in range(nv):
                    b.store(ps[c], vptr(b, dp, c, vty), align=al)
                    b.store(qs[c], vptr(b, dq, c, vty), align=al)
                pred = _dot_in_llvm_order(b, ps, qs, vty)
                rt = context.cast(b, item(4, r, t), tys[4].dtype, types.float64)
                pd = b.fpext(pred, dbl) if T.bitwidth == 32 else pred
                ne = b.fsub(pd, rt, flags=_FLAGS_GRAD)
                ne = b.fptrunc(ne, lt) if T.bitwidth == 32 else ne
                nev, rv = splat(b, ne, vty), splat(b, reg, vty)
                gp, gq = rowp(tys[7], GP, k), rowp(tys[8], GQ, k)
                f = _FLAGS_GRAD
                acc = b.load(chk)
                for c in range(nv):
                    vp = b.fadd(b.fmul(nev, qs[c], flags=f), b.fmul(ps[c], rv, flags=f),
                                flags=f)
                    vq = b.fadd(b.fmul(nev, ps[c], flags=f), b.fmul(qs[c], rv, flags=f),
                                flags=f)
                    b.store(vp, vptr(b, gp, c, vty), align=al)
                    b.store(vq, vptr(b, gq, c, vty), align=al)
                    acc = b.fadd(acc, b.fadd(b.fsub(vp, vp, flags=f), b.fsub(vq, vq, flags=f),
                                             flags=f), flags=f)
                b.store(acc, chk)
            nz = b.fcmp_unordered("!=", b.load(chk), ir.Constant(vty, None))
            bits = b.bitcast(nz, ir.IntType(vty.count))
            with b.if_then(b.icmp_unsigned("!=", bits, bits.type(0))):
                b.store(ir.IntType(64)(1), out)      # a value not finite: the guard decides
            b.branch(done)

        return width_switch(b, b.extract_value(P.shape, 1), vty, "grad", emit, out)

    @intrinsic
    def _grad_rows_ir(typingctx, P, Q, u, i, r, idx, nb, GP, GQ, RP, RQ, DP, DQ, reg):
        if not tables_ok(P, Q, GP, GQ, DP, DQ):
            return None
        sig = types.int64(P, Q, u, i, r, idx, nb, GP, GQ, RP, RQ, DP, DQ, reg)
        return sig, _grad_codegen

    @overload(grad_rows, inline="always")       # compiled callers get the IR
    def _grad_rows_compiled(P, Q, u, i, r, idx, nb, GP, GQ, RP, RQ, DP, DQ, reg):
        return lambda P, Q, u, i, r, idx, nb, GP, GQ, RP, RQ, DP, DQ, reg: _grad_rows_ir(
            P, Q, u, i, r, idx, nb, GP, GQ, RP, RQ, DP, DQ, reg)
