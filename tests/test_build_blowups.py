"""Two small programs whose builds took minutes and gigabytes (issue 51): a bilinear
``grid_sample`` with reflection padding and a bilateral grid (tests/sampler_programs.py).

The sampler's gradient of the grid reads each sample coordinate -- ``|c + 0.5|``, a
float ``%``, the parity of ``floor(c / size)``, a clamp -- and its derivative at four
corners, their weights and their bounds checks, summed over the channels. As a DAG
that is small; written out as a tree it was 11,600 nodes, a 170 KB unit that built in
115 s and 2.6 GB (zero padding: 44 KB). ``simplify.hoist`` stores the shared parts
that no reduction axis varies as stages of their own. The work proxy asserted here is
the largest stage body written out as a tree (what the emitter writes); build times
are in benchmarks/bench_build_blowups.py, never here.
"""

import numpy as np
import pytest

import texpr as te
from texpr import codegen, simplify
from texpr.simplify import hoist
from texpr.simplify.hoist import HOIST_TREE_NODES, hoist_invariants
from texpr.simplify.materialize import inlined_stages, written_out
from texpr.tensor import ComputeOp

from sampler_programs import _TAPS, bilateral_grid, grid_sample

torch = pytest.importorskip("torch")


def _largest_tree(outs):
    inl = inlined_stages(outs)
    return max(written_out(op.body[0], op.axis, inl).size for op in te.topo_order(outs)
               if isinstance(op, ComputeOp))


def _feed(inputs, seed=0, lo=-2.2, hi=2.2):
    rng = np.random.default_rng(seed)
    X, G, H = inputs
    return {X: rng.standard_normal(X.shape), G: rng.uniform(lo, hi, G.shape),
            H: rng.standard_normal(H.shape)}


def _torch_grads(feed, inputs, padding):
    X, G, H = inputs
    xt = torch.tensor(feed[X], requires_grad=True)
    gt = torch.tensor(feed[G], requires_grad=True)
    out = torch.nn.functional.grid_sample(xt, gt, mode="bilinear", padding_mode=padding,
                                          align_corners=False)
    loss = (out * torch.tensor(feed[H])).sum()
    loss.backward()
    return loss.item(), xt.grad.numpy(), gt.grad.numpy()


@pytest.mark.parametrize("padding", ["reflection", "zeros"])
@pytest.mark.parametrize("staged", [False, True])
def test_grid_sample_value_and_gradients_match_pytorch(padding, staged):
    inputs, loss = grid_sample(padding=padding, staged=staged)
    X, G, _H = inputs
    res = te.differentiate(loss, [X, G])
    # grid points past both edges: reflection folds them back more than once
    feed = _feed(inputs)
    want_v, want_dx, want_dg = _torch_grads(feed, inputs, padding)
    got_v, got_dx, got_dg = te.evaluate([res.value] + list(res.result), feed)
    np.testing.assert_allclose(got_v, want_v, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_dx, want_dx, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got_dg, want_dg, rtol=1e-10, atol=1e-12)


def test_the_compiled_reflection_sampler_matches_pytorch():
    # the value and the grid's gradient: the stages that read the stored parts
    inputs, loss = grid_sample(channels=2)
    X, G, _H = inputs
    res = te.differentiate(loss, [G])
    kernel = codegen.build([res.value, res.result[0]], inputs, parallel=False)
    feed = _feed(inputs, seed=2)
    want_v, _want_dx, want_dg = _torch_grads(feed, inputs, "reflection")
    got_v, got_dg = kernel(*(feed[t] for t in inputs))
    np.testing.assert_allclose(got_v, want_v, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_dg, want_dg, rtol=1e-10, atol=1e-12)


def test_reflection_grid_gradient_matches_finite_differences():
    inputs, loss = grid_sample(channels=2)
    X, G, _H = inputs
    dG, = te.differentiate(loss, [G]).result
    feed = _feed(inputs, seed=3)
    got = te.evaluate(dG, feed)
    eps, g0 = 1e-6, feed[G]
    fd = np.zeros_like(g0)
    for idx in np.ndindex(g0.shape):
        for sign in (1, -1):
            g = g0.copy()
            g[idx] += sign * eps
            fd[idx] += sign * float(te.evaluate(loss, {**feed, G: g})) / (2 * eps)
    np.testing.assert_allclose(got, fd, rtol=1e-5, atol=1e-7)


def test_reflection_gradient_writes_out_within_the_budget_and_twice_zero_padding():
    trees = {}
    for padding in ("reflection", "zeros"):
        inputs, loss = grid_sample(padding=padding)
        res = te.differentiate(loss, inputs[:2])
        trees[padding] = _largest_tree([res.value] + list(res.result))
    # before the rule: 11,619 nodes against zero padding's 3,014
    assert trees["reflection"] <= HOIST_TREE_NODES
    assert trees["reflection"] <= 2 * trees["zeros"]


def test_hoisted_parts_are_stages_over_the_axes_they_use(monkeypatch):
    inputs, loss = grid_sample()
    X, G, _H = inputs
    grads = list(te.differentiate(loss, [X, G]).result)
    parts = [op for op in te.topo_order(grads) if "_part" in op.name]
    assert parts, "the reflection gradient's coordinates were not stored"
    # each part reads the grid at one point (i, j): never the channel or the component
    assert all(op.output(0).shape == G.shape[1:3] for op in parts)
    # a stored part costs one pass over the grid points and nothing else changes
    monkeypatch.setattr(hoist, "HOIST_TREE_NODES", 1 << 62)
    unhoisted = list(te.differentiate(loss, [X, G]).result)
    assert not [op for op in te.topo_order(unhoisted) if "_part" in op.name]
    assert (simplify.iteration_count(grads)
            == simplify.iteration_count(unhoisted) + len(parts) * G.shape[1] * G.shape[2])
    feed = _feed(inputs, seed=1)
    for a, b in zip(te.evaluate(grads, feed), te.evaluate(unhoisted, feed)):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)


def test_hoisting_leaves_small_bodies_and_an_already_hoisted_graph_alone():
    inputs, loss = grid_sample(padding="zeros", channels=1)
    res = te.differentiate(loss, inputs[:2])
    outs = [res.value] + list(res.result)
    assert hoist_invariants(outs) == outs
    inputs, loss = grid_sample()
    res = te.differentiate(loss, inputs[:2])
    outs = [res.value] + list(res.result)
    again = hoist_invariants(outs)
    assert all(a is b for a, b in zip(again, outs))


def _bilateral_reference(im, h=8, w=8, s=2, bins=4):
    gy, gx = (h + s - 1) // s + 1, (w + s - 1) // s + 1
    V, W = np.zeros((gy, gx, bins)), np.zeros((gy, gx, bins))
    for y in range(h):
        for x in range(w):
            z = int(np.floor(im[y, x] * (bins - 1) + 0.5))
            V[y // s, x // s, z] += im[y, x]
            W[y // s, x // s, z] += 1

    def blur(T, ax):
        T = np.moveaxis(T, ax, 0)
        P = np.pad(T, [(2, 2)] + [(0, 0)] * 2)
        return np.moveaxis(sum(k * P[t:t + T.shape[0]] for t, k in enumerate(_TAPS)), 0, ax)

    for ax in range(3):
        V, W = blur(V, ax), blur(W, ax)
    out = np.zeros((h, w))
    for y in range(h):
        for x in range(w):
            cz = im[y, x] * (bins - 1)
            z0, fz, fy, fx = int(np.floor(cz)), cz - np.floor(cz), (y % s) / s, (x % s) / s

            def sl(T):
                t = 0.0
                for dy in (0, 1):
                    for dx in (0, 1):
                        for dz in (0, 1):
                            if 0 <= z0 + dz < bins:
                                t += (T[y // s + dy, x // s + dx, z0 + dz]
                                      * (fy if dy else 1 - fy) * (fx if dx else 1 - fx)
                                      * (fz if dz else 1 - fz))
                return t
            out[y, x] = sl(V) / (sl(W) + 1e-3)
    return out


@pytest.mark.parametrize("splat,float_coords", [("scatter", False), ("reduce", False),
                                                ("scatter", True)])
def test_bilateral_grid_value_and_gradient(splat, float_coords):
    (I, H), loss = bilateral_grid(splat=splat, float_coords=float_coords)
    res = te.differentiate(loss, [I])
    rng = np.random.default_rng(5)
    im, hh = rng.uniform(0.05, 0.95, (8, 8)), rng.standard_normal((8, 8))
    value, dI = te.evaluate([res.value, res.result[0]], {I: im, H: hh})
    np.testing.assert_allclose(value, (_bilateral_reference(im) * hh).sum(), rtol=1e-12)
    # finite differences: the bins are piecewise constant, so stay off their edges
    eps, fd = 1e-7, np.zeros_like(im)
    for idx in np.ndindex(im.shape):
        a, b = im.copy(), im.copy()
        a[idx] += eps
        b[idx] -= eps
        fd[idx] = ((_bilateral_reference(a) * hh).sum()
                   - (_bilateral_reference(b) * hh).sum()) / (2 * eps)
    np.testing.assert_allclose(dI, fd, rtol=1e-5, atol=1e-6)
    # the slice's derivative in the intensity coordinate reads 16 corners: 2,081
    # nodes written out (2,721 with float_coords), never a blow-up of the blurs
    assert _largest_tree([res.value, res.result[0]]) <= 3000


def test_a_stage_read_once_is_not_inlined_where_the_consumer_repeats_its_load():
    X = te.placeholder((6,), "X", "float64")

    def chain(v):
        for k in range(12):
            v = te.tanh(v * 1.5 + 0.1 * k)
        return v
    P = te.compute((6,), lambda i: chain(X[i]), name="P")  # not cheap, about 50 nodes

    def guarded(i):  # P[i] is one load in the DAG and 3^4 = 81 loads written out
        e = P[i]
        for k in range(4):
            e = te.select(e > 0.1 * k, e * 2.0, e + 1.0)
        return e
    C = te.compute((6,), guarded, name="C")
    at_load = simplify.materialize.tree_size(P.op.body[0])
    assert at_load * 81 > simplify.materialize.INLINE_ONCE_TREE_NODES >= at_load
    assert id(P.op) not in inlined_stages([C])
    x = np.linspace(-1, 1, 6)
    want = te.evaluate(C, {X: x})
    np.testing.assert_allclose(te.evaluate(simplify.simplify([C])[0], {X: x}), want,
                               rtol=1e-14)


def _guarded_chain(index):
    # sum_k of a shared chain of X at index(i) written out 81 times, times W[k]
    X = te.placeholder((6,), "X", "float64")
    J = te.placeholder((6,), "J", "int64")
    W = te.placeholder((3,), "W", "float64")
    k = te.reduce_axis(3, "k")

    def body(i):
        v = X[index(J, i)]
        for t in range(12):
            v = te.tanh(v * 1.5 + 0.1 * t)
        e = v
        for t in range(4):
            e = te.select(e > 0.1 * t, e * 2.0, e + 1.0)
        return te.sum(e * W[k], axis=k)
    Y = te.compute((6,), body, name="Y")
    return (X, J, W), Y


@pytest.mark.parametrize("data_index", [False, True])
def test_only_subexpressions_that_cannot_fail_are_stored(data_index):
    index = (lambda J, i: J[i]) if data_index else (lambda J, i: i)
    (X, J, W), Y = _guarded_chain(index)
    assert simplify.materialize.tree_size(Y.op.body[0]) > HOIST_TREE_NODES
    out, = hoist_invariants([Y])
    parts = [op for op in te.topo_order([out]) if "_part" in op.name]
    # X[J[i]] may be out of bounds where the original never read it: kept in place
    assert bool(parts) is not data_index
    feed = {X: np.linspace(-1, 1, 6), J: np.array([5, 0, 3, 3, 1, 2]), W: np.arange(3.0)}
    np.testing.assert_allclose(te.evaluate(out, feed), te.evaluate(Y, feed), rtol=1e-14)
    if parts:
        assert all(op.tag == simplify.materialize.HOISTED_TAG for op in parts)
        assert simplify.materialize.tree_size(out.op.body[0]) <= HOIST_TREE_NODES // 2
