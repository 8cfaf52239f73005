"""Two image programs whose builds once took minutes (issue 51, "Build time blows
up on two small programs"), written as a user writes them, stage by stage:

* :func:`grid_sample` -- PyTorch's ``grid_sample`` (bilinear, ``align_corners=False``)
  of one channel with ``"zeros"`` or ``"reflection"`` padding. Reflection is
  ``|c + 0.5|``, a float ``%``, the parity of ``floor(c / size)`` and a clamp
  (PyTorch's ``reflect_coordinates`` and ``clip_coordinates``), feeding four
  bilinear corners.
* :func:`bilateral_grid` -- a bilateral grid: a scatter of the image into a
  (y, x, intensity) grid at a float-computed, data-dependent bin, three 5-tap blurs
  (one per grid axis), then a trilinear slice at each pixel.

Each returns ``(inputs, loss)`` with ``loss = sum(out * H)``, ``H`` the last input.
"""

import texpr as te
from texpr.expr import maximum, minimum


def _unnormalize(g, size):
    # align_corners=False: -1 and 1 are the outer edges of the corner pixels
    return ((g + 1.0) * size - 1.0) * 0.5


def _reflect(c, size):
    # PyTorch reflect_coordinates(c, -1, 2 * size - 1) then clip_coordinates
    a = te.abs(c + 0.5)
    extra = a % float(size)
    flips = te.floor(a / float(size))
    r = te.select(flips % 2.0 == 0.0, extra - 0.5, float(size) - extra - 0.5)
    return minimum(maximum(r, 0.0), float(size - 1))


def grid_sample(h=6, w=7, gh=5, gw=4, channels=3, padding="reflection", staged=False,
                dtype="float64"):
    """``out[0, c, i, j]``: channel ``c`` of ``X`` sampled bilinearly at the grid point
    ``G[0, i, j] = (x, y)`` in [-1, 1] (PyTorch's ``grid_sample``, NCHW, one image).

    With ``staged``, the two sample coordinates are stages of their own; without,
    the sampling stage computes them where it uses them.

    Returns:
        ``([X, G, H], loss)``: X ``(1, channels, h, w)``, G ``(1, gh, gw, 2)``, H
        ``(1, channels, gh, gw)``.
    """
    X = te.placeholder((1, channels, h, w), "X", dtype)
    G = te.placeholder((1, gh, gw, 2), "G", dtype)
    H = te.placeholder((1, channels, gh, gw), "H", dtype)
    pad = _reflect if padding == "reflection" else (lambda c, size: c)

    def coord(n, i, j, axis):
        size = (w, h)[axis]
        return pad(_unnormalize(G[n, i, j, axis], size), size)

    if staged:
        cxs = te.compute((1, gh, gw), lambda n, i, j: coord(n, i, j, 0), name="cx")
        cys = te.compute((1, gh, gw), lambda n, i, j: coord(n, i, j, 1), name="cy")
        cx, cy = (lambda n, i, j: cxs[n, i, j]), (lambda n, i, j: cys[n, i, j])
    else:
        cx, cy = (lambda n, i, j: coord(n, i, j, 0)), (lambda n, i, j: coord(n, i, j, 1))

    def body(n, c, i, j):
        fx, fy = cx(n, i, j), cy(n, i, j)
        x0, y0 = te.cast(te.floor(fx), "int64"), te.cast(te.floor(fy), "int64")
        tx, ty = fx - te.floor(fx), fy - te.floor(fy)
        total = 0.0
        for dy in (0, 1):
            for dx in (0, 1):
                y, x = y0 + dy, x0 + dx
                weight = (tx if dx else 1.0 - tx) * (ty if dy else 1.0 - ty)
                inside = te.all(y >= 0, y < h, x >= 0, x < w)
                total = total + te.select(inside, X[n, c, y, x] * weight, 0.0)
        return total

    out = te.compute((1, channels, gh, gw), body, name="out")
    c, a, b = (te.reduce_axis(channels, "c"), te.reduce_axis(gh, "a"),
               te.reduce_axis(gw, "b"))
    loss = te.compute((), lambda: te.sum(out[0, c, a, b] * H[0, c, a, b], axis=[c, a, b]),
                      name="loss")
    return [X, G, H], loss


_TAPS = (1.0 / 16, 4.0 / 16, 6.0 / 16, 4.0 / 16, 1.0 / 16)


def _blur(T, axis, name):
    # a 5-tap binomial blur along one grid axis, zero outside the grid
    shape = T.shape
    t = te.reduce_axis(5, "t" + name[-1])

    def body(*p):
        q = list(p)
        q[axis] = p[axis] + t - 2
        inside = te.all(q[axis] >= 0, q[axis] < shape[axis])
        taps = te.select(t == 0, _TAPS[0], te.select(t == 1, _TAPS[1], te.select(
            t == 2, _TAPS[2], te.select(t == 3, _TAPS[3], _TAPS[4]))))
        return te.sum(te.select(inside, T[tuple(q)] * taps, 0.0), axis=t)

    return te.compute(shape, body, name=name)


def bilateral_grid(h=8, w=8, s=2, bins=4, splat="scatter", float_coords=False,
                   dtype="float64"):
    """A bilateral filter of an image I in [0, 1] through a grid of cells s x s x
    1 / (bins - 1): each pixel is scattered (value and weight 1) into the cell at
    ``(y // s, x // s, int(floor(I * (bins - 1) + 0.5)))``, the value and weight
    grids are blurred by 5 taps along each axis, and each pixel reads them back
    trilinearly at ``(y / s, x / s, I * (bins - 1))``; the output is value / weight.
    ``splat="scatter"`` writes the splat as a scatter-add stage, ``"reduce"`` as a sum
    over the pixels whose cell is the grid point (a data-dependent ``where=``). With
    ``float_coords`` the slice computes its grid cell and weights in y and x through
    floating point too (``floor(y * (1 / s))``), as it does in z.

    Returns:
        ``([I, H], loss)``: I ``(h, w)``, H ``(h, w)``.
    """
    I = te.placeholder((h, w), "I", dtype)
    H = te.placeholder((h, w), "H", dtype)
    gy, gx = (h + s - 1) // s + 1, (w + s - 1) // s + 1

    def cell(y, x):
        return (y // s, x // s, te.cast(te.floor(I[y, x] * float(bins - 1) + 0.5), "int64"))

    if splat == "scatter":
        val = te.scatter_add((gy, gx, bins), dtype, (h, w), cell, lambda y, x: I[y, x],
                             name="grid_v")
        wgt = te.scatter_add((gy, gx, bins), dtype, (h, w), cell,
                             lambda y, x: te.const(1.0, dtype), name="grid_w")
    else:
        def splat_sum(value, name):
            py, px = te.reduce_axis(h, "py"), te.reduce_axis(w, "px")

            def body(a, b, c):
                ca, cb, cc = cell(py, px)
                return te.sum(value(py, px), axis=[py, px],
                              where=te.all(ca == a, cb == b, cc == c))
            return te.compute((gy, gx, bins), body, name=name)
        val = splat_sum(lambda y, x: I[y, x], "grid_v")
        wgt = splat_sum(lambda y, x: te.const(1.0, dtype), "grid_w")
    for axis, tag in ((0, "y"), (1, "x"), (2, "z")):
        val = _blur(val, axis, "blur_v" + tag)
        wgt = _blur(wgt, axis, "blur_w" + tag)
    cz = te.compute((h, w), lambda y, x: I[y, x] * float(bins - 1), name="cz")
    z0 = te.compute((h, w), lambda y, x: te.cast(te.floor(cz[y, x]), "int64"), name="z0")

    def slice_(T, y, x):
        if float_coords:
            cy, cx = te.cast(y, dtype) * (1.0 / s), te.cast(x, dtype) * (1.0 / s)
            y0, x0 = te.cast(te.floor(cy), "int64"), te.cast(te.floor(cx), "int64")
            fy, fx = cy - te.floor(cy), cx - te.floor(cx)
        else:
            y0, x0 = y // s, x // s
            fy, fx = (y % s) * (1.0 / s), (x % s) * (1.0 / s)
        fz = cz[y, x] - te.floor(cz[y, x])
        total = 0.0
        for dy in (0, 1):
            for dx in (0, 1):
                for dz in (0, 1):
                    z = z0[y, x] + dz
                    wt = ((fy if dy else 1.0 - fy) * (fx if dx else 1.0 - fx)
                          * (fz if dz else 1.0 - fz))
                    total = total + te.select(te.all(z >= 0, z < bins),
                                              T[y0 + dy, x0 + dx, z] * wt, 0.0)
        return total

    out = te.compute((h, w), lambda y, x: slice_(val, y, x) / (slice_(wgt, y, x) + 1e-3),
                     name="out")
    a, b = te.reduce_axis(h, "a"), te.reduce_axis(w, "b")
    loss = te.compute((), lambda: te.sum(out[a, b] * H[a, b], axis=[a, b]), name="loss")
    return [I, H], loss


def stacked_lstm(layers=6, steps=1024, batch=4, hidden=16, dtype="float32"):
    """A stack of ``layers`` LSTM cells in one ``te.scan`` (issue 50's build-scale case):
    ``2 * layers`` coupled states (``h`` and ``c`` of each layer), each layer reading
    the ``h`` of the layer below at the same step; inputs ``X`` (steps, batch,
    hidden), ``W_ih`` and ``W_hh`` (4 hidden x hidden) per layer, and the head ``H``
    (``loss = sum(h_top * H)``): 2 + 2 x layers inputs."""
    T, B, n = steps, batch, hidden
    X = te.placeholder((T, B, n), name="X", dtype=dtype)
    H = te.placeholder((T, B, n), name="H", dtype=dtype)
    weights, inits, updates, states = [], [], [], []
    below = X
    for layer in range(layers):
        w_ih = te.placeholder((4 * n, n), name=f"W_ih{layer}", dtype=dtype)
        w_hh = te.placeholder((4 * n, n), name=f"W_hh{layer}", dtype=dtype)
        h_s = te.placeholder((T, B, n), name=f"h_state{layer}", dtype=dtype)
        c_s = te.placeholder((T, B, n), name=f"c_state{layer}", dtype=dtype)
        k, kk = te.reduce_axis(n, f"k{layer}"), te.reduce_axis(n, f"kk{layer}")
        pre = te.compute(
            (T, B, 4 * n),
            lambda t, b, g, x=below, w_ih=w_ih, w_hh=w_hh, h_s=h_s, k=k, kk=kk:
            te.sum(w_ih[g, k] * x[t, b, k], axis=k) + te.sum(w_hh[g, kk] * h_s[t - 1, b, kk],
                                                              axis=kk),
            name=f"pre{layer}")
        c = te.compute((T, B, n), lambda t, b, j, pre=pre, c_s=c_s:
                       te.sigmoid(pre[t, b, n + j]) * c_s[t - 1, b, j]
                       + te.sigmoid(pre[t, b, j]) * te.tanh(pre[t, b, 2 * n + j]),
                       name=f"c{layer}")
        h = te.compute((T, B, n), lambda t, b, j, pre=pre, c=c:
                       te.sigmoid(pre[t, b, 3 * n + j]) * te.tanh(c[t, b, j]), name=f"h{layer}")
        for nm in ("h", "c"):
            inits.append(te.compute((1, B, n), lambda _, b, j: te.const(0.0, dtype),
                                    name=f"{nm}0_{layer}"))
        updates += [h, c]
        states += [h_s, c_s]
        weights += [w_ih, w_hh]
        below = h
    outs = te.scan(inits, updates, states, name="stack")
    top = outs[2 * (layers - 1)]
    r, b, q = te.reduce_axis(T, "r"), te.reduce_axis(B, "b"), te.reduce_axis(n, "q")
    loss = te.compute((), lambda: te.sum(top[r, b, q] * H[r, b, q], axis=[r, b, q]),
                      name="loss")
    return [X] + weights + [H], loss
