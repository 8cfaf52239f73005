"""Higher-order derivatives by nested float64 finite differences, and the
symbolic chain they check (shared by tests/test_higher_order.py and
tests/test_fuzz_higher_order.py).

The n-th derivative of a scalar ``L(X)`` along directions ``d1..dn`` is the
mixed central difference

    sum over signs s in {+1, -1}^n of  prod(s) * L(X + h * sum_i s_i d_i) / (2h)^n,

an even function of ``h`` (error ``c2 h^2 + c4 h^4 + ...``), so one Richardson
step ``(4 D(h/2) - D(h)) / 3`` leaves ``O(h^4)``. ``h = 5e-3``: at ``1e-2`` the
long fuzz profile found a relative error of 1.5e-5 on a second derivative of an
``oplus`` reduction of cubes (the symbolic value was right: the differences
converge to it as ``h`` shrinks); the rounding error stays near 1e-10 at third order. Nesting it over the unit
vectors ``e_j`` gives gradients, Hessian-vector products and third
derivatives element by element.

The symbolic side differentiates the gradient again: level 1 is ``dL/dX``;
level ``n+1`` is the vector-Jacobian product of level ``n`` with a new
direction (``head=V``, or ``differentiate`` of ``sum(level_n * V)``), so level
``n`` equals ``D^n L [d1, ..., d_{n-1}, e_j]`` (the derivatives are symmetric).
"""

import itertools

import numpy as np

import texpr as te


def directional_fd(loss, x, feed, dirs, h=5e-3):
    """``D^n loss(x) [dirs]`` (``n = len(dirs)``) by Richardson-extrapolated mixed
    central differences through ``te.evaluate`` (float64 feeds)."""
    base = np.asarray(feed[x], dtype=np.float64)

    def est(step):
        total = 0.0
        f = dict(feed)
        for signs in itertools.product((1.0, -1.0), repeat=len(dirs)):
            shift = sum(s * d for s, d in zip(signs, dirs))
            f[x] = base + step * shift
            total += float(np.prod(signs)) * float(te.evaluate(loss, f))
        return total / (2.0 * step) ** len(dirs)

    return (4.0 * est(h / 2) - est(h)) / 3.0


def fd_level(loss, x, feed, dirs, h=5e-3):
    """The array over ``j`` (``x``'s shape) of ``D^(len(dirs)+1) loss [dirs, e_j]``."""
    out = np.zeros(x.shape)
    for j in np.ndindex(*x.shape):
        e = np.zeros(x.shape)
        e[j] = 1.0
        out[j] = directional_fd(loss, x, feed, list(dirs) + [e], h)
    return out


def dot_loss(t, v, name):
    """``sum(t * v)`` (a scalar stage); ``t`` and ``v`` of the same shape."""
    if t.shape == ():
        return te.compute((), lambda: t[()] * v[()], name=name)
    axes = [te.reduce_axis(n, f"{name}_s{d}") for d, n in enumerate(t.shape)]
    return te.compute((), lambda: te.sum(t[tuple(axes)] * v[tuple(axes)], axis=axes), name=name)


def derivative_chain(loss, x, directions, simplify, via_head):
    """Symbolic levels ``1..len(simplify)`` of ``loss`` w.r.t. ``x``.

    Args:
        directions: float64 placeholders of ``x``'s shape (``len(simplify) - 1`` of them).
        simplify: one bool per level (``differentiate(..., simplify=...)``).
        via_head: one bool per level above the first: the vector-Jacobian
            product as ``head=direction`` (True) or as the gradient of
            ``sum(level * direction)`` (False).
    Returns:
        the list of level tensors (each of ``x``'s shape).
    """
    levels = [te.differentiate(loss, [x], simplify=simplify[0]).result[0]]
    for n in range(1, len(simplify)):
        d, prev = directions[n - 1], levels[-1]
        if via_head[n - 1]:
            g = te.differentiate(prev, [x], head=d, simplify=simplify[n]).result[0]
        else:
            g = te.differentiate(dot_loss(prev, d, f"dot{n}"), [x],
                                 simplify=simplify[n]).result[0]
        levels.append(g)
    return levels


def assert_close(got, want, what, rtol=1e-5, atol=1e-6):
    """``got`` equals ``want`` up to ``rtol`` and ``atol`` scaled by ``max(1, |want|)``."""
    got = np.asarray(got, dtype=np.float64)
    scale = max(1.0, float(np.max(np.abs(want)))) if np.size(want) else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * scale, err_msg=what)
