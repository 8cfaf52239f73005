"""te.nn shape and data-movement operators."""

import numpy as np
import pytest

import texpr as te
from nn_testutil import F, check_forward, check_grads, ph, rand, tt

nn = te.nn


@pytest.mark.parametrize("src,dst", [
    ((2, 3, 4), (6, 4)), ((2, 3, 4), (2, 12)), ((2, 3, 4), (24,)), ((24,), (2, 3, 4)),
    ((2, 3, 4), (4, 3, 2)), ((2, 1, 6), (3, 1, 4)), ((6, 4), (2, -1, 2)), ((1, 4), (4, 1)),
    ((2, 6), (3, 4)), ((), (1, 1)), ((4, 3, 5), (4, 15))])
def test_reshape(src, dst):
    x = ph(src, "X")
    y = nn.reshape(x, dst)
    feed = {x: rand(x)}
    check_forward(y, feed, feed[x].reshape(dst))
    check_grads(y, [x], feed)


def test_reshape_keeps_unchanged_axes_plain():
    x = ph((2, 3, 4, 5), "X")
    text = te.tensor_str(nn.reshape(x, (2, 12, 5)))
    assert "X[ax0, ax1 // 4, ax1 % 4, ax2]" in text


@pytest.mark.parametrize("start,end", [(1, -1), (0, -1), (1, 2), (2, 3), (0, 0)])
def test_flatten(start, end):
    x = ph((2, 3, 2, 2), "X")
    y = nn.flatten(x, start, end)
    feed = {x: rand(x)}
    check_forward(y, feed, tt(feed[x]).flatten(start, end).numpy())
    check_grads(y, [x], feed)


def test_flatten_suite_form():
    x = ph((2, 3, 4, 5), "X")
    assert "X[ax0, ax1 // 20, ax1 // 5 % 4, ax1 % 5]" in te.tensor_str(nn.flatten(x))


@pytest.mark.parametrize("axes", [None, (1, 0, 2), (2, 0, 1), (0, -1, 1)])
def test_transpose(axes):
    x = ph((2, 3, 4), "X")
    y = nn.transpose(x, axes)
    feed = {x: rand(x)}
    check_forward(y, feed, np.transpose(feed[x], axes))
    check_grads(y, [x], feed)


@pytest.mark.parametrize("axis", [None, 0, (0, 3), -2])
def test_squeeze(axis):
    x = ph((1, 3, 1, 1), "X")
    y = nn.squeeze(x, axis)
    feed = {x: rand(x)}
    check_forward(y, feed, np.squeeze(feed[x], axis))
    check_grads(y, [x], feed)


@pytest.mark.parametrize("axis", [0, -1, 1, (0, 3)])
def test_expand_dims(axis):
    x = ph((2, 3), "X")
    y = nn.expand_dims(x, axis)
    feed = {x: rand(x)}
    check_forward(y, feed, np.expand_dims(feed[x], axis))
    check_grads(y, [x], feed)


@pytest.mark.parametrize("src,dst", [((3,), (2, 3)), ((2, 1), (2, 4)), ((1, 3, 1), (2, 2, 3, 2)),
                                     ((2, 3), (2, 3))])
def test_broadcast_to(src, dst):
    x = ph(src, "X")
    y = nn.broadcast_to(x, dst)
    feed = {x: rand(x)}
    check_forward(y, feed, np.broadcast_to(feed[x], dst))
    check_grads(y, [x], feed)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concatenate(axis):
    shapes = [(2, 3, 2), (2, 3, 2), (2, 3, 2)]
    shapes = [tuple(n + k if d == axis % 3 else n for d, n in enumerate(s))
              for k, s in enumerate(shapes)]
    ts = [ph(s, f"T{k}") for k, s in enumerate(shapes)]
    y = nn.concatenate(ts, axis)
    feed = {t: rand(t, k) for k, t in enumerate(ts)}
    check_forward(y, feed, np.concatenate([feed[t] for t in ts], axis))
    check_grads(y, ts, feed)


def test_concatenate_promotes_and_skips_empty():
    a, b, e = ph((2,), "A", "float32"), ph((3,), "B"), ph((0,), "E")
    y = nn.concatenate([a, e, b])
    assert y.dtype == "float64" and y.shape == (5,)
    va, vb = np.array([1, 2], "float32"), np.array([3.0, 4, 5])
    check_forward(y, {a: va, b: vb, e: np.zeros(0)}, [1, 2, 3, 4, 5])


@pytest.mark.parametrize("ios,axis", [(3, 0), ([1, 4], 0), (2, 1), ([0, 2, 2], 1), ([5], 0)])
def test_split(ios, axis):
    x = ph((6, 4), "X")
    ys = nn.split(x, ios, axis)
    feed = {x: rand(x)}
    refs = np.split(feed[x], ios, axis)
    assert len(ys) == len(refs)
    for y, r in zip(ys, refs):
        check_forward(y, feed, r)
    nonempty = [y for y in ys if y.size]
    check_grads(nn.concatenate(nonempty[::-1], axis), [x], feed)


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
@pytest.mark.parametrize("pw", [1, (2, 1), ((0, 0), (1, 2)), ((2, 0), (0, 3))])
def test_pad(mode, pw):
    x = ph((3, 4), "X")
    kw = {"value": 0.5} if mode == "constant" else {}
    y = nn.pad(x, pw, mode, **kw)
    feed = {x: rand(x)}
    np_kw = {"constant_values": 0.5} if mode == "constant" else {}
    check_forward(y, feed, np.pad(feed[x], pw, mode, **np_kw))
    check_grads(y, [x], feed)


def test_pad_matches_torch():
    x = ph((1, 2, 3, 4), "X")
    feed = {x: rand(x)}
    pw = ((0, 0), (0, 0), (1, 2), (2, 1))
    tpad = (2, 1, 1, 2)  # torch: last axis first
    for mode, tmode in [("constant", "constant"), ("edge", "replicate"), ("reflect", "reflect")]:
        check_forward(nn.pad(x, pw, mode), feed, F.pad(tt(feed[x]), tpad, tmode).numpy())


@pytest.mark.parametrize("axis,ishape", [(0, (4,)), (1, (2, 3)), (-1, (5,)), (None, (2, 2))])
def test_take(axis, ishape):
    x = ph((3, 4, 5), "X")
    idx = ph(ishape, "I", "int64")
    n = x.size if axis is None else x.shape[axis]
    iv = np.random.default_rng(2).integers(0, n, ishape)
    feed = {x: rand(x), idx: iv}
    y = nn.take(x, idx, axis)
    check_forward(y, feed, np.take(feed[x], iv, axis))
    check_grads(y, [x], feed)


def test_take_duplicate_indices_accumulate():
    x = ph((3,), "X")
    idx = ph((4,), "I", "int32")
    feed = {x: rand(x), idx: np.array([1, 1, 0, 1], "int32")}
    y = nn.take(x, idx)
    check_forward(y, feed, feed[x][[1, 1, 0, 1]])
    check_grads(y, [x], feed)


def test_embedding():
    w = ph((5, 3), "W")
    idx = ph((2, 3), "I", "int64")
    iv = np.array([[0, 4, 4], [2, 1, 0]])
    feed = {w: rand(w), idx: iv}
    y = nn.embedding(idx, w)
    check_forward(y, feed, F.embedding(tt(iv), tt(feed[w])).numpy())
    check_grads(y, [w], feed)


@pytest.mark.parametrize("scale", [1, 2, (2, 3)])
def test_upsample_nearest(scale):
    x = ph((1, 2, 3, 2), "X")
    y = nn.upsample_nearest(x, scale)
    feed = {x: rand(x)}
    sf = scale if isinstance(scale, tuple) else (scale, scale)
    ref = F.interpolate(tt(feed[x]), scale_factor=sf, mode="nearest").numpy()
    check_forward(y, feed, ref)
    check_grads(y, [x], feed)


@pytest.mark.parametrize("r", [1, 2, 3])
def test_pixel_shuffle(r):
    x = ph((1, 2 * r * r, 2, 3), "X")
    y = nn.pixel_shuffle(x, r)
    feed = {x: rand(x)}
    check_forward(y, feed, F.pixel_shuffle(tt(feed[x]), r).numpy())
    check_grads(y, [x], feed)


def test_errors():
    x = ph((2, 3, 4), "X")
    with pytest.raises(te.ShapeError, match=r"cannot reshape X of shape \(2, 3, 4\) \(size 24\) "
                                            r"into \(5, 5\)"):
        nn.reshape(x, (5, 5))
    with pytest.raises(te.ShapeError, match="at most one -1"):
        nn.reshape(x, (-1, -1))
    with pytest.raises(te.ShapeError, match="start_axis 2 comes after end_axis 1"):
        nn.flatten(x, 2, 1)
    with pytest.raises(te.ShapeError, match="not a permutation"):
        nn.transpose(x, (0, 0, 1))
    with pytest.raises(te.ShapeError, match="axis 1 of X .* has extent 3, not 1"):
        nn.squeeze(x, 1)
    with pytest.raises(te.ShapeError, match=r"cannot broadcast X of shape \(2, 3, 4\) to"):
        nn.broadcast_to(x, (2, 3, 5))
    with pytest.raises(te.ShapeError, match="does not match X"):
        nn.concatenate([x, ph((2, 4, 4), "B")], axis=2)
    with pytest.raises(te.ShapeError, match="non-empty list"):
        nn.concatenate([])
    with pytest.raises(te.ShapeError, match="3 sections do not divide the extent 4"):
        nn.split(x, 3, axis=2)
    with pytest.raises(te.ShapeError, match="must increase"):
        nn.split(x, [2, 1], axis=2)
    with pytest.raises(te.ShapeError, match="reflect padding \\(4, 0\\) of axis 2 must be at most"):
        nn.pad(x, ((0, 0), (0, 0), (4, 0)), "reflect")
    with pytest.raises(te.TexprError, match="mode"):
        nn.pad(x, 1, "wrap")
    with pytest.raises(te.ShapeError, match="pad_width"):
        nn.pad(x, ((1, 1), (1, 1)))
    with pytest.raises(te.DTypeError, match="integer tensor"):
        nn.take(x, ph((2,), "F"), 0)
    with pytest.raises(te.ShapeError, match="channels 3 .* not divisible by upscale_factor"):
        nn.pixel_shuffle(ph((1, 3, 2, 2), "P"), 2)
    with pytest.raises(te.TexprError, match="scale_factor must be >= 1"):
        nn.upsample_nearest(ph((1, 3, 2, 2), "P"), 0)
    with pytest.raises(te.OutOfBoundsError):
        te.evaluate(nn.take(x, (i := ph((1,), "I", "int64")), 0), {x: rand(x), i: np.array([2])})
