"""Bounded point counting for the code generator's heuristics
(``isl_bridge.card_within`` / ``projected_cards_within``): the exact count
where barvinok is cheap or the bounding box can be enumerated, else the
bounding box's points (an upper bound) -- never the minutes barvinok took on
some modulus domains. Exact counting (``card``) is unchanged."""

import math
import time

import numpy as np
import pytest

from texpr import expr as E
from texpr.simplify import isl_bridge as B


def _axes(*extents):
    return [E.iter_var(0, n, f"x{d}", "reduce") for d, n in enumerate(extents)]


def _dom(axes, cond):
    sp = B.VarSpace(axes)
    s, resid = B.to_set(cond, sp)
    assert resid is None
    return s.intersect(B.box_set(sp))


def _grid(axes):
    return np.meshgrid(*[np.arange(a.dom[0], a.dom[1]) for a in axes], indexing="ij")


def _hard_set():
    """30x300x300 with two modulus conditions on nested divisions: barvinok counted
    the set in 0.35 s, but its projection along the second axis ran for more than
    100 s (interrupted)."""
    i, j, k = _axes(30, 300, 300)
    return _dom([i, j, k], ((((3 * j + 2 * k) // 5 + (j + k) // 7) % 11 == 0)
                            & ((i + 2 * j + 3 * k) % 13 == 4)))


def _hard_mask():
    i, j, k = np.meshgrid(np.arange(30), np.arange(300), np.arange(300), indexing="ij")
    return ((((3 * j + 2 * k) // 5 + (j + k) // 7) % 11 == 0)
            & ((i + 2 * j + 3 * k) % 13 == 4))


# (extents, the condition over the axes, the same condition on numpy grids)
ORDINARY = [
    ((10, 10), lambda j, k: k <= j, lambda j, k: k <= j),
    ((10, 3), lambda h, r: (2 * r - 1 <= h) & (h <= 2 * r + 1),
     lambda h, r: (2 * r - 1 <= h) & (h <= 2 * r + 1)),
    ((10, 3), lambda h, r: (h + r) % 2 == 0, lambda h, r: (h + r) % 2 == 0),
    ((7, 5, 4), lambda a, b, c: (a < 3) | (b + c == 4), lambda a, b, c: (a < 3) | (b + c == 4)),
    ((9, 6), lambda a, b: ~((a + 2 * b) % 3 == 0), lambda a, b: (a + 2 * b) % 3 != 0),
    ((6, 6, 5), lambda a, b, c: ((a + b) // 2 + c) % 3 < 2,
     lambda a, b, c: ((a + b) // 2 + c) % 3 < 2),
    ((5, 5), lambda a, b: a + b < 0, lambda a, b: a + b < 0),  # empty
]


def _case(extents, cond, ref):
    axes = _axes(*extents)
    mask = ref(*_grid(axes))
    return axes, _dom(axes, cond(*axes)), mask


@pytest.mark.parametrize("case", range(len(ORDINARY)))
def test_bounded_counts_equal_the_exact_counts_on_ordinary_sets(case):
    axes, s, mask = _case(*ORDINARY[case])
    want = int(mask.sum())
    assert B.card(s) == want
    got = B.card_within(s)  # default budgets: cheap sets go to barvinok
    assert got == (want, True, "barvinok")
    forced = B.card_within(s, max_cost=0)  # no barvinok: the bounding box enumerated
    assert forced.value == want and forced.exact
    assert forced.method == ("enumerate" if B.count_cost(s) else "barvinok")
    want_proj = [int(mask.any(axis=k).sum()) for k in range(len(axes))]
    assert [B.card(s.project_out(B.isl.dim_type.set, k, 1)) for k in range(len(axes))] == want_proj
    for budget in (None, 0):
        total, projs = B.projected_cards_within(s, max_cost=budget)
        assert (total.value, total.exact) == (want, True)
        assert [p.value for p in projs] == want_proj and all(p.exact for p in projs)


@pytest.mark.parametrize("case", range(len(ORDINARY)))
def test_exhausted_budget_gives_the_bounding_box_an_upper_bound(case):
    axes, s, mask = _case(*ORDINARY[case])
    box = B.bounding_box(s)
    if not mask.any():
        assert box is None  # relaxed set empty: the count is 0, exactly
        got = B.card_within(s, max_cost=0, max_work=0)
        assert (got.value, got.exact) == (0, True)
        return
    lo = [np.nonzero(mask.any(axis=tuple(e for e in range(mask.ndim) if e != d)))[0] for d in
          range(mask.ndim)]
    for (blo, bhi), idx, a in zip(box, lo, axes):  # never tighter than the points
        assert blo <= a.dom[0] + idx.min() and a.dom[0] + idx.max() < bhi
    got = B.card_within(s, max_cost=0, max_work=0)
    assert got == (math.prod(h - l for l, h in box), False, "box")
    assert got.value >= int(mask.sum())
    total, projs = B.projected_cards_within(s, max_cost=0, max_work=0)
    assert total == got
    for k, p in enumerate(projs):
        assert p == (math.prod(h - l for l, h in box[:k] + box[k + 1:]), False, "box")
        assert p.value >= int(mask.any(axis=k).sum())


def test_count_cost_reads_divisions_moduli_and_pieces():
    x = _axes(30, 300, 300)
    plain = _dom(x, x[2] <= x[1])
    stride = _dom(x, (x[1] + x[2]) % 2 == 0)
    union = _dom(x, (x[0] < 3) | (x[1] < 5))
    assert B.count_cost(plain) == 1
    assert B.count_cost(stride) == 2
    assert B.count_cost(union) == 4  # two pieces: (1 + 1) * 2
    hard = _dom(x, (x[0] + 2 * x[1]) % 13 < 4)
    assert B.count_cost(hard) > B.count_cost(stride)
    # a projection leaves unknown divisions: barvinok's hardest sets
    proj = _hard_set().project_out(B.isl.dim_type.set, 1, 1)
    assert B.count_cost(proj) > B.CARD_MAX_COST


def test_a_modulus_domain_barvinok_hangs_on_is_counted_exactly_and_fast():
    s = _hard_set()
    mask = _hard_mask()
    assert B.count_cost(s) > B.CARD_MAX_COST
    t = time.perf_counter()
    got = B.card_within(s)
    total, projs = B.projected_cards_within(s)
    elapsed = time.perf_counter() - t
    assert got == (int(mask.sum()), True, "enumerate")
    assert total == got
    assert [p.value for p in projs] == [int(mask.any(axis=k).sum()) for k in range(3)]
    assert all(p.method == "enumerate" for p in projs)
    assert elapsed < 20  # about 0.05 s; barvinok: minutes


def test_over_the_enumeration_budget_the_box_is_counted():
    a, b, c, d = _axes(30, 300, 300, 10)  # 2.7e7 points > ENUM_MAX_POINTS
    s = _dom([a, b, c, d], ((a + b + d) % 37 < 11) & ((b - c + 3 * d) % 41 > 13))
    assert B.count_cost(s) > B.CARD_MAX_COST
    assert B.card_within(s) == (30 * 300 * 300 * 10, False, "box")
    total, projs = B.projected_cards_within(s)
    assert not total.exact and [p.value for p in projs] == [900000, 90000, 90000, 2700000]


def test_uncountable_sets_are_domain_errors():
    (h,) = _axes(4)
    n = E.var("n")
    with_param = B.VarSpace([h], params=[n])
    s = B.box_set(with_param).intersect(B.to_set(h < n, with_param)[0])
    for f in (B.card_within, B.projected_cards_within, B.bounding_box):
        with pytest.raises(B.DomainError, match="parameters"):
            f(s)
    m = E.var("m")  # a plain Var: unbounded
    sp = B.VarSpace([h, m])
    s = B.box_set(sp).intersect(B.to_set((h + m) % 3 == 0, sp)[0])
    with pytest.raises(B.DomainError, match="unbounded"):
        B.card_within(s, max_cost=0)
