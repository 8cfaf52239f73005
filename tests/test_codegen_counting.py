"""The code generator's heuristics count points at a bounded cost: a serial
build of a sum over 30x300x300 with two modulus conditions waited minutes in
barvinok (``_average_trips``: loop order only); now it counts by enumeration,
and with the budgets exhausted it falls back to the extents. Two kernels are
compiled."""

import numpy as np

import texpr as te
import texpr.codegen.loopnest.order as S
from texpr import codegen
from texpr.simplify import isl_bridge as B

I, J, K = 30, 300, 300


def _where(i, j, k):
    """barvinok counted this domain in 0.35 s, its projection along ``j`` in more
    than 100 s (interrupted); numpy enumerates it in about 0.05 s."""
    return ((((3 * j + 2 * k) // 5 + (j + k) // 7) % 11 == 0)
            & ((i + 2 * j + 3 * k) % 13 == 4))


def _stage(n_i=I, n_j=J, n_k=K, where=_where):
    A = te.placeholder((n_i, n_j), "A", "float64")
    Bt = te.placeholder((n_j, n_k), "B", "float64")
    j = te.reduce_axis(n_j, "j")
    k = te.reduce_axis(n_k, "k")
    C = te.compute((n_i,), lambda i: te.sum(A[i, j] * Bt[j, k], axis=[j, k],
                                            where=where(i, j, k)), name="C")
    return A, Bt, C


def _trips(C):
    op = C.op
    return S._average_trips(list(op.body), list(op.axis), list(op.reduce_axis))


def test_average_trips_of_a_modulus_domain_are_exact_and_fast():
    A, Bt, C = _stage()
    i, j, k = np.meshgrid(np.arange(I), np.arange(J), np.arange(K), indexing="ij")
    mask = _where(i, j, k)
    total = mask.sum()
    want = [total / mask.any(axis=d).sum() for d in range(3)]
    axes = list(C.op.axis) + list(C.op.reduce_axis)
    got = _trips(C)
    assert [got[id(a)] for a in axes] == want
    assert max(want) < 3  # the conditions tie the axes: far below the extents


def test_serial_build_of_a_modulus_domain_finishes_and_matches_evaluate():
    A, Bt, C = _stage()
    kernel = codegen.build([C], [A, Bt], parallel=False, blas=False)
    rng = np.random.default_rng(0)
    a, b = rng.uniform(-1, 1, (I, J)), rng.uniform(-1, 1, (J, K))
    np.testing.assert_allclose(kernel(a, b)[0], te.evaluate(C, {A: a, Bt: b}),
                               rtol=1e-12, atol=1e-12)


def test_exhausted_budgets_fall_back_to_the_extents(monkeypatch):
    monkeypatch.setattr(B, "CARD_MAX_COST", 0)
    monkeypatch.setattr(B, "ENUM_MAX_WORK", 0)
    monkeypatch.setenv("TEXPR_SYMBOLIC_CACHE", "0")  # lower the stage now, not from a cache
    seen = []  # (function name, result)

    def spy(fn):
        def wrapped(*args, **kw):
            out = fn(*args, **kw)
            seen.append((fn.__name__, out))
            return out
        return wrapped

    monkeypatch.setattr(S, "projected_cards_within", spy(S.projected_cards_within))
    monkeypatch.setattr(S, "card_within", spy(S.card_within))

    def totals():
        return [out[0] if name == "projected_cards_within" else out for name, out in seen]

    # the big domain: every axis keeps its extent
    _A, _B, C = _stage()
    axes = list(C.op.axis) + list(C.op.reduce_axis)
    got = _trips(C)
    assert [got[id(a)] for a in axes] == [float(I), float(J), float(K)]
    assert totals() == [(I * J * K, False, "box")]
    # a small stage, built with the parallel rules on (they count its domain too)
    where = lambda i, j, k: (i + 2 * j + 3 * k) % 5 < 2  # noqa: E731
    A, Bt, C = _stage(16, 64, 64, where)
    seen.clear()
    kernel = codegen.build([C], [A, Bt])
    assert {name for name, _ in seen} == {"projected_cards_within", "card_within"}
    assert all(c == (16 * 64 * 64, False, "box") for c in totals())
    rng = np.random.default_rng(1)
    a, b = rng.uniform(-1, 1, (16, 64)), rng.uniform(-1, 1, (64, 64))
    np.testing.assert_allclose(kernel(a, b)[0], te.evaluate(C, {A: a, Bt: b}),
                               rtol=1e-12, atol=1e-12)
