"""Recurrent cells: ``rnn_cell``, ``lstm_cell`` and ``gru_cell`` (one time step).

Each cell follows its PyTorch module exactly, so weights copy across unchanged:
``weight_ih`` is ``(G*H, I)``, ``weight_hh`` is ``(G*H, H)``, ``bias_ih`` and
``bias_hh`` are ``(G*H,)``, with ``G`` gates stacked in torch's order (LSTM:
input ``i``, forget ``f``, cell ``g``, output ``o``; GRU: reset ``r``, update
``z``, new ``n``; plain RNN: one). The products with the weights are
:func:`~texpr.nn.dense` stages; the gate nonlinearities and the state update
are elementwise stages that read the gate columns ``gate * H + j``.

The gate arithmetic is written once, over accessor callables
(``pre(idx, gate, j)`` returns the pre-activation of ``gate`` at hidden unit
``j`` for the leading indices ``idx``), so the whole-sequence models can reuse
it inside a scan body, where the leading indices include time.

Sources: torch.nn.RNNCell, LSTMCell, GRUCell documentation (the equations);
Hochreiter and Schmidhuber 1997 (LSTM), Cho et al. 2014 (GRU).
"""

from .. import intrinsics as intr
from ..errors import ShapeError, TexprError
from ..expr import select
from ..tensor import compute
from ._util import check_choice, check_tensor
from .linear import dense

__all__ = ["rnn_cell", "lstm_cell", "gru_cell"]

#: gates per cell kind, in torch's stacking order
GATES = {"rnn": 1, "lstm": 4, "gru": 3}


def check_weights(op, kind, weight_ih, weight_hh, bias_ih, bias_hh, input_size=None):
    """Check the torch-layout weights of a ``kind`` cell; returns the hidden size ``H``.

    ``weight_ih`` must be ``(G*H, I)`` (``I = input_size`` when given), ``weight_hh``
    ``(G*H, H)``, each bias ``(G*H,)`` or ``None``; all float.
    """
    g = GATES[kind]
    check_tensor(weight_ih, op, "weight_ih", ndim=2, float_only=True)
    check_tensor(weight_hh, op, "weight_hh", ndim=2, float_only=True)
    hidden = weight_hh.shape[1]
    if weight_hh.shape[0] != g * hidden:
        raise ShapeError(f"{op}: weight_hh {weight_hh.name} must be ({g}*H, H) = "
                         f"({g * hidden}, {hidden}) for hidden size H={hidden}, got shape "
                         f"{weight_hh.shape}")
    if weight_ih.shape[0] != g * hidden:
        raise ShapeError(f"{op}: weight_ih {weight_ih.name} must have {g}*H = {g * hidden} rows "
                         f"(hidden size H={hidden} from weight_hh {weight_hh.name}), got shape "
                         f"{weight_ih.shape}")
    if input_size is not None and weight_ih.shape[1] != input_size:
        raise ShapeError(f"{op}: weight_ih {weight_ih.name} {weight_ih.shape} expects "
                         f"{weight_ih.shape[1]} input features but the input has {input_size}")
    for what, b in (("bias_ih", bias_ih), ("bias_hh", bias_hh)):
        if b is None:
            continue
        check_tensor(b, op, what, ndim=1, float_only=True)
        if b.shape[0] != g * hidden:
            raise ShapeError(f"{op}: {what} {b.name} must be ({g}*H,) = ({g * hidden},), got "
                             f"shape {b.shape}")
    return hidden


def check_state(op, what, s, shape):
    """A float state tensor of exactly ``shape`` (or ``None``); returns it."""
    if s is None:
        return None
    check_tensor(s, op, what, float_only=True)
    if s.shape != tuple(shape):
        raise ShapeError(f"{op}: {what} {s.name} must have shape {tuple(shape)} "
                         f"(batch, hidden), got {s.shape}")
    return s


# ---------------------------------------------------------------- gate arithmetic
# Each builder takes the output ``shape`` (leading axes + (H,)) and accessors that
# map (leading indices, gate, j) to expressions; it returns new stages.

def rnn_update(shape, pre, nonlinearity, name):
    """``h' = act(pre(0))``: one stage of ``shape``."""
    def body(*i):
        v = pre(i[:-1], 0, i[-1])
        return intr.tanh(v) if nonlinearity == "tanh" else select(v > 0, v, 0.0)

    return compute(shape, body, name=name, tag="rnn_cell")


def lstm_update(shape, pre, c_prev, name):
    """``c' = sigmoid(f) c + sigmoid(i) tanh(g)``, ``h' = sigmoid(o) tanh(c')``.

    Two stages of ``shape``: ``{name}_c`` and ``{name}_h``; ``c_prev(idx, j)`` may be
    ``None`` (a zero cell state). Returns ``(h', c')``.
    """
    def c_body(*i):
        idx, j = i[:-1], i[-1]
        new = intr.sigmoid(pre(idx, 0, j)) * intr.tanh(pre(idx, 2, j))
        if c_prev is None:
            return new
        return intr.sigmoid(pre(idx, 1, j)) * c_prev(idx, j) + new

    c = compute(shape, c_body, name=f"{name}_c", tag="lstm_cell")
    h = compute(shape, lambda *i: intr.sigmoid(pre(i[:-1], 3, i[-1])) * intr.tanh(c[i]),
                name=f"{name}_h", tag="lstm_cell")
    return h, c


def gru_update(shape, xpre, hpre, h_prev, name):
    """``r = sigmoid(x_r + h_r)``, ``z = sigmoid(x_z + h_z)``, ``n = tanh(x_n + r h_n)``,
    ``h' = (1 - z) n + z h``.

    ``xpre`` gives ``W_ih x + b_ih`` and ``hpre`` gives ``W_hh h + b_hh`` per gate
    (kept apart: ``r`` multiplies the hidden part of ``n`` only, bias included, as
    torch). ``h_prev(idx, j)`` may be ``None`` (a zero state). One stage ``{name}``
    of ``shape`` (``n`` is materialised as ``{name}_n``).
    """
    def n_body(*i):
        idx, j = i[:-1], i[-1]
        r = intr.sigmoid(xpre(idx, 0, j) + hpre(idx, 0, j))
        return intr.tanh(xpre(idx, 2, j) + r * hpre(idx, 2, j))

    n = compute(shape, n_body, name=f"{name}_n", tag="gru_cell")

    def h_body(*i):
        idx, j = i[:-1], i[-1]
        z = intr.sigmoid(xpre(idx, 1, j) + hpre(idx, 1, j))
        out = (1.0 - z) * n[i]
        return out if h_prev is None else out + z * h_prev(idx, j)

    return compute(shape, h_body, name=name, tag="gru_cell")


# ---------------------------------------------------------------- one-step cells

def _projections(op, kind, x, h, weight_ih, weight_hh, bias_ih, bias_hh, name):
    """Checks, then the stages ``{name}_ih = x W_ih^T + b_ih`` and ``{name}_hh = h W_hh^T
    + b_hh`` (the latter ``None`` when ``h`` is ``None``). Returns (H, xw, hw)."""
    check_tensor(x, op, "input", ndim=2, float_only=True)
    hidden = check_weights(op, kind, weight_ih, weight_hh, bias_ih, bias_hh, x.shape[1])
    check_state(op, "hidden state", h, (x.shape[0], hidden))
    xw = dense(x, weight_ih, bias_ih, name=f"{name}_ih")
    hw = None if h is None else dense(h, weight_hh, bias_hh, name=f"{name}_hh")
    return hidden, xw, hw


def _pre_sum(hidden, xw, hw, bias_hh):
    """The accessor ``pre(idx, gate, j) = xw[.., gate*H + j] + hw[.., gate*H + j]`` (the
    hidden bias alone when there is no hidden state)."""
    def pre(idx, gate, j):
        col = gate * hidden + j
        v = xw[idx + (col,)]
        if hw is not None:
            return v + hw[idx + (col,)]
        return v if bias_hh is None else v + bias_hh[col]

    return pre


def rnn_cell(x, h, weight_ih, weight_hh, bias_ih=None, bias_hh=None, nonlinearity="tanh",
             name="rnn_cell"):
    """One step of an Elman RNN, as ``torch.nn.RNNCell``:
    ``h' = act(x W_ih^T + b_ih + h W_hh^T + b_hh)`` with ``act`` tanh or relu.

    Args:
        x: ``(B, I)`` float. h: ``(B, H)`` float, or ``None`` for zeros (torch's default).
        weight_ih: ``(H, I)``. weight_hh: ``(H, H)``. bias_ih, bias_hh: ``(H,)`` or ``None``.
        nonlinearity: ``"tanh"`` (default) or ``"relu"``.
    Returns:
        ``h'``: ``(B, H)``, dtype promoted from the inputs.
    Raises:
        ShapeError: a shape that does not match torch's layout. DTypeError: an integer
        tensor. TexprError: a non-tensor argument or another ``nonlinearity``.
    """
    op = "rnn_cell"
    nonlinearity = check_choice(nonlinearity, ("tanh", "relu"), op, "nonlinearity")
    hidden, xw, hw = _projections(op, "rnn", x, h, weight_ih, weight_hh, bias_ih, bias_hh, name)
    return rnn_update((x.shape[0], hidden), _pre_sum(hidden, xw, hw, bias_hh), nonlinearity,
                      name)


def lstm_cell(x, hx, weight_ih, weight_hh, bias_ih=None, bias_hh=None, name="lstm_cell"):
    """One step of an LSTM, as ``torch.nn.LSTMCell`` (gates stacked ``i, f, g, o``)::

        i = sigmoid(W_ii x + b_ii + W_hi h + b_hi)     f = sigmoid(W_if x + ... )
        g = tanh(W_ig x + b_ig + W_hg h + b_hg)        o = sigmoid(W_io x + ... )
        c' = f * c + i * g                             h' = o * tanh(c')

    Args:
        x: ``(B, I)`` float. hx: ``(h, c)``, each ``(B, H)``, or ``None`` for zeros.
        weight_ih: ``(4H, I)``. weight_hh: ``(4H, H)``. bias_ih, bias_hh: ``(4H,)`` or ``None``.
    Returns:
        ``(h', c')``, each ``(B, H)`` (stages ``{name}_h`` and ``{name}_c``).
    Raises:
        ShapeError: a shape that does not match torch's layout. DTypeError: an integer
        tensor. TexprError: a non-tensor argument, ``hx`` not a pair.
    """
    op = "lstm_cell"
    h, c = _pair(op, hx)
    hidden, xw, hw = _projections(op, "lstm", x, h, weight_ih, weight_hh, bias_ih, bias_hh, name)
    check_state(op, "cell state", c, (x.shape[0], hidden))
    c_prev = None if c is None else (lambda idx, j: c[idx + (j,)])
    return lstm_update((x.shape[0], hidden), _pre_sum(hidden, xw, hw, bias_hh), c_prev, name)


def gru_cell(x, h, weight_ih, weight_hh, bias_ih=None, bias_hh=None, name="gru_cell"):
    """One step of a GRU, as ``torch.nn.GRUCell`` (gates stacked ``r, z, n``)::

        r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
        z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
        n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
        h' = (1 - z) * n + z * h

    Args:
        x: ``(B, I)`` float. h: ``(B, H)`` float, or ``None`` for zeros.
        weight_ih: ``(3H, I)``. weight_hh: ``(3H, H)``. bias_ih, bias_hh: ``(3H,)`` or ``None``.
    Returns:
        ``h'``: ``(B, H)``.
    Raises:
        ShapeError: a shape that does not match torch's layout. DTypeError: an integer
        tensor. TexprError: a non-tensor argument.
    """
    op = "gru_cell"
    hidden, xw, hw = _projections(op, "gru", x, h, weight_ih, weight_hh, bias_ih, bias_hh, name)

    def xpre(idx, gate, j):
        return xw[idx + (gate * hidden + j,)]

    def hpre(idx, gate, j):
        col = gate * hidden + j
        if hw is not None:
            return hw[idx + (col,)]
        return 0.0 if bias_hh is None else bias_hh[col]

    h_prev = None if h is None else (lambda idx, j: h[idx + (j,)])
    return gru_update((x.shape[0], hidden), xpre, hpre, h_prev, name)


def _pair(op, hx):
    """``hx`` as ``(h, c)``: ``None`` gives ``(None, None)``."""
    if hx is None:
        return None, None
    if not isinstance(hx, (tuple, list)) or len(hx) != 2:
        raise TexprError(f"{op}: hx must be a pair (h, c) of (batch, hidden) tensors or None, "
                         f"got {type(hx).__name__}: {hx!r}")
    return hx[0], hx[1]
