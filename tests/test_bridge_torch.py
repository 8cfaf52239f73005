"""texpr.torch.op: values against PyTorch, gradcheck (first and second order),
torch.compile without graph breaks, errors, and a parametrised subset of te.nn."""

import numpy as np
import pytest
import torch

import texpr as te
import texpr.torch as tt

from bridge_cases import CASES


def _dense_tanh(n=4, m=3, k=5):
    X = te.placeholder((n, k), name="X", dtype="float64")
    W = te.placeholder((m, k), name="W", dtype="float64")
    r = te.reduce_axis(k, name="r")
    Y = te.compute((n, m), lambda i, j: te.tanh(te.sum(X[i, r] * W[j, r], axis=r)), name="Y")
    return Y, X, W


_DENSE = None


def dense_op():
    global _DENSE
    if _DENSE is None:
        Y, X, W = _dense_tanh()
        _DENSE = tt.op(Y, [X, W])
    return _DENSE


def _args(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True)
                 for s in shapes)


def test_forward_matches_torch_and_returns_a_tensor():
    f = dense_op()
    x, w = _args((4, 5), (3, 5))
    y = f(x, w)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float64 and y.shape == (4, 3)
    torch.testing.assert_close(y, torch.tanh(x @ w.T), rtol=1e-12, atol=1e-12)


def test_gradcheck_first_and_second_order():
    f = dense_op()
    x, w = _args((4, 5), (3, 5), seed=1)
    assert torch.autograd.gradcheck(f, (x, w))
    assert torch.autograd.gradgradcheck(f, (x, w))


def test_the_custom_op_itself_passes_gradcheck_twice():
    # torch.compile runs the registered custom op (eager calls take the lighter
    # autograd.Function path): check its autograd formula directly, both orders
    f = dense_op()
    x, w = _args((4, 5), (3, 5), seed=8)

    def via_custom_op(a, b):
        return tt._kernel([a, b], f.spec.key)[0]

    assert torch.autograd.gradcheck(via_custom_op, (x, w))
    assert torch.autograd.gradgradcheck(via_custom_op, (x, w))
    with torch.no_grad():  # the no-autograd path gives the same values
        torch.testing.assert_close(f(x, w), via_custom_op(x, w), rtol=0, atol=0)


def test_backward_matches_torch_autograd():
    f = dense_op()
    x, w = _args((4, 5), (3, 5), seed=2)
    head = torch.randn(4, 3, dtype=torch.float64)
    gx, gw = torch.autograd.grad(f(x, w), (x, w), head)
    rx, rw = torch.autograd.grad(torch.tanh(x @ w.T), (x, w), head)
    torch.testing.assert_close(gx, rx, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gw, rw, rtol=1e-12, atol=1e-12)


def test_non_contiguous_inputs_and_expanded_grad_outputs():
    f = dense_op()
    xt, w = _args((5, 4), (3, 5), seed=3)
    x = xt.T  # a transposed view: not contiguous
    y = f(x, w)
    y.sum().backward()  # grad_output is an expanded (stride-0) tensor
    rx, = torch.autograd.grad(torch.tanh(x @ w.T).sum(), (xt,))
    torch.testing.assert_close(xt.grad, rx, rtol=1e-12, atol=1e-12)


def test_torch_compile_keeps_the_op_in_one_graph():
    f = dense_op()
    x, w = _args((4, 5), (3, 5), seed=4)

    def loss(a, b):
        return (f(a, b) * 2.0).sum()

    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)  # a graph break raises
    got = compiled(x, w)
    got.backward()
    ref_x, ref_w = [t.detach().clone().requires_grad_() for t in (x, w)]
    ref = (torch.tanh(ref_x @ ref_w.T) * 2.0).sum()
    ref.backward()
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(w.grad, ref_w.grad, rtol=1e-12, atol=1e-12)


def test_several_outputs_and_an_integer_input():
    # a gather by an int index tensor and a max reduction: two outputs, a tuple back
    X = te.placeholder((6, 4), name="Xg", dtype="float64")
    idx = te.placeholder((5,), name="idx", dtype="int64")
    G = te.compute((5, 4), lambda i, j: X[idx[i], j] * X[idx[i], j], name="G")
    r = te.reduce_axis(4, "r")
    M = te.compute((6,), lambda i: te.max(X[i, r], axis=r), name="M")
    f = tt.op([G, M], [X, idx])
    x, = _args((6, 4), seed=5)
    ix = torch.tensor([0, 3, 3, 5, 1])
    g, m = f(x, ix)
    torch.testing.assert_close(g, x[ix] ** 2)
    torch.testing.assert_close(m, x.max(dim=1).values)
    assert torch.autograd.gradcheck(lambda a: f(a, ix), (x,))
    # the int input gets no gradient
    ixf = ix.clone()
    out = f(x, ixf)
    gx, = torch.autograd.grad(out[0].sum() + out[1].sum(), (x,))
    assert gx.shape == x.shape


def test_contiguous_tensors_cross_without_copies():
    # the compiled driver gets the tensors' own data pointers, and the output
    # tensor's: the kernel reads and writes torch's memory
    f = dense_op()
    x, w = [t.detach() for t in _args((4, 5), (3, 5), seed=6)]
    f(x, w)
    run, specs = f.spec.cache["torch_native"]
    seen = {}

    def spy(pointers):
        seen["pointers"] = list(pointers)
        run(pointers)

    f.spec.cache["torch_native"] = (spy, specs)
    try:
        y = f(x, w)
    finally:
        f.spec.cache["torch_native"] = (run, specs)
    assert seen["pointers"] == [x.data_ptr(), w.data_ptr(), y.data_ptr()]
    np.testing.assert_allclose(y.numpy(), np.tanh(x.numpy() @ w.numpy().T), rtol=1e-12)


def test_numpy_views_without_the_compiled_driver(monkeypatch):
    # texpr.torch.NATIVE = False (and kernels the driver cannot run): the kernel's
    # Python driver on numpy views of the same memory, outputs shared back
    monkeypatch.setattr(tt, "NATIVE", False)
    Y, X, W = _dense_tanh()
    f = tt.op(Y, [X, W])
    x, w = [t.detach() for t in _args((4, 5), (3, 5), seed=6)]
    seen = {}
    run_exact = type(f.kernel).run_exact

    def spy(kernel, arrays):
        outs = run_exact(kernel, arrays)
        seen["in"], seen["out"] = [a.ctypes.data for a in arrays], [a.ctypes.data for a in outs]
        return outs

    monkeypatch.setattr(type(f.kernel), "run_exact", spy)
    y = f(x, w)
    assert f.spec.cache["torch_native"] is None
    assert seen["in"] == [x.data_ptr(), w.data_ptr()]
    assert seen["out"] == [y.data_ptr()]
    np.testing.assert_allclose(y.numpy(), np.tanh(x.numpy() @ w.numpy().T), rtol=1e-12)


@pytest.mark.parametrize("bad, message", [
    (lambda x, w: (x.float(), w), "expects dtype float64"),
    (lambda x, w: (x[:3], w), "expects shape (4, 5)"),
    (lambda x, w: (x.numpy(), w), "must be a torch tensor"),
    (lambda x, w: (x,), "expected 2 tensors"),
])
def test_feed_errors_are_texpr_errors(bad, message):
    f = dense_op()
    x, w = [t.detach() for t in _args((4, 5), (3, 5))]
    with pytest.raises(te.FeedError) as exc:
        f(*bad(x, w))
    assert message in str(exc.value)


def test_bad_construction():
    Y, X, W = _dense_tanh()
    with pytest.raises(te.TexprError, match="placeholders"):
        tt.op(Y, [Y, W])
    with pytest.raises(te.TexprError, match="twice"):
        tt.op(Y, [X, X, W])


# ---- every te.nn operator through the bridge (each compiles a forward and a
# backward kernel; tests/bridge_cases.py) ----------------------------------------------

@pytest.mark.parametrize("name", sorted(te.nn.__all__))
def test_nn_operator_gradcheck(name):
    out, inputs, values = CASES[name]()
    f = tt.op(out, inputs)
    args = tuple(torch.from_numpy(v).requires_grad_(v.dtype.kind == "f") for v in values)
    assert torch.autograd.gradcheck(f, args)
    # the forward value is the reference evaluator's
    ref = te.evaluate(out, dict(zip(inputs, values)))
    got = f(*args)
    for g, r in zip(got if isinstance(got, tuple) else (got,),
                    ref if isinstance(ref, (list, tuple)) else (ref,)):
        np.testing.assert_allclose(g.detach().numpy(), r, rtol=1e-12, atol=1e-12)


def test_strided_tensors_reach_the_kernel_dense():
    # the op and the custom op itself (what a torch.compile graph calls, which may
    # pass strided tensors) read a transposed or sliced tensor by its values
    X = te.placeholder((3, 4), name="Xs", dtype="float64")
    Y = te.compute((3, 4), lambda i, j: X[i, j] * 2.0 + j, name="Ys")
    f = tt.op(Y, [X])
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    for x in (base[:, :3].t(), base[:, ::2].t(), base.t()[::2, :]):
        assert not x.is_contiguous()
        want = x * 2 + torch.arange(4, dtype=torch.float64)
        assert torch.equal(f(x), want)
        (y,) = tt._kernel([x], f.spec.key)
        assert torch.equal(y, want)
