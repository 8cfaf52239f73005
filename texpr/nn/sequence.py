"""Whole-sequence recurrent models over :func:`texpr.scan`: ``rnn``, ``lstm``, ``gru``.

Each runs its cell of :mod:`.recurrent` over the time axis of an input
``(T, B, I)`` (``(B, T, I)`` with ``batch_first``), as ``torch.nn.RNN``,
``torch.nn.LSTM`` and ``torch.nn.GRU`` with one layer, one direction and the
same weight layout, so a torch module's ``weight_ih_l0``, ``weight_hh_l0``,
``bias_ih_l0`` and ``bias_hh_l0`` copy across.

The structure, per model:

* ``{name}_ih[t, b, :] = x[t, b] W_ih^T``: the input projection of every step at
  once, one contraction before the scan (it does not depend on the state);
* a scan over states of shape ``(T + 1, B, H)`` whose step 0 is the initial
  state (``hx``, or zeros) and whose step ``t >= 1`` is the cell applied to
  ``x[t - 1]`` and the state at ``t - 1``: a body stage ``{name}_hh[t] =
  S[t - 1] W_hh^T`` (the only product inside the time loop) and the cell's
  elementwise gate stages, which add the biases;
* ``output[t] = S_h[t + 1]`` (steps 1..T) and the final states ``S[T]``.

Differentiation goes through the scan (its adjoint is a scan in reverse time
over the stored states), so the gradient costs O(T) steps.
"""

from .. import dtypes as dt
from ..errors import ShapeError
from ..expr import cast
from ..scan import scan
from ..tensor import compute, placeholder, reduce_axis
from .. import reduction as red
from ._util import check_bool, check_choice, check_tensor, float_const
from .recurrent import check_weights, gru_update, lstm_update, rnn_update

__all__ = ["rnn", "lstm", "gru"]


def _check_input(op, kind, x, weight_ih, weight_hh, bias_ih, bias_hh, batch_first):
    """Checks; returns ``(T, B, H, dtype, x_at)`` with ``x_at(t, b, k)`` the load of
    step ``t``, sample ``b``, feature ``k`` in either layout."""
    batch_first = check_bool(batch_first, op, "batch_first")
    check_tensor(x, op, "input", ndim=3, float_only=True)
    steps, batch = (x.shape[1], x.shape[0]) if batch_first else x.shape[:2]
    hidden = check_weights(op, kind, weight_ih, weight_hh, bias_ih, bias_hh, x.shape[2])
    if steps < 1:
        raise ShapeError(f"{op}: input {x.name} {x.shape} has no time steps")
    dtype = x.dtype
    for t in (weight_ih, weight_hh, bias_ih, bias_hh):
        if t is not None:
            dtype = dt.promote(dtype, t.dtype)

    def x_at(t, b, k):
        return x[b, t, k] if batch_first else x[t, b, k]

    return steps, batch, hidden, dtype, x_at


def _initial(op, what, s, batch, hidden, dtype, name):
    """The scan's init ``(1, B, H)`` from a state ``(1, B, H)`` or ``(B, H)`` (zeros for
    ``None``), cast to the state dtype."""
    if s is None:
        zero = float_const(0.0, dtype)
        return compute((1, batch, hidden), lambda _, b, j: zero, name=name)
    check_tensor(s, op, what, float_only=True)
    if s.shape == (1, batch, hidden):
        if s.dtype == dtype:
            return s
        return compute(s.shape, lambda z, b, j: cast(s[z, b, j], dtype), name=name)
    if s.shape == (batch, hidden):
        return compute((1, batch, hidden), lambda _, b, j: cast(s[b, j], dtype), name=name)
    raise ShapeError(f"{op}: {what} {s.name} must have shape (1, {batch}, {hidden}) "
                     f"(layers*directions, batch, hidden) or ({batch}, {hidden}), got {s.shape}")


def _input_projection(x_at, steps, batch, weight_ih, name):
    """``{name}_ih[t, b, j] = sum_k x[t, b, k] W_ih[j, k]``: ``(T, B, G*H)``, one reduction
    stage (the biases are added in the body, where it is read)."""
    k = reduce_axis(weight_ih.shape[1], "k")
    return compute((steps, batch, weight_ih.shape[0]),
                   lambda t, b, j: red.sum(x_at(t, b, k) * weight_ih[j, k], axis=k),
                   name=f"{name}_ih", tag="recurrent")


def _hidden_projection(state, weight_hh, name):
    """The body stage ``{name}_hh[t, b, j] = sum_k S[t - 1, b, k] W_hh[j, k]``, of the
    state's shape with ``G*H`` columns."""
    steps1, batch, hidden = state.shape
    k = reduce_axis(hidden, "k")
    return compute((steps1, batch, weight_hh.shape[0]),
                   lambda t, b, j: red.sum(state[t - 1, b, k] * weight_hh[j, k], axis=k),
                   name=f"{name}_hh", tag="recurrent")


def _plus_biases(v, biases, col):
    """``v + b[col]`` for each bias that is not ``None``."""
    for bias in biases:
        if bias is not None:
            v = v + bias[col]
    return v


def _outputs(states, steps, batch_first, name, final_names=("h_n", "c_n")):
    """``output`` (steps 1..T of the first state, in the input's layout) and the final
    states ``(1, B, H)`` each."""
    hs = states[0]
    _, batch, hidden = hs.shape
    if batch_first:
        out = compute((batch, steps, hidden), lambda b, t, j: hs[t + 1, b, j], name=name,
                      tag="recurrent")
    else:
        out = compute((steps, batch, hidden), lambda t, b, j: hs[t + 1, b, j], name=name,
                      tag="recurrent")
    finals = [compute((1, batch, hidden), lambda _, b, j, s=s: s[steps, b, j],
                      name=f"{name}_{fn}", tag="recurrent")
              for s, fn in zip(states, final_names)]
    return out, finals


def rnn(x, weight_ih, weight_hh, bias_ih=None, bias_hh=None, hx=None, nonlinearity="tanh",
        batch_first=False, name="rnn"):
    """An Elman RNN over a whole sequence, as ``torch.nn.RNN`` (one layer, one
    direction): ``h_t = act(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)``.

    Args:
        x: ``(T, B, I)`` float (``(B, T, I)`` with ``batch_first``).
        weight_ih: ``(H, I)``. weight_hh: ``(H, H)``. bias_ih, bias_hh: ``(H,)`` or ``None``.
        hx: the initial state ``(1, B, H)`` (torch's layout) or ``(B, H)``; ``None`` for zeros.
        nonlinearity: ``"tanh"`` or ``"relu"``. batch_first: the layout of ``x`` and output.
    Returns:
        ``(output, h_n)``: output ``(T, B, H)`` (``(B, T, H)`` with ``batch_first``), the
        hidden state of every step; ``h_n`` ``(1, B, H)``, the last one.
    Raises:
        ShapeError: shapes not in torch's layout, no time steps. DTypeError: an integer
        tensor. TexprError: a non-tensor argument, another ``nonlinearity``.
    """
    op = "rnn"
    nonlinearity = check_choice(nonlinearity, ("tanh", "relu"), op, "nonlinearity")
    steps, batch, hidden, dtype, x_at = _check_input(op, "rnn", x, weight_ih, weight_hh,
                                                     bias_ih, bias_hh, batch_first)
    xw = _input_projection(x_at, steps, batch, weight_ih, name)
    shape = (steps + 1, batch, hidden)
    state = placeholder(shape, f"{name}_state_h", dtype)
    hw = _hidden_projection(state, weight_hh, name)
    update = rnn_update(shape, lambda idx, g, j: _plus_biases(
        hw[idx + (j,)] + xw[(idx[0] - 1, idx[1], j)], (bias_ih, bias_hh), j),
        nonlinearity, f"{name}_step")
    init = _initial(op, "hx", hx, batch, hidden, dtype, f"{name}_h0")
    hs = scan(init, update, state, name=f"{name}_h")
    out, (h_n,) = _outputs([hs], steps, batch_first, name)
    return out, h_n


def lstm(x, weight_ih, weight_hh, bias_ih=None, bias_hh=None, hx=None, batch_first=False,
         name="lstm"):
    """An LSTM over a whole sequence, as ``torch.nn.LSTM`` (one layer, one direction;
    gates stacked ``i, f, g, o`` as :func:`~texpr.nn.lstm_cell`).

    Args:
        x: ``(T, B, I)`` float (``(B, T, I)`` with ``batch_first``).
        weight_ih: ``(4H, I)``. weight_hh: ``(4H, H)``. bias_ih, bias_hh: ``(4H,)`` or ``None``
            (torch's ``weight_ih_l0`` etc.).
        hx: ``(h_0, c_0)``, each ``(1, B, H)`` (torch's layout) or ``(B, H)``; ``None``
            for zeros.
        batch_first: the layout of ``x`` and ``output``.
    Returns:
        ``(output, (h_n, c_n))``: output ``(T, B, H)`` (``(B, T, H)`` with ``batch_first``),
        the hidden state of every step; ``h_n``, ``c_n`` ``(1, B, H)``, the last ones.
    Raises:
        ShapeError: shapes not in torch's layout, no time steps. DTypeError: an integer
        tensor. TexprError: a non-tensor argument, ``hx`` not a pair.
    """
    from .recurrent import _pair

    op = "lstm"
    steps, batch, hidden, dtype, x_at = _check_input(op, "lstm", x, weight_ih, weight_hh,
                                                     bias_ih, bias_hh, batch_first)
    h0, c0 = _pair(op, hx)
    xw = _input_projection(x_at, steps, batch, weight_ih, name)
    shape = (steps + 1, batch, hidden)
    sh = placeholder(shape, f"{name}_state_h", dtype)
    sc = placeholder(shape, f"{name}_state_c", dtype)
    hw = _hidden_projection(sh, weight_hh, name)

    def pre(idx, gate, j):
        col = gate * hidden + j
        return _plus_biases(hw[idx + (col,)] + xw[(idx[0] - 1, idx[1], col)],
                            (bias_ih, bias_hh), col)

    h_upd, c_upd = lstm_update(shape, pre, lambda idx, j: sc[(idx[0] - 1, idx[1], j)],
                               f"{name}_step")
    h_init = _initial(op, "h_0", h0, batch, hidden, dtype, f"{name}_h0")
    if h0 is None and c0 is None:  # one zero stage for both
        inits = [h_init, h_init]
    else:
        inits = [h_init, _initial(op, "c_0", c0, batch, hidden, dtype, f"{name}_c0")]
    hs, cs = scan(inits, [h_upd, c_upd], [sh, sc], name=f"{name}_hc")
    out, (h_n, c_n) = _outputs([hs, cs], steps, batch_first, name)
    return out, (h_n, c_n)


def gru(x, weight_ih, weight_hh, bias_ih=None, bias_hh=None, hx=None, batch_first=False,
        name="gru"):
    """A GRU over a whole sequence, as ``torch.nn.GRU`` (one layer, one direction; gates
    stacked ``r, z, n`` as :func:`~texpr.nn.gru_cell`, ``b_hn`` inside the reset gate).

    Args:
        x: ``(T, B, I)`` float (``(B, T, I)`` with ``batch_first``).
        weight_ih: ``(3H, I)``. weight_hh: ``(3H, H)``. bias_ih, bias_hh: ``(3H,)`` or ``None``.
        hx: the initial state ``(1, B, H)`` (torch's layout) or ``(B, H)``; ``None`` for zeros.
        batch_first: the layout of ``x`` and ``output``.
    Returns:
        ``(output, h_n)``: output ``(T, B, H)`` (``(B, T, H)`` with ``batch_first``), the
        hidden state of every step; ``h_n`` ``(1, B, H)``, the last one.
    Raises:
        ShapeError: shapes not in torch's layout, no time steps. DTypeError: an integer
        tensor. TexprError: a non-tensor argument.
    """
    op = "gru"
    steps, batch, hidden, dtype, x_at = _check_input(op, "gru", x, weight_ih, weight_hh,
                                                     bias_ih, bias_hh, batch_first)
    xw = _input_projection(x_at, steps, batch, weight_ih, name)
    shape = (steps + 1, batch, hidden)
    state = placeholder(shape, f"{name}_state_h", dtype)
    hw = _hidden_projection(state, weight_hh, name)
    update = gru_update(shape,
                        lambda idx, g, j: _plus_biases(
                            xw[(idx[0] - 1, idx[1], g * hidden + j)], (bias_ih,), g * hidden + j),
                        lambda idx, g, j: _plus_biases(
                            hw[idx + (g * hidden + j,)], (bias_hh,), g * hidden + j),
                        lambda idx, j: state[(idx[0] - 1, idx[1], j)], f"{name}_step")
    init = _initial(op, "hx", hx, batch, hidden, dtype, f"{name}_h0")
    hs = scan(init, update, state, name=f"{name}_h")
    out, (h_n,) = _outputs([hs], steps, batch_first, name)
    return out, h_n
