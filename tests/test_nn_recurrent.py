"""te.nn recurrent cells (rnn_cell, lstm_cell, gru_cell) against torch.nn.RNNCell,
LSTMCell and GRUCell with copied weights: values, gradients w.r.t. every weight and
input (torch autograd), float64 finite differences, and one compiled kernel per test."""

import functools
import operator

import numpy as np
import pytest
import torch

import texpr as te
from nn_testutil import gradients_match_torch, ph
from texpr.testing import numeric_gradient

nn = te.nn

B, I, H = 2, 3, 4
GATES = {"rnn_tanh": 1, "rnn_relu": 1, "lstm": 4, "gru": 3}


def torch_cell(kind, seed):
    torch.manual_seed(seed)
    if kind.startswith("rnn"):
        return torch.nn.RNNCell(I, H, nonlinearity=kind[4:]).double()
    return {"lstm": torch.nn.LSTMCell, "gru": torch.nn.GRUCell}[kind](I, H).double()


class Cell:
    """A texpr cell of ``kind`` with placeholders for its inputs and torch-layout weights,
    a scalar loss ``sum(head_k * out_k)`` over its outputs, and a feed copied from a
    torch module."""

    def __init__(self, kind, with_state=True, bias=True, seed=0, dtype="float64"):
        g = GATES[kind]
        self.kind = kind
        self.x = ph((B, I), "x", dtype)
        self.h = ph((B, H), "h", dtype) if with_state else None
        self.c = ph((B, H), "c", dtype) if with_state and kind == "lstm" else None
        self.w_ih, self.w_hh = ph((g * H, I), "w_ih", dtype), ph((g * H, H), "w_hh", dtype)
        self.b_ih = ph((g * H,), "b_ih", dtype) if bias else None
        self.b_hh = ph((g * H,), "b_hh", dtype) if bias else None
        w = (self.w_ih, self.w_hh, self.b_ih, self.b_hh)
        if kind == "lstm":
            self.outs = list(nn.lstm_cell(self.x, None if self.h is None else (self.h, self.c),
                                          *w))
        elif kind == "gru":
            self.outs = [nn.gru_cell(self.x, self.h, *w)]
        else:
            self.outs = [nn.rnn_cell(self.x, self.h, *w, nonlinearity=kind[4:])]
        self.heads = [ph(o.shape, f"head{k}", "float64") for k, o in enumerate(self.outs)]
        terms = []
        for o, hd in zip(self.outs, self.heads):
            b, j = te.reduce_axis(B, "b"), te.reduce_axis(H, "j")
            terms.append(te.compute((), lambda o=o, hd=hd, b=b, j=j: te.sum(
                hd[b, j] * o[b, j], axis=[b, j]), name=f"L_{o.name}"))
        self.loss = te.compute((), lambda: functools.reduce(operator.add,
                                                            [t[()] for t in terms]), name="L")
        self.module = torch_cell(kind, seed)
        if not bias:
            with torch.no_grad():
                self.module.bias_ih.zero_()
                self.module.bias_hh.zero_()
        rng = np.random.default_rng(seed)
        m = self.module
        self.feed = {self.x: rng.standard_normal((B, I)).astype(dtype),
                     self.w_ih: m.weight_ih.detach().numpy().astype(dtype),
                     self.w_hh: m.weight_hh.detach().numpy().astype(dtype)}
        for t, v in ((self.h, rng.standard_normal((B, H))), (self.c, rng.standard_normal((B, H))),
                     (self.b_ih, m.bias_ih.detach().numpy()),
                     (self.b_hh, m.bias_hh.detach().numpy())):
            if t is not None:
                self.feed[t] = v.astype(dtype)
        for k, hd in enumerate(self.heads):
            self.feed[hd] = rng.standard_normal((B, H))

    def wrt(self):
        """The tensors to differentiate for: inputs, states, weights (biases if any)."""
        return [t for t in (self.x, self.h, self.c, self.w_ih, self.w_hh, self.b_ih, self.b_hh)
                if t is not None]

    def torch_reference(self):
        """torch's outputs and the gradients of ``sum(head * out)`` w.r.t. :meth:`wrt`
        (the module's own parameters for the weights)."""
        m = self.module
        leaf = {t: torch.tensor(self.feed[t], dtype=torch.float64, requires_grad=True)
                for t in (self.x, self.h, self.c) if t is not None}
        x = leaf[self.x]
        if self.kind == "lstm":
            outs = m(x, None if self.h is None else (leaf[self.h], leaf[self.c]))
        else:
            outs = (m(x, None if self.h is None else leaf[self.h]),)
        loss = sum((o * torch.tensor(self.feed[hd])).sum() for o, hd in zip(outs, self.heads))
        m.zero_grad()
        loss.backward()
        params = {self.w_ih: m.weight_ih, self.w_hh: m.weight_hh, self.b_ih: m.bias_ih,
                  self.b_hh: m.bias_hh}
        grads = [(leaf[t] if t in leaf else params[t]).grad.numpy() for t in self.wrt()]
        return [o.detach().numpy() for o in outs], grads


@pytest.mark.parametrize("kind", sorted(GATES))
def test_cell_matches_torch_and_finite_differences(kind):
    cell = Cell(kind)
    wrt, grads, got = gradients_match_torch(cell)
    for g, t in zip(got[len(cell.outs):], wrt):  # float64 central differences
        np.testing.assert_allclose(g, numeric_gradient(cell.loss, t, cell.feed), rtol=1e-6,
                                   atol=1e-8, err_msg=f"dL/d{t.name}")
    # the compiled kernel (forward and gradients in one) agrees with the evaluator
    from texpr import codegen

    inputs = [t for t in cell.feed]
    kernel = codegen.build(cell.outs + grads, inputs, parallel=False, blas=False)
    for k, r in zip(kernel(*[cell.feed[t] for t in inputs]), got):
        np.testing.assert_allclose(k, r, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("kind", ["rnn_relu", "lstm", "gru"])
def test_cell_without_state_or_bias(kind):
    """No state (torch's zeros default) and no biases: values and weight gradients
    still match torch."""
    for with_state, bias in ((False, True), (True, False), (False, False)):
        cell = Cell(kind, with_state=with_state, bias=bias, seed=3)
        wrt = [t for t in cell.wrt() if t is not cell.w_hh or with_state]
        grads = list(te.differentiate(cell.loss, wrt).result)
        got = te.evaluate(cell.outs + grads, cell.feed)
        ref_outs, ref_grads = cell.torch_reference()
        ref_grads = [g for g, t in zip(ref_grads, cell.wrt()) if t in wrt]
        for g, r in zip(got, ref_outs + ref_grads):
            np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12)


def test_gru_reset_gate_multiplies_the_hidden_bias():
    """torch's GRU: n = tanh(W_in x + b_in + r * (W_hn h + b_hn)), so b_hn is scaled by r
    and b_in is not; a model that put both biases outside r would differ here."""
    cell = Cell("gru", seed=5)
    with torch.no_grad():
        cell.module.bias_hh[2 * H:] = 3.0
        cell.module.bias_ih[2 * H:] = -1.0
    cell.feed[cell.b_hh] = cell.module.bias_hh.detach().numpy().copy()
    cell.feed[cell.b_ih] = cell.module.bias_ih.detach().numpy().copy()
    (ref,), _ = cell.torch_reference()
    np.testing.assert_allclose(te.evaluate(cell.outs[0], cell.feed), ref, rtol=1e-12)


def test_float32_stays_float32_and_stage_names():
    x, h, c = ph((B, I), "x", "float32"), ph((B, H), "h", "float32"), ph((B, H), "c", "float32")
    w_ih, w_hh = ph((4 * H, I), "w_ih", "float32"), ph((4 * H, H), "w_hh", "float32")
    h1, c1 = nn.lstm_cell(x, (h, c), w_ih, w_hh, name="cell")
    assert (h1.dtype, c1.dtype) == ("float32", "float32")
    assert (h1.name, c1.name) == ("cell_h", "cell_c")
    assert {op.name for op in te.topo_order(h1)} >= {"cell_ih", "cell_hh", "cell_c", "cell_h"}
    g = nn.gru_cell(x, h, ph((3 * H, I), "g_ih", "float32"), ph((3 * H, H), "g_hh", "float32"))
    assert g.dtype == "float32" and g.shape == (B, H)


def test_errors_name_the_argument():
    x, h = ph((B, I), "x"), ph((B, H), "h")
    w_ih, w_hh = ph((4 * H, I), "w_ih"), ph((4 * H, H), "w_hh")
    with pytest.raises(te.ShapeError, match=r"weight_hh w_hh must be \(3\*H, H\)"):
        nn.gru_cell(x, h, ph((3 * H, I), "g_ih"), w_hh)
    with pytest.raises(te.ShapeError, match=r"weight_ih w_ih must have 4\*H = 16 rows"):
        nn.lstm_cell(x, None, ph((3 * H, I), "w_ih"), w_hh)
    with pytest.raises(te.ShapeError, match="expects 3 input features but the input has 5"):
        nn.lstm_cell(ph((B, 5), "x5"), None, w_ih, w_hh)
    with pytest.raises(te.ShapeError, match=r"hidden state h3 must have shape \(2, 4\)"):
        nn.rnn_cell(x, ph((B, 3), "h3"), ph((H, I), "r_ih"), ph((H, H), "r_hh"))
    with pytest.raises(te.ShapeError, match=r"cell state c must have shape \(2, 4\)"):
        nn.lstm_cell(x, (h, ph((3, H), "c")), w_ih, w_hh)
    with pytest.raises(te.ShapeError, match=r"bias_hh bb must be \(4\*H,\) = \(16,\)"):
        nn.lstm_cell(x, None, w_ih, w_hh, ph((4 * H,), "b"), ph((H,), "bb"))
    with pytest.raises(te.TexprError, match="hx must be a pair"):
        nn.lstm_cell(x, h, w_ih, w_hh)
    with pytest.raises(te.TexprError, match="nonlinearity must be one of 'tanh', 'relu'"):
        nn.rnn_cell(x, h, ph((H, I), "r_ih"), ph((H, H), "r_hh"), nonlinearity="sigmoid")
    with pytest.raises(te.DTypeError, match="input xi must be a float tensor"):
        nn.rnn_cell(ph((B, I), "xi", "int64"), h, ph((H, I), "r_ih"), ph((H, H), "r_hh"))
    with pytest.raises(te.ShapeError, match="input x1 must have 2 dimensions"):
        nn.gru_cell(ph((I,), "x1"), None, ph((3 * H, I), "g_ih"), ph((3 * H, H), "g_hh"))
