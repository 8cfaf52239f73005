"""Residue classes and kernel taps: the transformations that make a contraction
instance's indices affine and its box fit its domain.

One job: steps 1 and 2 of :mod:`codegen.analysis.contraction`'s matching (its
module docstring), on its instances (``_Instance``: axes, loads, conjuncts,
and ``subst`` to make a new one): :func:`_split` into the residue classes of
the axes under a ``//`` or ``%``, :func:`_tap` replacing a reduction axis by a
narrow operand dimension's taps.
"""

import math

from texpr import expr as E
from texpr.simplify.isl_bridge import VarSpace, box_set, to_pwaff
from texpr.visitor import post_order

from .affine import affine_form as _affine

__all__ = []


def _range(pa, box):
    """``(min, max)`` of a PwAff over ``box`` (non-empty)."""
    p = pa.intersect_domain(box)
    return p.min_val().to_python(), p.max_val().to_python()


def _split(inst, moduli, kinds_done="split"):
    """The instances of the residue classes of the axes in ``moduli``
    (id(axis) -> m): ``axis = m * axis' + a``, empty classes dropped."""
    by_id = {id(a): a for a in inst.axes}
    split_axes = [by_id[i] for i in moduli]
    classes = [[]]
    for a in split_axes:
        m = moduli[id(a)]
        classes = [c + [r] for c in classes for r in range(m)]
    out = []
    for cls in classes:
        mapping, spatial, ostr, reduce_ = {}, [], [], []
        off = inst.out_offset
        new = {}
        empty = False
        for a, r in zip(split_axes, cls):
            m = moduli[id(a)]
            lo = -((r - a.dom[0]) // m)  # ceil((lo - r) / m)
            hi = (a.dom[1] - 1 - r) // m + 1
            if hi <= lo:
                empty = True
                break
            v = E.iter_var(lo, hi, f"{a.name}{m}r{r}", a.kind)
            mapping[a] = v * m + r
            new[id(a)] = (v, m, r)
        if empty:
            continue
        for a, s in zip(inst.spatial, inst.out_strides):
            if id(a) in new:
                v, m, r = new[id(a)]
                spatial.append(v)
                ostr.append(s * m)
                off += s * r
            else:
                spatial.append(a)
                ostr.append(s)
        for a in inst.reduce:
            reduce_.append(new[id(a)][0] if id(a) in new else a)
        out.append(inst.subst(mapping, spatial, ostr, off, reduce_, split=True))
    return out


def _residue_moduli(inst):
    """id(axis) -> the lcm of the divisors of the ``//`` and ``%`` it appears under."""
    mod = {}
    ids = {id(a) for a in inst.axes}
    exprs = [a for _, args in inst.loads for a in args] + inst.conjuncts
    for n in post_order(exprs):
        if isinstance(n, (E.FloorDiv, E.FloorMod)) and isinstance(n.b, E.Const) \
                and isinstance(n.b.value, int) and n.b.value >= 2:
            for v in post_order(n.a):
                if isinstance(v, E.IterVar) and id(v) in ids:
                    mod[id(v)] = math.lcm(mod.get(id(v), 1), n.b.value)
    return mod


def _tap(inst):
    """The instances with reduction axes replaced by the taps of narrow operand
    dimensions (see the module docstring), or None when there is none."""
    axes = inst.axes
    space = VarSpace(axes)
    box = box_set(space)
    red_ids = {id(a) for a in inst.reduce}
    for li, (t, args) in enumerate(inst.loads):
        for d, (ix, n) in enumerate(zip(args, t.shape)):
            aff = _affine(ix, axes, space, box)
            if aff is None:
                continue
            coefs, const = aff
            rs = [k for k, a in enumerate(axes) if coefs[k] and id(a) in red_ids]
            if len(rs) != 1:
                continue
            lo, hi = _range(to_pwaff(ix, space), box)
            if hi - lo + 1 <= 2 * n:
                continue
            kr = rs[0]
            r, cr = axes[kr], coefs[kr]
            m = abs(cr)
            moduli = {id(a): m for k, a in enumerate(axes)
                      if k != kr and coefs[k] and coefs[k] % m and a.kind == "spatial"}
            if any(coefs[k] % m for k, a in enumerate(axes) if k != kr and coefs[k]
                   and a.kind != "spatial"):
                continue
            pieces = _split(inst, moduli) if moduli else [inst]
            out = []
            for p in pieces:
                pa = p.axes
                psp = VarSpace(pa)
                pbox = box_set(psp)
                pix = p.loads[li][1][d]
                paff = _affine(pix, pa, psp, pbox)
                if paff is None:
                    return None
                pc, pk = paff
                kr2 = next(k for k, a in enumerate(pa) if a is r)
                if any(pc[k] % cr for k in range(len(pa)) if k != kr2):
                    return None
                # ix = cr * u + pk with u = r + sum(pc[k] / cr * a_k), 0 <= ix < n
                if cr > 0:
                    ulo, uhi = -(pk // cr), (n - 1 - pk) // cr
                else:
                    ulo, uhi = -((n - 1 - pk) // -cr), pk // -cr
                if uhi < ulo:
                    continue
                u = E.iter_var(ulo, uhi + 1, f"{r.name}_tap", "reduce")
                shift = E.const(0)
                for k, a in enumerate(pa):
                    if k != kr2 and pc[k]:
                        shift = shift + a * (pc[k] // cr)
                r_val = u - shift
                extra = [r_val >= r.dom[0], r_val < r.dom[1]]
                red = [u if a is r else a for a in p.reduce]
                out.append(p.subst({r: r_val}, p.spatial, p.out_strides, p.out_offset, red,
                                   extra=extra, tapped=True))
            return out
    return None
