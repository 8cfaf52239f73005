"""BUGS.md C13: a max/min over a data-dependent domain that is empty for some outputs.

The simplified gradient scatters ``dS[argmax[j]] += dY[j]`` under conditions that
load through ``argmax[j]`` (``I[argmax[j]] == j``); for an empty slot the argmax
is its sentinel, so the bounds of the scattered index must be checked before any
condition reads through it. Every variant is checked raw, simplified (te.evaluate)
and compiled, against the value written by hand.
"""

import numpy as np
import pytest

import texpr as te
from texpr import codegen

F = "float32"


def _max_by_slot(n_slots, n, reducer=te.max):
    S = te.placeholder((n,), "S", F)
    I = te.placeholder((n,), "I", "int64")
    k = te.reduce_axis(n, "k")
    M = te.compute((n_slots,), lambda j: reducer(S[k], axis=k, where=I[k] == j), name="M")
    return S, I, M


def _grads(Y, S, feed, dy):
    H = te.placeholder(Y.shape, "dY", F)
    feed = dict(feed)
    feed[H] = np.asarray(dy, F)
    out = []
    for simp in (False, True):
        (dS,) = te.differentiate(Y, [S], head=H, simplify=simp)
        out.append(te.evaluate(dS, feed))
        if simp:
            ins = [t for t in feed]
            k = codegen.build([Y, dS], ins)
            y, g = k(*[feed[t] for t in ins])
            np.testing.assert_array_equal(y, te.evaluate(Y, feed))
            out.append(g)
    return out


def test_c13_one_empty_slot():
    S, I, M = _max_by_slot(2, 2)
    feed = {S: np.array([2.5, 1.0], F), I: np.array([0, 0])}
    np.testing.assert_array_equal(te.evaluate(M, feed), [2.5, -np.inf])
    for g in _grads(M, S, feed, [1, 10]):
        np.testing.assert_array_equal(g, [1, 0])


def test_c13_several_empty_slots():
    S, I, M = _max_by_slot(5, 4)
    feed = {S: np.array([1.0, 3.0, -2.0, 0.5], F), I: np.array([3, 1, 3, 1])}
    np.testing.assert_array_equal(te.evaluate(M, feed), [-np.inf, 3.0, -np.inf, 1.0, -np.inf])
    for g in _grads(M, S, feed, [1, 2, 4, 8, 16]):
        np.testing.assert_array_equal(g, [8, 2, 0, 0])


def test_c13_ties_inside_a_slot_go_to_the_first():
    S, I, M = _max_by_slot(3, 4)
    feed = {S: np.array([2.0, 2.0, 5.0, 2.0], F), I: np.array([0, 0, 2, 0])}
    for g in _grads(M, S, feed, [1, 10, 100]):
        np.testing.assert_array_equal(g, [1, 0, 100, 0])


def test_c13_min_instead_of_max():
    S, I, M = _max_by_slot(3, 3, reducer=te.min)
    feed = {S: np.array([2.0, -1.0, 4.0], F), I: np.array([2, 2, 0])}
    np.testing.assert_array_equal(te.evaluate(M, feed), [4.0, np.inf, -1.0])
    for g in _grads(M, S, feed, [1, 10, 100]):
        np.testing.assert_array_equal(g, [0, 100, 1])


def test_c13_select_default_for_empty_slots():
    S, I, M = _max_by_slot(3, 3)
    D = te.placeholder((3,), "D", F)
    k = te.reduce_axis(3, "c")
    count = te.compute((3,), lambda j: te.sum(te.if_then_else(I[k] == j, 1, 0), axis=k),
                       name="count")
    Y = te.compute((3,), lambda j: te.if_then_else(count[j] > 0, M[j], D[j]), name="Y")
    feed = {S: np.array([0.5, 3.0, 1.0], F), I: np.array([2, 2, 0]),
            D: np.array([7.0, 8.0, 9.0], F)}
    np.testing.assert_array_equal(te.evaluate(Y, feed), [1.0, 8.0, 3.0])
    for g in _grads(Y, S, feed, [1, 10, 100]):
        np.testing.assert_array_equal(g, [0, 100, 1])
    H2 = te.placeholder((3,), "H2", F)
    for simp in (False, True):  # the default receives the adjoint of the empty slot only
        (dD,) = te.differentiate(Y, [D], head=H2, simplify=simp)
        got = te.evaluate(dD, feed | {H2: np.array([1, 10, 100], F)})
        np.testing.assert_array_equal(got, [0, 10, 0])


@pytest.mark.parametrize("slots", [[5, 5, 5], [0, 4, 4]])
def test_c13_all_or_most_slots_empty_2d(slots):
    """A 2-D source whose row is picked by data: most (row, slot) pairs are empty."""
    X = te.placeholder((3, 2), "X", F)
    I = te.placeholder((3,), "I", "int64")
    k = te.reduce_axis(3, "k")
    M = te.compute((6, 2), lambda j, c: te.max(X[k, c] * 2.0, axis=k, where=I[k] == j), name="M")
    x = np.array([[1.0, -1.0], [4.0, 0.0], [2.0, 3.0]], F)
    feed = {X: x, I: np.array(slots)}
    dy = np.arange(12, dtype=F).reshape(6, 2) + 1
    want = np.zeros((3, 2), F)
    for c in range(2):
        for j in range(6):
            ks = [r for r in range(3) if slots[r] == j]
            if ks:
                best = max(ks, key=lambda r: (x[r, c], -r))
                want[best, c] += 2.0 * dy[j, c]
    for g in _grads(M, X, feed, dy):
        np.testing.assert_array_equal(g, want)


@pytest.mark.parametrize("form", ["where", "select", "strided"])
def test_sentinel_compared_before_index_arithmetic_is_not_range_checked(form):
    # an argmax sentinel (int64 max) tested by a comparison before the arithmetic
    # that reads through it: the comparison is exact at any int64 value, so only
    # the arithmetic gets the range check, and the guard short-circuits it (a fuzzed
    # max gradient once failed its own guard's range check)
    big = np.iinfo(np.int64).max
    X = te.placeholder((4,), "X", F)
    I = te.placeholder((4,), "I", "int64")
    k = te.reduce_axis(2, "k")
    if form == "where":
        Y = te.compute((4,), lambda i: te.sum(X[(2 * I[i] + k) % 4] * 1.0, axis=k,
                                              where=I[i] < big), name="Y")
    elif form == "select":
        Y = te.compute((4,), lambda i: te.if_then_else(I[i] < big, X[(2 * I[i]) % 4], 0.0),
                       name="Y")
    else:
        Y = te.compute((4,), lambda i: te.if_then_else(
            te.all(I[i] != big, 3 * (I[i] // 3) + i >= 0), X[(3 * (I[i] // 3) + i) % 4], 0.0),
            name="Y")
    feed = {X: np.array([1.0, 2.0, 3.0, 4.0], F), I: np.array([1, big, 0, 3])}
    want = te.evaluate(Y, feed)
    got = codegen.build([Y], [X, I])(feed[X], feed[I])[0]
    np.testing.assert_array_equal(got, want)
