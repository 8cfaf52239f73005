"""te.nn.rnn, lstm and gru (whole sequences over te.scan) against torch.nn.RNN, LSTM and
GRU with copied weights: outputs and final states, gradients w.r.t. the input, the
initial states and every weight (torch autograd), float64 finite differences, and one
compiled kernel per test."""

import functools
import operator

import numpy as np
import pytest
import torch

import texpr as te
from nn_testutil import gradients_match_torch, ph
from texpr.scan import ScanOp
from texpr.testing import numeric_gradient

nn = te.nn

T, B, I, H = 4, 2, 3, 3
GATES = {"rnn": 1, "lstm": 4, "gru": 3}


class Seq:
    """A texpr sequence model of ``kind`` with torch-layout weight placeholders, a
    scalar loss ``sum_k sum(head_k * out_k)`` over its results, and a feed copied from
    the equivalent torch module."""

    def __init__(self, kind, batch_first=False, with_state=True, bias=True, seed=0,
                 nonlinearity="tanh", state_2d=False):
        g = GATES[kind]
        self.kind, self.batch_first, self.nonlinearity = kind, batch_first, nonlinearity
        self.x = ph((B, T, I) if batch_first else (T, B, I), "x")
        sshape = (B, H) if state_2d else (1, B, H)
        self.h0 = ph(sshape, "h0") if with_state else None
        self.c0 = ph(sshape, "c0") if with_state and kind == "lstm" else None
        self.w_ih, self.w_hh = ph((g * H, I), "w_ih"), ph((g * H, H), "w_hh")
        self.b_ih = ph((g * H,), "b_ih") if bias else None
        self.b_hh = ph((g * H,), "b_hh") if bias else None
        w = (self.x, self.w_ih, self.w_hh, self.b_ih, self.b_hh)
        if kind == "lstm":
            hx = None if self.h0 is None else (self.h0, self.c0)
            out, (h_n, c_n) = nn.lstm(*w, hx=hx, batch_first=batch_first)
            self.outs = [out, h_n, c_n]
        elif kind == "gru":
            self.outs = list(nn.gru(*w, hx=self.h0, batch_first=batch_first))
        else:
            self.outs = list(nn.rnn(*w, hx=self.h0, nonlinearity=nonlinearity,
                                    batch_first=batch_first))
        self.heads = [ph(o.shape, f"head{k}") for k, o in enumerate(self.outs)]
        terms = []
        for o, hd in zip(self.outs, self.heads):
            axes = [te.reduce_axis(n, f"s{d}") for d, n in enumerate(o.shape)]
            terms.append(te.compute((), lambda o=o, hd=hd, axes=axes: te.sum(
                hd[tuple(axes)] * o[tuple(axes)], axis=axes), name=f"L_{o.name}"))
        self.loss = te.compute((), lambda: functools.reduce(operator.add,
                                                            [t[()] for t in terms]), name="L")
        torch.manual_seed(seed)
        cls = {"rnn": torch.nn.RNN, "lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[kind]
        kw = dict(nonlinearity=nonlinearity) if kind == "rnn" else {}
        self.module = cls(I, H, bias=bias, batch_first=batch_first, **kw).double()
        m = self.module
        rng = np.random.default_rng(seed)
        self.feed = {self.x: rng.standard_normal(self.x.shape),
                     self.w_ih: m.weight_ih_l0.detach().numpy().copy(),
                     self.w_hh: m.weight_hh_l0.detach().numpy().copy()}
        if bias:
            self.feed[self.b_ih] = m.bias_ih_l0.detach().numpy().copy()
            self.feed[self.b_hh] = m.bias_hh_l0.detach().numpy().copy()
        for t in (self.h0, self.c0):
            if t is not None:
                self.feed[t] = rng.standard_normal(t.shape)
        for hd in self.heads:
            self.feed[hd] = rng.standard_normal(hd.shape)

    def wrt(self):
        return [t for t in (self.x, self.h0, self.c0, self.w_ih, self.w_hh, self.b_ih,
                            self.b_hh) if t is not None]

    def torch_reference(self):
        """torch's results (output, final states) and the gradients of the same loss
        w.r.t. :meth:`wrt`."""
        m = self.module
        leaf = {t: torch.tensor(self.feed[t], requires_grad=True)
                for t in (self.x, self.h0, self.c0) if t is not None}

        def state(t):
            v = leaf[t]
            return v[None] if v.ndim == 2 else v

        if self.kind == "lstm":
            hx = None if self.h0 is None else (state(self.h0), state(self.c0))
            out, (h_n, c_n) = m(leaf[self.x], hx)
            outs = [out, h_n, c_n]
        else:
            out, h_n = m(leaf[self.x], None if self.h0 is None else state(self.h0))
            outs = [out, h_n]
        loss = sum((o * torch.tensor(self.feed[hd])).sum() for o, hd in zip(outs, self.heads))
        m.zero_grad()
        loss.backward()
        params = {self.w_ih: m.weight_ih_l0, self.w_hh: m.weight_hh_l0}
        if self.b_ih is not None:
            params.update({self.b_ih: m.bias_ih_l0, self.b_hh: m.bias_hh_l0})
        grads = [(leaf[t] if t in leaf else params[t]).grad.numpy() for t in self.wrt()]
        return [o.detach().numpy() for o in outs], grads


@pytest.mark.parametrize("kind,batch_first", [("rnn", False), ("lstm", False), ("gru", True)])
def test_sequence_matches_torch_and_finite_differences(kind, batch_first):
    seq = Seq(kind, batch_first=batch_first)
    wrt, _grads, got = gradients_match_torch(seq)
    for g, t in zip(got[len(seq.outs):], wrt):  # float64 central differences
        np.testing.assert_allclose(g, numeric_gradient(seq.loss, t, seq.feed), rtol=1e-6,
                                   atol=1e-8, err_msg=f"dL/d{t.name}")


def test_lstm_kernel_matches_the_evaluator():
    """One compiled kernel (outputs, final states and every gradient; a scan and its
    reverse-time adjoint scan) against the evaluator. One kernel only: the LSTM's
    gradient kernel is large and Numba takes minutes over it."""
    from texpr import codegen

    seq = Seq("lstm", seed=4)
    wrt = seq.wrt()
    grads = list(te.differentiate(seq.loss, wrt).result)
    got = te.evaluate(seq.outs + grads, seq.feed)
    inputs = list(seq.feed)
    kernel = codegen.build(seq.outs + grads, inputs, parallel=False, blas=False)
    names = [o.name for o in seq.outs] + [f"d{t.name}" for t in wrt]
    for k, r, n in zip(kernel(*[seq.feed[t] for t in inputs]), got, names):
        np.testing.assert_allclose(k, r, rtol=1e-11, atol=1e-12, err_msg=n)


@pytest.mark.parametrize("kind,kw", [
    ("lstm", dict(batch_first=True, with_state=False)),
    ("lstm", dict(bias=False, state_2d=True)),
    ("gru", dict(with_state=False, bias=False)),
    ("rnn", dict(nonlinearity="relu", batch_first=True, state_2d=True)),
])
def test_sequence_variants_match_torch(kind, kw):
    """Zero initial states, no biases, (B, H) states, batch_first, relu: values and
    every gradient still equal torch's (through the evaluator)."""
    gradients_match_torch(Seq(kind, seed=7, **kw))


def test_sequence_forward_matches_the_cell_unrolled():
    """The scan's steps equal lstm_cell applied T times (the same stages, unrolled)."""
    seq = Seq("lstm", seed=2)
    xs = [te.compute((B, I), lambda b, k, t=t: seq.x[t, b, k], name=f"x{t}") for t in range(T)]
    h = te.compute((B, H), lambda b, j: seq.h0[0, b, j], name="h")
    c = te.compute((B, H), lambda b, j: seq.c0[0, b, j], name="c")
    hs = []
    for t in range(T):
        h, c = nn.lstm_cell(xs[t], (h, c), seq.w_ih, seq.w_hh, seq.b_ih, seq.b_hh,
                            name=f"cell{t}")
        hs.append(h)
    got = te.evaluate(seq.outs[:2], seq.feed)
    unrolled = te.evaluate(hs, seq.feed)
    np.testing.assert_allclose(got[0], np.stack(unrolled), rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(got[1][0], unrolled[-1], rtol=1e-13, atol=1e-14)


def test_structure_input_projection_outside_the_scan():
    """The input projection of all steps is computed before the scan; in the body the
    gate stages read states only (the pre-activations are a state), and the one product
    with W_hh is the pre-activation stage."""
    x, w_ih, w_hh = ph((T, B, I), "x"), ph((4 * H, I), "w_ih"), ph((4 * H, H), "w_hh")
    out, (h_n, c_n) = nn.lstm(x, w_ih, w_hh, ph((4 * H,), "b_ih"), name="L1")
    scan_op = out.op.input_tensors()[0].op
    assert isinstance(scan_op, ScanOp)
    assert {op.name for op in scan_op.body_ops} == {"L1_pre.red0", "L1_pre", "L1_step_c",
                                                    "L1_step_h"}
    assert [s.name for s in scan_op.state_placeholder] == ["L1_state_h", "L1_state_c",
                                                           "L1_state_pre"]
    states = {id(s) for s in scan_op.state_placeholder}
    for op in scan_op.body_ops:
        if not op.name.startswith("L1_pre"):
            assert all(id(t) in states or t.op in scan_op.body_ops
                       for t in op.input_tensors()), op.name
    assert {t.op.name for t in scan_op.externals} == {"L1_ih", "w_hh", "b_ih"}
    assert out.shape == (T, B, H) and h_n.shape == c_n.shape == (1, B, H)
    out, h_n = nn.gru(ph((B, T, I), "xb"), ph((3 * H, I), "g_ih"), ph((3 * H, H), "g_hh"),
                      batch_first=True, name="G")
    assert out.shape == (B, T, H) and h_n.shape == (1, B, H)
    scan_op = out.op.input_tensors()[0].op
    assert [s.name for s in scan_op.state_placeholder] == ["G_state_h", "G_state_xi",
                                                           "G_state_hw"]


def test_float32_stays_float32():
    x, w_ih, w_hh = (ph(s, n, "float32") for s, n in (((T, B, I), "x"), ((4 * H, I), "w_ih"),
                                                      ((4 * H, H), "w_hh")))
    out, (h_n, c_n) = nn.lstm(x, w_ih, w_hh)
    assert (out.dtype, h_n.dtype, c_n.dtype) == ("float32",) * 3
    rng = np.random.default_rng(0)
    feed = {t: rng.standard_normal(t.shape).astype("float32") for t in (x, w_ih, w_hh)}
    v = te.evaluate(out, feed)
    assert v.dtype == np.float32 and np.isfinite(v).all()


def test_errors_name_the_argument():
    x, w_ih, w_hh = ph((T, B, I), "x"), ph((4 * H, I), "w_ih"), ph((4 * H, H), "w_hh")
    with pytest.raises(te.ShapeError, match="input x2 must have 3 dimensions"):
        nn.lstm(ph((B, I), "x2"), w_ih, w_hh)
    with pytest.raises(te.ShapeError, match="expects 3 input features but the input has 5"):
        nn.lstm(ph((T, B, 5), "x5"), w_ih, w_hh)
    with pytest.raises(te.ShapeError, match=r"h_0 h must have shape \(1, 2, 3\)"):
        nn.lstm(x, w_ih, w_hh, hx=(ph((2, B, H), "h"), ph((1, B, H), "c")))
    with pytest.raises(te.ShapeError, match=r"hx hb must have shape \(1, 4, 3\)"):
        nn.gru(x, ph((3 * H, I), "g_ih"), ph((3 * H, H), "g_hh"), hx=ph((1, B, H), "hb"),
               batch_first=True)
    with pytest.raises(te.ShapeError, match="weight_hh w_hh must be"):
        nn.gru(x, ph((3 * H, I), "g_ih"), w_hh)
    with pytest.raises(te.ShapeError, match="no time steps"):
        nn.rnn(ph((0, B, I), "x0"), ph((H, I), "r_ih"), ph((H, H), "r_hh"))
    with pytest.raises(te.TexprError, match="batch_first must be True or False"):
        nn.rnn(x, ph((H, I), "r_ih"), ph((H, H), "r_hh"), batch_first=1)
    with pytest.raises(te.TexprError, match="hx must be a pair"):
        nn.lstm(x, w_ih, w_hh, hx=ph((1, B, H), "h"))
