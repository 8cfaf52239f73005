"""te.nn.scaled_dot_product_attention: values and gradients against
torch.nn.functional.scaled_dot_product_attention (float64), finite differences, the
exact causal mask, one compiled kernel, and the argument errors."""

import numpy as np
import pytest

import texpr as te
from nn_testutil import F, check_forward, check_grads, ph, rand, tt

pytest.importorskip("torch")  # the reference of this file

nn = te.nn
sdpa = nn.scaled_dot_product_attention


def _qkv(lead, n_q, n_k, e, ev, seed=0):
    q, k, v = ph(lead + (n_q, e), "Q"), ph(lead + (n_k, e), "K"), ph(lead + (n_k, ev), "V")
    feed = {q: rand(q, seed, -2, 2), k: rand(k, seed + 1, -2, 2), v: rand(v, seed + 2)}
    return q, k, v, feed


def _torch_value_and_grads(feed, q, k, v, head, causal, scale=None):
    tq, tk, tv = (tt(feed[t]).requires_grad_(True) for t in (q, k, v))
    out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, scale=scale)
    (out * tt(head)).sum().backward()
    return out.detach().numpy(), [t.grad.numpy() for t in (tq, tk, tv)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lead,n_q,n_k", [((2, 3), 5, 5), ((4,), 6, 4), ((), 3, 5)])
def test_value_and_gradient_match_torch(causal, lead, n_q, n_k):
    q, k, v, feed = _qkv(lead, n_q, n_k, 4, 3)
    out = sdpa(q, k, v, causal=causal)
    assert out.shape == lead + (n_q, 3) and out.dtype == "float64"
    head = ph(out.shape, "H")
    feed[head] = np.random.default_rng(7).standard_normal(out.shape)
    ref, ref_grads = _torch_value_and_grads(feed, q, k, v, feed[head], causal)
    check_forward(out, feed, ref, rtol=1e-12, atol=1e-13)
    grads = te.differentiate(out, [q, k, v], head=head).result
    for g, r, t in zip(te.evaluate(list(grads), feed), ref_grads, "QKV"):
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12, err_msg=f"d{t}")


def test_scale_argument():
    q, k, v, feed = _qkv((2,), 3, 4, 5, 2)
    head = np.ones((2, 3, 2))
    ref, _ = _torch_value_and_grads(feed, q, k, v, head, True, scale=0.3)
    check_forward(sdpa(q, k, v, causal=True, scale=0.3), feed, ref, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_match_finite_differences(causal):
    q, k, v, feed = _qkv((2,), 3, 3, 2, 2, seed=3)
    check_grads(sdpa(q, k, v, causal=causal), [q, k, v], feed)


def test_causal_mask_is_exact():
    """Masked keys are excluded, not pushed down: a key whose scores overflow to inf
    leaves the rows before it untouched, and the masked probabilities are exactly 0."""
    q, k, v, feed = _qkv((2,), 4, 4, 3, 2, seed=5)
    feed[q] = np.abs(feed[q]) + 0.5
    big = dict(feed)
    big[k] = feed[k].copy()
    big[k][:, 3] = 1e308  # every score with the last key is +inf
    big[v] = feed[v].copy()
    big[v][:, 3] = 1e300
    out = sdpa(q, k, v, causal=True)
    want = te.evaluate(out, feed)
    got = te.evaluate(out, big)
    np.testing.assert_array_equal(got[:, :3], want[:, :3])
    probs = next(op.output(0) for op in te.topo_order(out) if op.name.endswith("_probs"))
    p = te.evaluate(probs, feed)
    assert (p[:, np.triu_indices(4, 1)[0], np.triu_indices(4, 1)[1]] == 0.0).all()
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-14)


def test_stages_are_batched_products():
    """The two contractions read only their operands: Q K^T and P V."""
    q, k, v, _ = _qkv((2, 3), 5, 5, 4, 4)
    out = sdpa(q, k, v, causal=True, name="att")
    stages = {op.name: op for op in te.topo_order(out)}
    assert set(stages) == {"Q", "K", "V", "att_scores", "att_max", "att_sum", "att_probs",
                           "att"}
    assert [t.name for t in stages["att_scores"].input_tensors()] == ["Q", "K"]
    assert [t.name for t in out.op.input_tensors()] == ["att_probs", "V"]
    assert stages["att_scores"].output(0).shape == (2, 3, 5, 5)


def test_compiled_kernel_matches_torch():
    """Forward and gradients through codegen (one kernel) against torch."""
    from texpr import codegen

    q, k, v, feed = _qkv((2, 2), 6, 6, 4, 4, seed=11)
    out = sdpa(q, k, v, causal=True)
    head = ph(out.shape, "H")
    feed[head] = np.random.default_rng(2).standard_normal(out.shape)
    grads = list(te.differentiate(out, [q, k, v], head=head).result)
    kernel = codegen.build([out] + grads, [q, k, v, head])
    got = kernel(*(feed[t] for t in (q, k, v, head)))
    ref, ref_grads = _torch_value_and_grads(feed, q, k, v, feed[head], True)
    for g, r, n in zip(got, [ref] + ref_grads, ["out", "dQ", "dK", "dV"]):
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12, err_msg=n)


def test_float32_stays_float32():
    q, k, v = (ph((1, 3, 2), n, "float32") for n in "QKV")
    out = sdpa(q, k, v, causal=True)
    assert out.dtype == "float32"
    feed = {t: rand(t, s).astype("float32") for s, t in enumerate((q, k, v))}
    got = te.evaluate(out, feed)
    assert got.dtype == np.float32
    ref = F.scaled_dot_product_attention(*(tt(feed[t]) for t in (q, k, v)), is_causal=True)
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-5, atol=1e-6)


def test_errors():
    q, k, v = ph((2, 3, 4), "Q"), ph((2, 5, 4), "K"), ph((2, 5, 3), "V")
    with pytest.raises(te.ShapeError, match="at least 2 dimensions"):
        sdpa(ph((4,), "Q1"), k, v)
    with pytest.raises(te.ShapeError, match="same leading"):
        sdpa(q, ph((3, 5, 4), "K2"), v)
    with pytest.raises(te.ShapeError, match="same leading"):
        sdpa(ph((1, 2, 3, 4), "Q4"), k, v)
    with pytest.raises(te.ShapeError, match="query Q .* 4 features but key K2 .* has 2"):
        sdpa(q, ph((2, 5, 2), "K2"), v)
    with pytest.raises(te.ShapeError, match="5 positions but value V2 .* has 4"):
        sdpa(q, k, ph((2, 4, 3), "V2"))
    with pytest.raises(te.ShapeError, match="no positions"):
        sdpa(q, ph((2, 0, 4), "K0"), ph((2, 0, 3), "V0"))
    with pytest.raises(te.DTypeError, match="float"):
        sdpa(ph((2, 3, 4), "Qi", "int64"), k, v)
    with pytest.raises(te.TexprError, match="causal must be True or False"):
        sdpa(q, k, v, causal=1)
    with pytest.raises(te.TexprError, match="scale must be a number"):
        sdpa(q, k, v, scale="0.5")
    with pytest.raises(te.TexprError, match="name"):
        sdpa(q, k, v, name=3)

