"""The adjoint of a scan: a scan in reverse time over the stored states.

Take a scan (:mod:`texpr.scan`) with states ``S_a`` of shape ``(T,) + R_a``,
init extent ``L``, body stages ``B`` and updates ``U_a``, and the heads
``H_a`` (shape ``P + (T,) + R_a``, ``P`` the prefix). The adjoint ``G_a`` of
the whole sequence ``S_a`` satisfies, for every step ``t``::

    G_a[t] = H_a[t] + sum_b sum_k [L <= t + k < T] (d U_b[t + k] / d S_a[t])^T G_b[t + k]

where ``k`` runs over the offsets at which the body reads ``S_a`` (``S_a[t' - k]``
at step ``t'``): a recurrence backwards in time. It is built as one scan in
reversed time ``tau = T - 1 - t`` with states ``Q_a`` of shape
``(T,) + P + R_a`` (``Q_a[tau] = G_a[T - 1 - tau]``):

* ``Q_a[0] = H_a[T - 1]`` (the init, one step: nothing follows the last step);
* ``Q_a[tau] = H_a[T - 1 - tau] + sum_k C_{a,k}[tau]`` where ``C_{a,k}`` is the
  adjoint of the body at step ``t' = T - 1 - tau + k`` w.r.t. its read
  ``S_a[t' - k]``, with the heads ``Q_b[tau - k]``, guarded by ``tau >= k`` and
  ``t' >= L`` (the body runs at those steps only).

``C_{a,k}`` comes from the ordinary Jacobian machinery
(:func:`texpr.jacobian.contribution`) applied to the *step graph*: the body
stages without their time axis (the step is a free variable ``t``), each read
``S_a[t - k, i]`` replaced by a placeholder ``lag_{a,k}[i]``. Its stages are
then placed in the reverse scan's body (leading axis ``tau``, the step
``t = T - 1 - tau + k``), reading the forward values they need from the stored
states (``lag_{c,m}`` -> ``S_c[t - m]``) and from the *unrolled* body: the
body stages computed for all steps at once from the stored states (outside
any scan, in parallel). Work and memory are linear in ``T``.

Then ``G_a[p, t] = Q_a[T - 1 - t, p]``; an init receives ``G_a`` at its ``L``
steps; an external input ``X`` receives the adjoint of the unrolled body with
the heads ``G_b`` on the updates at the steps ``t >= L`` (the ordinary
contributions, summed over all steps). The reverse scan is a scan like any
other, so the gradient of a gradient goes through the same construction.
"""

from . import dtypes as dt
from .adjoint_stages import sum_stage
from .errors import TexprError
from .expr import Load, Reduce, const, load, select, var, iter_var, cast
from .jacobian import contribution
from .scan import ScanOp, affine_in
from .tensor import ComputeOp, PlaceholderOp, ScatterAddOp
from .visitor import substitute, transform


def _axes(shape, prefix):
    return tuple(iter_var(0, n, f"{prefix}{d}", "spatial") for d, n in enumerate(shape))


def _remap_loads(e, fn):
    """``e`` with each load replaced by ``fn(load)`` (None keeps it)."""
    return transform(e, lambda node: fn(node) if isinstance(node, Load) else None)


def _guard(body, cond):
    """A stage body restricted to where ``cond`` holds (zero / the identity outside)."""
    if cond is None:
        return body
    out = []
    for b in body:
        if isinstance(b, Reduce):
            args = tuple(b.source) + (b.where & cond,)
            out.append(Reduce._rebuild(b.attr, args))
        else:
            out.append(select(cond, b, const(0, b.dtype)))
    return tuple(out)


def _accumulate(ops, seeds, targets, cache):
    """Reverse accumulation over the compute stages ``ops`` (producers first) from
    ``seeds`` ({id(tensor): (tensor, head)}); returns {id(target): (target, adjoint)}
    for the tensors among ``targets`` (ids) that receive contributions."""
    inside = {id(o) for op in ops for o in op.outputs}
    parts = {}
    adj = {}
    for tid, (t, h) in seeds.items():
        parts.setdefault(tid, (t, []))[1].append(h)
    for op in reversed(ops):
        for out in op.outputs:
            got = parts.get(id(out))
            if got is None or not dt.is_float(out.dtype):
                continue
            hs = got[1]
            h = hs[0] if len(hs) == 1 else sum_stage(out, hs, f"d_{out.name}")
            adj[id(out)] = h
            seen = set()
            for inp in op.input_tensors():
                if id(inp) in seen or not dt.is_float(inp.dtype):
                    continue
                if id(inp) not in inside and id(inp) not in targets:
                    continue
                seen.add(id(inp))
                c = contribution(out, inp, h, cache)
                if c is not None:
                    parts.setdefault(id(inp), (inp, []))[1].append(c)
    result = {}
    for tid in targets:
        got = parts.get(tid)
        if got is None:
            continue
        t, cs = got
        result[tid] = (t, cs[0] if len(cs) == 1 else sum_stage(t, cs, f"d_{t.name}"))
    return result


class _ScanAdjoint:
    """Builds the contributions of one scan to its inputs (see the module docstring)."""

    def __init__(self, op, heads, prefix):
        self.op, self.heads, self.prefix = op, list(heads), tuple(prefix)
        self.T, self.L = op.time_extent, op.init_extent
        self.states = op.state_placeholder
        self.state_index = {id(s): a for a, s in enumerate(self.states)}
        self.dtypes = [dt.promote(h.dtype, s.dtype) if h is not None else s.dtype
                       for h, s in zip(self.heads, self.states)]
        self.external_ids = {id(t) for t in op.externals}

    # -- the body for all steps at once, from the stored states --
    def unrolled(self):
        op = self.op
        tmap = {id(s): o for s, o in zip(self.states, op.outputs)}
        self.unrolled_of = {}
        ops = []
        for b in op.body_ops:
            axis = _axes(b.shape, "u")
            t = axis[0]
            body = tuple(substitute(e, dict(zip(b.axis, axis))) for e in b.body)
            body = tuple(_remap_loads(e, lambda ld: load(tmap[id(ld.tensor)], ld.args)
                                      if id(ld.tensor) in tmap else None) for e in body)
            body = _guard(body, t >= self.L)
            new = ComputeOp(f"{b.name}_unrolled", axis, body, tag="scan_unrolled",
                            attrs={"of": op.name})
            for old, o in zip(b.outputs, new.outputs):
                tmap[id(old)] = o
                self.unrolled_of[id(old)] = o
            ops.append(new)
        self.unrolled_ops = ops
        return ops

    # -- one step of the body: no time axis, lags as placeholders --
    def step_graph(self):
        op = self.op
        self.t_step = var("t")
        self.lags = {}  # (a, k) -> placeholder
        self.step_of = {}  # id(body tensor) -> step tensor
        self.forward_of = {}  # id(step tensor) -> unrolled tensor
        ops = []
        for b in op.body_ops:
            axis = _axes(b.shape[1:], "i")
            mapping = dict(zip(b.axis, (self.t_step,) + axis))
            body = tuple(substitute(e, mapping) for e in b.body)
            body = tuple(_remap_loads(e, self._step_load) for e in body)
            new = ComputeOp(f"{b.name}_step", axis, body, tag="scan_step",
                            attrs={"of": op.name})
            for old, o in zip(b.outputs, new.outputs):
                self.step_of[id(old)] = o
                self.forward_of[id(o)] = self.unrolled_of[id(old)]
            ops.append(new)
        self.step_ops = ops
        return ops

    def _step_load(self, ld):
        t = ld.tensor
        a = self.state_index.get(id(t))
        if a is not None:
            k = -affine_in(ld.args[0], self.t_step)[1]
            lag = self.lags.get((a, k))
            if lag is None:
                s = self.states[a]
                lag = PlaceholderOp(f"{s.name}_lag{k}", tuple(s.shape[1:]), s.dtype).output(0)
                self.lags[(a, k)] = lag
            return load(lag, ld.args[1:])
        step = self.step_of.get(id(t))
        if step is not None:
            return load(step, ld.args[1:])
        return None

    def build(self, wanted):
        """{id(inp): (inp, contribution)} for the inputs in ``wanted`` (ids)."""
        op, T, L, P = self.op, self.T, self.L, self.prefix
        result = {}

        def add(t, c):
            got = result.get(id(t))
            if got is None:
                result[id(t)] = (t, [c])
            else:
                got[1].append(c)

        if T > L:
            self.unrolled()
            self.step_graph()
            Q = self.reverse_scan()
        else:
            Q = None
        # the adjoint of each whole state sequence, G_a[p, t] (prefix first)
        G = []
        for a, s in enumerate(self.states):
            out = op.outputs[a]
            if Q is None:
                G.append(self.heads[a])
                continue
            p = _axes(P, "p")
            tt = _axes(out.shape, "j")
            q = Q[a]
            G.append(ComputeOp(f"d_{out.name}_seq", p + tt,
                               (q[(T - 1 - tt[0],) + p + tt[1:]],), tag="scan_adjoint_sequence",
                               attrs={"of": op.name}).output(0))
        for a, init in enumerate(op.init):
            if id(init) not in wanted or G[a] is None:
                continue
            p = _axes(P, "p")
            jj = _axes(init.shape, "j")
            g = G[a]
            add(init, ComputeOp(f"d_{init.name}__{op.name}", p + jj, (g[p + jj],),
                                tag="adjoint_contribution",
                                attrs={"out": op.outputs[a].name, "inp": init.name}).output(0))
        ext = [t for t in op.externals if id(t) in wanted]
        if Q is not None and ext:
            seeds = {}
            for a, u in enumerate(op.update):
                p = _axes(P, "p")
                tt = _axes(u.shape, "j")
                g = G[a]
                h = ComputeOp(f"d_{u.name}_unrolled", p + tt,
                              (select(tt[0] >= L, g[p + tt], const(0, g.dtype)),),
                              tag="scan_update_head", attrs={"of": op.name}).output(0)
                uu = self.unrolled_of[id(u)]
                seeds[id(uu)] = (uu, h)
            got = _accumulate(self.unrolled_ops, seeds, {id(t) for t in ext}, {})
            for tid, (t, c) in got.items():
                add(t, c)
        return {tid: (t, cs[0] if len(cs) == 1 else sum_stage(t, cs, f"d_{t.name}__{op.name}"))
                for tid, (t, cs) in result.items()}

    def reverse_scan(self):
        op, T, L, P = self.op, self.T, self.L, self.prefix
        n = len(self.states)
        thetas = []
        seeds = {}
        for b, u in enumerate(op.update):
            th = PlaceholderOp(f"d_{u.name}_step", P + tuple(u.shape[1:]),
                               self.dtypes[b]).output(0)
            thetas.append(th)
            us = self.step_of[id(u)]
            seeds[id(us)] = (us, th)
        lag_ids = {id(lag): key for key, lag in self.lags.items()}
        step_adj = _accumulate(self.step_ops, seeds, set(lag_ids), {})
        qhat = [PlaceholderOp(f"d_{s.name}_rev", (T,) + P + tuple(s.shape[1:]), self.dtypes[a])
                .output(0) for a, s in enumerate(self.states)]
        theta_of = {id(th): b for b, th in enumerate(thetas)}
        memo = {}

        def inst(t, k):
            """The step-adjoint tensor ``t`` as a reverse-body stage at offset ``k``."""
            key = (id(t.op), k)
            if key not in memo:
                memo[key] = self._instantiate(t.op, k, inst, theta_of, qhat)
            return memo[key][t.value_index]

        inits, updates = [], []
        for a, s in enumerate(self.states):
            Ra = tuple(s.shape[1:])
            h = self.heads[a]
            dtype = self.dtypes[a]
            # init: the last step's head
            ax = _axes((1,) + P + Ra, "j")
            body = (h[ax[1:1 + len(P)] + (T - 1,) + ax[1 + len(P):]] if h is not None
                    else const(0, dtype))
            inits.append(ComputeOp(f"d_{s.name}_rev_init", ax, (_cast(body, dtype),),
                                   tag="scan_adjoint_init").output(0))
            ax = _axes((T,) + P + Ra, "j")
            tau, rest = ax[0], ax[1:]
            terms = []
            if h is not None:
                terms.append(h[rest[:len(P)] + (T - 1 - tau,) + rest[len(P):]])
            for (a2, k), lag in sorted(self.lags.items(), key=lambda kv: kv[0]):
                if a2 != a or id(lag) not in step_adj:
                    continue
                c = step_adj[id(lag)][1]
                terms.append(inst(c, k)[(tau,) + rest])
            body = terms[0] if terms else const(0, dtype)
            for x in terms[1:]:
                body = body + x
            updates.append(ComputeOp(f"d_{s.name}_rev_update", ax, (_cast(body, dtype),),
                                     tag="scan_adjoint_update").output(0))
        rev = ScanOp(f"d_{op.name}", inits, updates, qhat, tag="scan_adjoint",
                     attrs={"of": op.name})
        return rev.outputs

    def _instantiate(self, sop, k, inst, theta_of, qhat):
        """The step-graph stage ``sop`` as a stage of the reverse scan's body at
        offset ``k``: leading axis ``tau``, the step ``t = T - 1 - tau + k``."""
        if isinstance(sop, ScatterAddOp):
            sop = _as_gather(sop)
        if not isinstance(sop, ComputeOp):
            raise TexprError(f"scan adjoint: unexpected stage {sop.name} "
                             f"({type(sop).__name__}) in the step graph")
        T, L = self.T, self.L
        tau = iter_var(0, T, "tau", "spatial")
        axis = (tau,) + _axes(sop.shape, "j")
        step = (T - 1 + k) - tau
        mapping = {self.t_step: step}
        mapping.update(zip(sop.axis, axis[1:]))
        lag_key = {id(lag): key for key, lag in self.lags.items()}

        def remap(ld):
            t = ld.tensor
            b = theta_of.get(id(t))
            if b is not None:
                return load(qhat[b], (tau - k,) + ld.args)
            key = lag_key.get(id(t))
            if key is not None:
                c, m = key
                return load(self.op.outputs[c], (step - m,) + ld.args)
            fwd = self.forward_of.get(id(t))
            if fwd is not None:
                return load(fwd, (step,) + ld.args)
            if id(t) in self.external_ids or isinstance(t.op, PlaceholderOp):
                return None
            return load(inst(t, k), (tau,) + ld.args)

        body = tuple(_remap_loads(substitute(e, mapping), remap) for e in sop.body)
        conds = []
        if k >= 1:  # at tau < k the step T - 1 - tau + k is past the last one
            conds.append(tau >= k)
        if T - 1 - L + k < T - 1:
            conds.append(tau <= T - 1 - L + k)
        cond = None
        for c in conds:
            cond = c if cond is None else cond & c
        body = _guard(body, cond)
        new = ComputeOp(f"{sop.name}_rev{k}", axis, body, tag=sop.tag, attrs=sop.attrs)
        return new.outputs


def _as_gather(sop):
    """A scatter-add stage (the adjoint of a data-dependent gather in the body) as
    the equivalent compute stage, which a scan's body can hold: ``out[j] = init[j] +
    sum_q select(where(q) && index(q) == j, value(q), 0)``. An index out of range
    adds nothing here; the forward body's own load of that index raises first
    (the reverse scan reads the forward states)."""
    from .expr import all_of
    from .reduction import sum as te_sum

    j = _axes(sop.shape, "j")
    q = tuple(iter_var(a.dom[0], a.dom[1], a.name, "reduce") for a in sop.axis)
    m = dict(zip(sop.axis, q))
    hit = all_of([substitute(sop.where, m)]
                 + [substitute(i, m) == jj for i, jj in zip(sop.indices, j)])
    value = substitute(sop.value, m)
    term = select(hit, value, const(0, value.dtype))
    body = te_sum(term, axis=list(q)) if q else term
    if q and (sop.init is not None or body.dtype != sop.dtypes[0]):
        # a reduction stays at the top of its stage: the sum is a stage of its own,
        # which the init is added to (an init under the sum's + was refused as "a
        # reduction below the top of a body" by the evaluator and codegen)
        summed = ComputeOp(f"{sop.name}_sum", j, (body,), tag="adjoint_contribution")
        j = _axes(sop.shape, "j")
        body = summed.output(0)[j]
    body = _cast(body, sop.dtypes[0])
    if sop.init is not None:
        body = sop.init[j] + body
    return ComputeOp(sop.name, j, (body,), tag="adjoint_contribution")


def _cast(e, dtype):
    return e if e.dtype == dtype else cast(e, dtype)


def scan_contributions(op, heads, prefix, wanted):
    """The adjoint contributions of the scan ``op`` to its inputs.

    Args:
        op: a :class:`texpr.scan.ScanOp`.
        heads: one entry per output: its adjoint (shape ``prefix + out.shape``) or None.
        prefix: the heads' common prefix (tuple of ints).
        wanted: ids of the input tensors that need an adjoint.
    Returns:
        ``{id(inp): (inp, Tensor of shape prefix + inp.shape)}`` for the wanted
        inputs that receive a (structurally nonzero) contribution.
    """
    return _ScanAdjoint(op, heads, prefix).build(set(wanted))
