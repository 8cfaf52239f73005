"""Whole-sequence recurrent models over :func:`texpr.scan`: ``rnn``, ``lstm``, ``gru``.

Each runs its cell of :mod:`.recurrent` over the time axis of an input
``(T, B, I)`` (``(B, T, I)`` with ``batch_first``), as ``torch.nn.RNN``,
``torch.nn.LSTM`` and ``torch.nn.GRU`` with one layer, one direction and the
same weight layout, so a torch module's ``weight_ih_l0``, ``weight_hh_l0``,
``bias_ih_l0`` and ``bias_hh_l0`` copy across.

The structure, per model:

* ``{name}_ih[t, b, :] = x[t, b] W_ih^T``: the input projection of every step at
  once, one contraction before the scan (it does not depend on the state);
* one scan (``{name}_scan``) over ``T + 1`` steps whose step 0 holds the initial
  state (``hx``, or zeros) and whose step ``t >= 1`` is the cell applied to
  ``x[t - 1]`` and the state at ``t - 1``. Its states: ``h`` (and ``c``), and the
  gate pre-activations the next step reads (``h[t] W_hh^T + xw[t] + b``; the
  GRU keeps the hidden and input parts apart). The body is the cell's
  elementwise gate stages, which read states only, and the pre-activation
  stage, the only product inside the time loop (see :func:`_recurrence`);
* ``output[t] = S_h[t + 1]`` (steps 1..T) and the final states ``S[T]``.

Differentiation goes through the scan (its adjoint is a scan in reverse time
over the stored states), so the gradient costs O(T) steps.
"""

from .. import dtypes as dt
from ..errors import ShapeError
from ..expr import cast, select
from ..scan import scan
from ..tensor import compute, placeholder, reduce_axis
from .. import reduction as red
from ._util import check_bool, check_choice, check_tensor, float_const
from .recurrent import _pair, check_weights, gru_update, lstm_update, rnn_update

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
    ``None``), cast to the state dtype (that of the input and weights promoted)."""
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


def _recurrence(name, dtype, xw, weight_hh, ih_biases, hh_biases, h_init, c_init, h_zero,
                split, make_updates):
    """The scan of a recurrent model, with the gate pre-activations as states.

    Every state has ``T + 1`` steps, step 0 the initial value: ``h`` (and ``c`` when
    ``c_init`` is given), ``(B, H)`` per step, and the pre-activations that step
    ``t + 1`` reads, ``(B, G*H)`` per step:

    * ``split=False`` (LSTM, RNN): one state ``pre[t] = h[t] W_hh^T + xw[t] + b_ih +
      b_hh`` (stage ``{name}_pre``);
    * ``split=True`` (GRU, whose reset gate scales the hidden part alone): ``hw[t] =
      h[t] W_hh^T + b_hh`` (stage ``{name}_hh``) and ``xi[t] = xw[t] + b_ih`` (stage
      ``{name}_xi``).

    ``make_updates(h_prev, c_prev, pre_prev)`` builds the cell's update stages of step
    ``t`` (``h`` first) from accessors of step ``t - 1``: ``h_prev(idx, j)``,
    ``c_prev(idx, j)`` (``None`` without a cell state) and ``pre_prev(idx, col)`` (a pair
    ``(xi_prev, hw_prev)`` with ``split``), ``idx = (t, b)``. The pre-activation stages
    then read the new ``h[t]`` (they are zero at the last step, which nothing reads).

    Why states: the scan's adjoint reads the stored states and recomputes the body's
    other stages for every step. With the product ``h W_hh^T`` and the input
    projection behind a state, the gate stages read states only, so the gradient
    neither recomputes the product of every step nor multiplies by ``W_hh`` a second
    time to reach ``xw`` (about a quarter less gradient work for the LSTM).

    Returns the scan's outputs: ``h``, [``c``,] then the pre-activation states.
    """
    _, batch, hidden = h_init.shape
    steps, cols = xw.shape[0], weight_hh.shape[0]
    shape, pshape = (steps + 1, batch, hidden), (steps + 1, batch, cols)
    sh = placeholder(shape, f"{name}_state_h", dtype)
    sc = None if c_init is None else placeholder(shape, f"{name}_state_c", dtype)
    pre_names = ("xi", "hw") if split else ("pre",)
    sp = [placeholder(pshape, f"{name}_state_{n}", dtype) for n in pre_names]

    def lag(state):
        return lambda idx, j: state[(idx[0] - 1, idx[1], j)]

    pre_prev = (lag(sp[0]), lag(sp[1])) if split else lag(sp[0])
    updates = list(make_updates(lag(sh), None if sc is None else lag(sc), pre_prev))
    h_upd = updates[0]

    def product(h_at, b, j, k):  # sum_k h[.., b, k] W_hh[j, k]
        return red.sum(h_at(b, k) * weight_hh[j, k], axis=k)

    def pre_body(with_x, with_h, h_at, step, product=True):
        """The pre-activation part: ``xw + b_ih`` (``with_x``), ``h W_hh^T + b_hh``
        (``with_h``; the product left out when ``product`` is false, for a zero ``h``)."""
        def body(t, b, j):
            v = None
            if with_h and product:
                k = reduce_axis(hidden, "k")
                v = red.sum(h_at(t)(b, k) * weight_hh[j, k], axis=k)
            if with_x:
                x = xw[step(t), b, j]
                v = x if v is None else v + x
            v = _plus_biases(v, (ih_biases if with_x else ()) + (hh_biases if with_h else ()), j)
            return v if v is not None else float_const(0.0, dtype)
        return body

    parts = [(True, False), (False, True)] if split else [(True, True)]
    for (with_x, with_h), n in zip(parts, pre_names):
        upd = pre_body(with_x, with_h, lambda t: lambda b, k: h_upd[t, b, k], lambda t: t)
        updates.append(compute(pshape, lambda t, b, j, upd=upd: select(
            t < steps, upd(t, b, j), float_const(0.0, dtype)), name=f"{name}_{n}",
            tag="recurrent"))
    inits = [h_init] + ([] if sc is None else [c_init])
    for (with_x, with_h), n in zip(parts, pre_names):
        init = pre_body(with_x, with_h, lambda z: lambda b, k: h_init[z, b, k], lambda z: z,
                        product=not h_zero)
        inits.append(compute((1, batch, cols), init, name=f"{name}_{n}0", tag="recurrent"))
    states = [sh] + ([] if sc is None else [sc]) + sp
    return scan(inits, updates, states, name=f"{name}_scan")


def _plus_biases(v, biases, col):
    """``v + b[col]`` for each bias that is not ``None`` (``v`` may be ``None``: the sum of
    the biases, ``None`` without any)."""
    for bias in biases:
        if bias is not None:
            v = bias[col] if v is None else v + bias[col]
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

    def updates(h_prev, c_prev, pre_prev):
        return [rnn_update((steps + 1, batch, hidden), lambda idx, g, j: pre_prev(idx, j),
                           nonlinearity, f"{name}_step")]

    init = _initial(op, "hx", hx, batch, hidden, dtype, f"{name}_h0")
    hs, _ = _recurrence(name, dtype, xw, weight_hh, (bias_ih,), (bias_hh,), init, None,
                        hx is None, False, updates)
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
    op = "lstm"
    steps, batch, hidden, dtype, x_at = _check_input(op, "lstm", x, weight_ih, weight_hh,
                                                     bias_ih, bias_hh, batch_first)
    h0, c0 = _pair(op, hx)
    xw = _input_projection(x_at, steps, batch, weight_ih, name)

    def updates(h_prev, c_prev, pre_prev):
        return lstm_update((steps + 1, batch, hidden),
                           lambda idx, gate, j: pre_prev(idx, gate * hidden + j), c_prev,
                           f"{name}_step")

    h_init = _initial(op, "h_0", h0, batch, hidden, dtype, f"{name}_h0")
    if h0 is None and c0 is None:  # one zero stage for both
        c_init = h_init
    else:
        c_init = _initial(op, "c_0", c0, batch, hidden, dtype, f"{name}_c0")
    hs, cs, _ = _recurrence(name, dtype, xw, weight_hh, (bias_ih,), (bias_hh,), h_init, c_init,
                            h0 is None, False, updates)
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

    def updates(h_prev, c_prev, pre_prev):
        xi_prev, hw_prev = pre_prev
        return [gru_update((steps + 1, batch, hidden),
                           lambda idx, gate, j: xi_prev(idx, gate * hidden + j),
                           lambda idx, gate, j: hw_prev(idx, gate * hidden + j), h_prev,
                           f"{name}_step")]

    init = _initial(op, "hx", hx, batch, hidden, dtype, f"{name}_h0")
    hs, _, _ = _recurrence(name, dtype, xw, weight_hh, (bias_ih,), (bias_hh,), init, None,
                           hx is None, True, updates)
    out, (h_n,) = _outputs([hs], steps, batch_first, name)
    return out, h_n
