"""Train a small CNN (or an LSTM) on real handwritten digits with texpr gradients.

Data: the 1,797 8x8 handwritten digits that scikit-learn bundles (UCI "Optical
Recognition of Handwritten Digits", E. Alpaydin and C. Kaynak, 1998), shipped
inside this package as ``data/digits.csv.gz``: no download. Stratified 80/20
train/test split with a fixed seed; pixels scaled to [0, 1].

Models (written with ``te.nn``), chosen with ``--model``:

``cnn`` (the default, NCHW)::

    conv2d 1->8 (3x3, pad 1) -> relu -> max_pool2d 2
    -> conv2d 8->16 (3x3, pad 1) -> relu -> flatten -> dense 10
    -> softmax cross-entropy

``lstm``: each image is a sequence of its 8 rows (8 steps of 8 pixels)::

    lstm 8->64 (te.nn.lstm over te.scan) -> last hidden state -> dense 10
    -> softmax cross-entropy

The gradients come from ``te.differentiate(loss, weights)``; forward and
backward are compiled once with ``codegen.build`` and reused for every
mini-batch (parallel kernels by default: their convolutions and dense layers
run as GEMMs on numpy's BLAS and compile nothing, so the first build is the
shorter -- 3.6 s against 5.9 s for ``--serial`` on 2 quiet cores, 2026-12-01 --
while a training step beside PyTorch took 3.0 ms against 1.7 ms for
``--serial`` on 2026-12-05: README.md's last section). A partial last batch is padded and
masked out of the loss (a per-sample weight), so every sample is used and no
second kernel is built.

Run ``python -m texpr.examples.digits --help`` for the flags.
"""

import argparse
import gzip
import sys
import time
from importlib import resources

import numpy as np

import texpr as te
from texpr.envvars import env_number

IMAGE = 8
CLASSES = 10
HIDDEN = 64


def load_digits():
    """The bundled digits: images (1797, 8, 8) float64 in [0, 1], labels (1797,) int64."""
    with resources.files("texpr.examples").joinpath("data/digits.csv.gz").open("rb") as f:
        raw = np.loadtxt(gzip.open(f), delimiter=",")
    images = raw[:, :-1].reshape(-1, IMAGE, IMAGE) / 16.0
    labels = raw[:, -1].astype(np.int64)
    return images, labels


def _approximate_mode(counts, draws, rng):
    """Per-class draws summing to ``draws``, proportional to ``counts``: the floors,
    then one more for the classes with the largest remainders (ties drawn at
    random)."""
    continuous = counts / counts.sum() * draws
    floored = np.floor(continuous)
    need = int(draws - floored.sum())
    if need > 0:
        remainder = continuous - floored
        for value in np.sort(np.unique(remainder))[::-1]:
            (inds,) = np.where(remainder == value)
            add = min(len(inds), need)
            floored[rng.choice(inds, size=add, replace=False)] += 1
            need -= add
            if need == 0:
                break
    return floored.astype(np.int64)


def split(images, labels, seed, test_fraction=0.2):
    """Stratified train/test split: ``(x_train, x_test, y_train, y_test)``.

    scikit-learn's ``train_test_split(..., stratify=labels, random_state=seed)``
    (its ``StratifiedShuffleSplit``) written out, the same images in the same
    order: ``ceil(test_fraction * n)`` test images shared out over the classes in
    proportion to their sizes, each class's images permuted, both parts
    shuffled, all drawn from ``np.random.RandomState(seed)``. Importing
    scikit-learn took 2-7 s of a warm run's 4 s on the 2-core machine.

    Raises ValueError (as scikit-learn does) for a ``test_fraction`` outside (0, 1),
    labels not 1-D or not one per image, a class of one image, or a part too
    small to hold every class.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or len(labels) != len(images):
        raise ValueError(f"split: labels must be 1-D with one label per image, got shape "
                         f"{labels.shape} for {len(images)} images")
    if isinstance(test_fraction, (bool, np.bool_)) or not isinstance(
            test_fraction, (float, np.floating)) or not 0.0 < test_fraction < 1.0:
        raise ValueError(f"split: test_fraction must be a float in (0, 1), got {test_fraction!r}")
    n = len(labels)
    n_test = int(np.ceil(test_fraction * n))
    n_train = n - n_test
    classes, y = np.unique(labels, return_inverse=True)
    counts = np.bincount(y)
    if counts.min() < 2:
        raise ValueError(f"split: every class needs at least 2 images for a stratified "
                         f"split; class {classes[counts.argmin()]!r} has 1")
    if min(n_test, n_train) < len(classes):
        raise ValueError(f"split: the test part ({n_test}) and the train part ({n_train}) "
                         f"must each hold at least one image of each of the "
                         f"{len(classes)} classes")
    by_class = np.split(np.argsort(y, kind="mergesort"), np.cumsum(counts)[:-1])
    rng = np.random.RandomState(seed)
    n_i = _approximate_mode(counts, n_train, rng)
    t_i = _approximate_mode(counts - n_i, n_test, rng)
    train, test = [], []
    for i in range(len(classes)):
        perm = by_class[i].take(rng.permutation(counts[i]), mode="clip")
        train.extend(perm[:n_i[i]])
        test.extend(perm[n_i[i]:n_i[i] + t_i[i]])
    train, test = rng.permutation(train), rng.permutation(test)
    return images[train], images[test], labels[train], labels[test]


def masked_mean_loss(logits, labels, mask, batch):
    """The scalar stage ``loss = -sum_n mask[n] log softmax(logits)[n, labels[n]] /
    max(sum(mask), 1)``: the mean cross-entropy over the real samples of a batch."""
    logp = te.nn.log_softmax(logits, axis=1, name="logp")
    n = te.reduce_axis(batch, "n")
    m = te.reduce_axis(batch, "m")
    count = te.compute((), lambda: te.max(te.sum(mask[m], axis=m), 1.0), name="count")
    return te.compute(
        (), lambda: -te.sum(mask[n] * logp[n, labels[n]], axis=n) / count[()], name="loss")


class Model:
    """The CNN as a texpr graph for a fixed batch size.

    Tensors: ``x`` (B, 1, 8, 8), ``labels`` (B,) int64, ``mask`` (B,) (1 for a
    real sample, 0 for padding), the weights in :attr:`weights` (name ->
    placeholder), ``logits`` (B, 10) and the scalar ``loss`` (masked mean of
    the per-sample cross-entropy).
    """

    def __init__(self, batch, dtype="float32"):
        nn = te.nn
        self.batch, self.dtype = batch, dtype
        P = lambda shape, name: te.placeholder(shape, name=name, dtype=dtype)  # noqa: E731
        self.x = P((batch, 1, IMAGE, IMAGE), "x")
        self.labels = te.placeholder((batch,), name="labels", dtype="int64")
        self.mask = P((batch,), "mask")
        self.weights = {
            "conv1.w": P((8, 1, 3, 3), "conv1_w"), "conv1.b": P((8,), "conv1_b"),
            "conv2.w": P((16, 8, 3, 3), "conv2_w"), "conv2.b": P((16,), "conv2_b"),
            "dense.w": P((CLASSES, 16 * 4 * 4), "dense_w"), "dense.b": P((CLASSES,), "dense_b"),
        }
        w = self.weights
        h = nn.relu(nn.conv2d(self.x, w["conv1.w"], w["conv1.b"], padding=1, name="conv1"))
        h = nn.max_pool2d(h, 2, name="pool")
        h = nn.relu(nn.conv2d(h, w["conv2.w"], w["conv2.b"], padding=1, name="conv2"))
        h = nn.flatten(h, name="flatten")
        self.logits = nn.dense(h, w["dense.w"], w["dense.b"], name="logits")
        self.loss = masked_mean_loss(self.logits, self.labels, self.mask, batch)

    @staticmethod
    def inputs(images):
        """Images (N, 8, 8) as this model's input layout (N, 1, 8, 8)."""
        return images[:, None]

    def init_weights(self, rng):
        """Kaiming-uniform weights and zero biases (as torch's default layers)."""
        out = {}
        for name, t in self.weights.items():
            if name.endswith(".b"):
                out[name] = np.zeros(t.shape, dtype=self.dtype)
            else:
                fan_in = int(np.prod(t.shape[1:]))
                bound = np.sqrt(6.0 / fan_in)
                out[name] = rng.uniform(-bound, bound, size=t.shape).astype(self.dtype)
        return out


class LSTMModel:
    """The LSTM as a texpr graph for a fixed batch size: each image is read as a
    sequence of its 8 rows (``te.nn.lstm`` with ``batch_first``, hidden size
    :data:`HIDDEN`), the last hidden state goes through a dense layer to the 10
    classes.

    Tensors: ``x`` (B, 8, 8) (sample, row = time step, pixel; ``steps`` and ``inputs``
    change the 8s, for benchmarks), ``labels``, ``mask``,
    ``logits`` and ``loss`` as :class:`Model`; :attr:`weights` in torch.nn.LSTM's
    layout (``lstm.w_ih`` (4H, 8), ``lstm.w_hh`` (4H, H), biases (4H,), gates
    ``i, f, g, o``), so they copy to and from ``torch.nn.LSTM(8, H)``.
    """

    def __init__(self, batch, dtype="float32", hidden=HIDDEN, inputs=IMAGE, steps=IMAGE):
        nn = te.nn
        self.batch, self.dtype, self.hidden = batch, dtype, hidden
        P = lambda shape, name: te.placeholder(shape, name=name, dtype=dtype)  # noqa: E731
        self.x = P((batch, steps, inputs), "x")
        self.labels = te.placeholder((batch,), name="labels", dtype="int64")
        self.mask = P((batch,), "mask")
        g = 4 * hidden
        self.weights = {
            "lstm.w_ih": P((g, inputs), "lstm_w_ih"), "lstm.w_hh": P((g, hidden), "lstm_w_hh"),
            "lstm.b_ih": P((g,), "lstm_b_ih"), "lstm.b_hh": P((g,), "lstm_b_hh"),
            "dense.w": P((CLASSES, hidden), "dense_w"), "dense.b": P((CLASSES,), "dense_b"),
        }
        w = self.weights
        _, (h_n, _) = nn.lstm(self.x, w["lstm.w_ih"], w["lstm.w_hh"], w["lstm.b_ih"],
                              w["lstm.b_hh"], batch_first=True, name="lstm")
        last = nn.reshape(h_n, (batch, hidden), name="last")
        self.logits = nn.dense(last, w["dense.w"], w["dense.b"], name="logits")
        self.loss = masked_mean_loss(self.logits, self.labels, self.mask, batch)

    @staticmethod
    def inputs(images):
        """Images (N, 8, 8) are already (sample, time step, feature)."""
        return images

    def init_weights(self, rng):
        """torch's defaults: every parameter uniform in ``(-1/sqrt(H), 1/sqrt(H))``
        (torch.nn.LSTM's rule; for the dense layer H is also its fan-in, torch.nn.Linear's
        rule)."""
        bound = 1.0 / np.sqrt(self.hidden)
        return {name: rng.uniform(-bound, bound, size=t.shape).astype(self.dtype)
                for name, t in self.weights.items()}


#: the models of ``--model``: class, default learning rate
MODELS = {"cnn": (Model, 0.1), "lstm": (LSTMModel, 0.3)}


def iteration_table(model, grads_raw, grads):
    """Rows (weight, raw iteration count, simplified iteration count)."""
    from texpr import simplify

    rows = []
    for (name, _), g_raw, g in zip(model.weights.items(), grads_raw, grads):
        rows.append((name, simplify.iteration_count([g_raw]), simplify.iteration_count([g])))
    return rows


def _batches(n, batch, rng):
    order = rng.permutation(n)
    for start in range(0, n, batch):
        yield order[start:start + batch]


def _pad(idx, batch):
    """Indices padded to a full batch (repeating the first) and the sample mask."""
    k = len(idx)
    mask = np.zeros(batch)
    mask[:k] = 1.0
    if k < batch:
        idx = np.concatenate([idx, np.full(batch - k, idx[0])])
    return idx, mask


def parse_args(argv=None):
    """Parse the command line (``argv``, default ``sys.argv[1:]``); exits with a usage
    message for bad values (argparse's ``error``)."""
    p = argparse.ArgumentParser(prog="texpr-digits", description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(MODELS), default="cnn",
                   help="cnn (default) or lstm (the rows of each image as a sequence)")
    p.add_argument("--epochs", type=int, default=20, help="training epochs (default 20)")
    p.add_argument("--batch-size", type=int, default=64, help="mini-batch size (default 64)")
    p.add_argument("--lr", type=float, default=None,
                   help="initial SGD learning rate, cosine-decayed over the epochs (default 0.1 "
                        "for the cnn, 0.3 for the lstm)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    p.add_argument("--seed", type=int, default=0, help="split, init and shuffling seed")
    p.add_argument("--plot", metavar="PATH", help="save a PNG of train loss and test accuracy")
    p.add_argument("--float64", action="store_true", help="train in float64")
    p.set_defaults(parallel=True)
    p.add_argument("--serial", dest="parallel", action="store_false",
                   help="compile serial kernels only (every stage a loop nest, no GEMMs): a "
                        "longer first build, a shorter step on this model's small layers "
                        "(README.md, Benchmarks); the default builds parallel ones")
    p.add_argument("--parallel", dest="parallel", action="store_true",
                   help="parallel kernels (the default; kept for older command lines)")
    p.add_argument("--limit", type=int, default=env_number("TEXPR_DIGITS_LIMIT", 0, integer=True),
                   help="use only the first N images (quick runs; env TEXPR_DIGITS_LIMIT)")
    args = p.parse_args(argv)
    if args.epochs < 0:
        p.error(f"--epochs must be >= 0, got {args.epochs}")
    if args.batch_size < 1:
        p.error(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.lr is None:
        args.lr = MODELS[args.model][1]
    if args.lr <= 0:
        p.error(f"--lr must be > 0, got {args.lr}")
    if args.limit and args.limit < 100:
        p.error(f"--limit must be 0 (all images) or at least 100 (a stratified split needs "
                f"every class in both parts), got {args.limit}")
    return args


def train(args, out=sys.stdout):
    """Train with ``args`` (see :func:`parse_args`); returns a dict of the history."""
    from texpr import codegen
    from tqdm import tqdm

    t_start = time.perf_counter()
    dtype = "float64" if args.float64 else "float32"
    images, labels = load_digits()
    if args.limit:
        images, labels = images[:args.limit], labels[:args.limit]
    x_tr, x_te, y_tr, y_te = split(images, labels, args.seed)
    model_class = MODELS[getattr(args, "model", "cnn")][0]
    x_tr = model_class.inputs(x_tr).astype(dtype)
    x_te = model_class.inputs(x_te).astype(dtype)
    rng = np.random.default_rng(args.seed)

    B = args.batch_size
    print("building the model and its gradients, compiling the kernels with Numba "
          "(cached on disk: only the first run with these settings compiles) ...",
          file=out, flush=True)
    model = model_class(B, dtype)
    names = list(model.weights)
    wts = [model.weights[n] for n in names]
    grads = te.differentiate(model.loss, wts).result
    inputs = [model.x, model.labels, model.mask] + wts
    # --serial: every stage a loop nest, sequential (blas=False as well: parallel=False
    # alone keeps the GEMMs on the BLAS)
    mode = dict(parallel=args.parallel, blas=args.parallel)
    step = codegen.build([model.loss] + list(grads), inputs, **mode)
    predict = codegen.build([model.logits], [model.x] + wts, **mode)
    params = model.init_weights(rng)
    velocity = {n: np.zeros_like(v) for n, v in params.items()}
    t_built = time.perf_counter()

    def evaluate_accuracy(xs, ys):
        correct = 0
        for start in range(0, len(xs), B):
            idx, mask = _pad(np.arange(start, min(start + B, len(xs))), B)
            (logits,) = predict(xs[idx], *[params[n] for n in names])
            k = int(mask.sum())
            correct += int((logits[:k].argmax(1) == ys[idx[:k]]).sum())
        return correct / len(xs)

    history = {"loss": [], "test_accuracy": []}
    for epoch in range(args.epochs):
        # cosine learning-rate decay: large steps first, a settled model at the end
        lr = 0.5 * args.lr * (1 + np.cos(np.pi * epoch / max(args.epochs, 1)))
        total, seen = 0.0, 0
        batches = list(_batches(len(x_tr), B, rng))
        bar = tqdm(total=len(batches), desc=f"epoch {epoch + 1}/{args.epochs}", file=out,
                   leave=True, disable=None)
        for idx in batches:
            idx, mask = _pad(idx, B)
            loss, *g = step(x_tr[idx], y_tr[idx], mask.astype(dtype),
                            *[params[n] for n in names])
            for n, gn in zip(names, g):
                velocity[n] = args.momentum * velocity[n] + gn
                params[n] = (params[n] - lr * velocity[n]).astype(dtype)
            k = int(mask.sum())
            total += float(loss) * k
            seen += k
            bar.set_postfix(loss=f"{total / seen:.4f}", refresh=False)
            bar.update(1)
        acc = evaluate_accuracy(x_te, y_te)
        bar.set_postfix(loss=f"{total / seen:.4f}", test_acc=f"{100 * acc:.1f}%")
        bar.close()
        history["loss"].append(total / seen)
        history["test_accuracy"].append(acc)
    t_end = time.perf_counter()
    acc = history["test_accuracy"][-1] if history["test_accuracy"] else evaluate_accuracy(x_te, y_te)
    print(f"test accuracy: {100 * acc:.1f}%", file=out)
    print(f"time: {t_end - t_start:.1f} s (build and compile {t_built - t_start:.1f} s, "
          f"training {t_end - t_built:.1f} s)", file=out)

    raw = te.differentiate(model.loss, wts, simplify=False).result
    print(f"\n{'gradient':<12} {'iterations (raw)':>18} {'iterations (simplified)':>25}", file=out)
    for name, before, after in iteration_table(model, raw, grads):
        print(f"{'d' + name:<12} {before:>18,} {after:>25,}", file=out)

    if args.plot:
        plot(history, args.plot)
        print(f"plot written to {args.plot}", file=out)
    history["final_accuracy"] = acc
    history["params"] = params
    return history


def plot(history, path):
    """Save train loss and test accuracy per epoch as a PNG (matplotlib, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = np.arange(1, len(history["loss"]) + 1)
    fig, ax1 = plt.subplots(figsize=(6, 4))
    ax1.plot(epochs, history["loss"], "o-", color="tab:blue", label="train loss")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("train loss", color="tab:blue")
    ax2 = ax1.twinx()
    ax2.plot(epochs, 100 * np.array(history["test_accuracy"]), "s-", color="tab:red",
             label="test accuracy")
    ax2.set_ylabel("test accuracy (%)", color="tab:red")
    ax1.set_title("texpr CNN on 8x8 digits")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    """Console entry point (``texpr-digits``)."""
    args = parse_args(argv)
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
