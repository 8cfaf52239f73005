"""A PyTorch model on the digits in which one layer is a texpr op, and its
data-parallel run with torch.distributed.

The layer is a dilated depthwise convolution written as a texpr compute
(:func:`dilated_depthwise`: 3x3 taps, dilation 2, zero padding 2, one filter
per channel); :class:`TexprDepthwise` wraps it with ``texpr.torch.op`` (one op
per batch size, compiled on first use). The model::

    conv2d 1->8 (3x3, pad 1) -> relu -> depthwise 8 (3x3, dilation 2) -> relu
    -> max_pool2d 2 -> flatten -> linear 128->10 -> cross-entropy

``reference=True`` builds the same model with ``F.conv2d(groups=8, dilation=2)``
in place of the texpr layer, from the same initial weights: both train to the
same accuracy (the texpr layer computes the same values).

Scale-out goes through PyTorch's own engine: :func:`train_ddp` runs the model
under ``DistributedDataParallel`` (gloo backend, N processes on loopback), each
rank taking its slice of every global batch; DDP averages the gradients, so
the losses equal the single-process run on the same global batches.

    python -m texpr.examples.digits_torch [--epochs 10] [--reference] [--ddp 2]
"""

import argparse
import os
import socket
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

import texpr as te
import texpr.torch
from texpr.examples.digits import load_digits, split

CHANNELS, IMAGE, CLASSES = 8, 8, 10


def dilated_depthwise(batch, channels, size, dilation=2, taps=3, dtype="float32"):
    """The texpr graph of a dilated depthwise convolution with zero padding that
    keeps the size: ``Y[n, c, h, w] = sum_{i,j} X[n, c, h + d i - p, w + d j - p] K[c, i, j]``
    (``p = d (taps - 1) / 2``; loads outside the image read 0).

    Returns ``(Y, X, K)``: X (batch, channels, size, size), K (channels, taps,
    taps), Y like X; all of ``dtype``.
    """
    X = te.placeholder((batch, channels, size, size), name="X", dtype=dtype)
    K = te.placeholder((channels, taps, taps), name="K", dtype=dtype)
    pad = dilation * (taps - 1) // 2
    ri, rj = te.reduce_axis(taps, "ri"), te.reduce_axis(taps, "rj")

    def body(n, c, h, w):
        y, x = h + dilation * ri - pad, w + dilation * rj - pad
        inside = te.all(y >= 0, y < size, x >= 0, x < size)
        return te.sum(te.if_then_else(inside, X[n, c, y, x], 0.0) * K[c, ri, rj], axis=[ri, rj])

    Y = te.compute((batch, channels, size, size), body, name="depthwise")
    return Y, X, K


class TexprDepthwise(torch.nn.Module):
    """The texpr layer: weight ``(channels, 3, 3)``; one compiled op per batch size."""

    def __init__(self, channels, size, dtype="float32"):
        super().__init__()
        self.channels, self.size, self.dtype = channels, size, dtype
        tdt = torch.float64 if dtype == "float64" else torch.float32
        self.weight = torch.nn.Parameter(torch.empty(channels, 3, 3, dtype=tdt))
        self._ops = {}

    def forward(self, x):
        op = self._ops.get(x.shape[0])
        if op is None:
            Y, X, K = dilated_depthwise(x.shape[0], self.channels, self.size, dtype=self.dtype)
            op = self._ops[x.shape[0]] = texpr.torch.op(Y, [X, K])
        return op(x, self.weight)


class Net(torch.nn.Module):
    """The model (see the module docstring); ``reference`` swaps in PyTorch's conv."""

    def __init__(self, reference=False, dtype="float32", seed=0):
        super().__init__()
        tdt = torch.float64 if dtype == "float64" else torch.float32
        g = torch.Generator().manual_seed(seed)
        self.reference = reference
        self.conv = torch.nn.Conv2d(1, CHANNELS, 3, padding=1, dtype=tdt)
        self.depthwise = TexprDepthwise(CHANNELS, IMAGE, dtype)
        self.fc = torch.nn.Linear(CHANNELS * (IMAGE // 2) ** 2, CLASSES, dtype=tdt)
        with torch.no_grad():  # one seeded initialisation for both variants
            for p, fan_in in ((self.conv.weight, 9), (self.conv.bias, 9),
                              (self.depthwise.weight, 9), (self.fc.weight, 128),
                              (self.fc.bias, 128)):
                p.copy_((torch.rand(p.shape, generator=g, dtype=tdt) * 2 - 1) / fan_in ** 0.5)

    def forward(self, x):
        h = F.relu(self.conv(x))
        if self.reference:
            h = F.conv2d(h, self.depthwise.weight[:, None], padding=2, dilation=2,
                         groups=CHANNELS)
        else:
            h = self.depthwise(h)
        h = F.max_pool2d(F.relu(h), 2)
        return self.fc(h.flatten(1))


def data(seed=0, dtype="float32"):
    """Train/test tensors: images (n, 1, 8, 8), labels (n,) int64."""
    images, labels = load_digits()
    x_tr, x_te, y_tr, y_te = split(images, labels, seed)
    tdt = torch.float64 if dtype == "float64" else torch.float32
    cv = lambda a: torch.from_numpy(np.ascontiguousarray(a[:, None])).to(tdt)  # noqa: E731
    return cv(x_tr), torch.from_numpy(y_tr), cv(x_te), torch.from_numpy(y_te)


def global_batches(n, batch, epochs, seed):
    """The index arrays of every full global batch, epoch after epoch (the last
    partial batch of an epoch is dropped: every step has the same size)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(epochs):
        order = rng.permutation(n)
        for s in range(0, n - batch + 1, batch):
            out.append(order[s:s + batch])
    return out


def accuracy(model, x, y):
    with torch.no_grad():
        return float((model(x).argmax(1) == y).double().mean())


def train(reference=False, epochs=10, batch=64, lr=0.05, seed=0, dtype="float32",
          steps=None, log=None):
    """Single-process training with SGD (momentum 0.9). Returns ``(model, losses,
    test accuracy)``; ``steps`` stops early (tests)."""
    x_tr, y_tr, x_te, y_te = data(seed, dtype)
    model = Net(reference, dtype, seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for step, idx in enumerate(global_batches(len(x_tr), batch, epochs, seed)):
        if steps is not None and step >= steps:
            break
        idx = torch.from_numpy(idx)
        loss = F.cross_entropy(model(x_tr[idx]), y_tr[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if log and step % 50 == 0:
            print(f"step {step:4d}  loss {losses[-1]:.4f}", file=log)
    return model, losses, accuracy(model, x_te, y_te)


def _ddp_worker(rank, world, port, kwargs, result_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        epochs, batch, lr, seed = (kwargs[k] for k in ("epochs", "batch", "lr", "seed"))
        dtype, steps = kwargs["dtype"], kwargs["steps"]
        x_tr, y_tr, _, _ = data(seed, dtype)
        model = torch.nn.parallel.DistributedDataParallel(Net(False, dtype, seed))
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        local = batch // world
        losses = []
        for step, idx in enumerate(global_batches(len(x_tr), batch, epochs, seed)):
            if steps is not None and step >= steps:
                break
            mine = torch.from_numpy(idx[rank * local:(rank + 1) * local])
            loss = F.cross_entropy(model(x_tr[mine]), y_tr[mine])
            opt.zero_grad()
            loss.backward()  # DDP all-reduces (averages) the gradients
            opt.step()
            total = loss.detach().clone()
            torch.distributed.all_reduce(total)
            losses.append(float(total) / world)  # the global batch's mean loss
        if rank == 0:
            torch.save(losses, result_path)
        # every rank leaves the group together: a rank tearing gloo down while the
        # other still talks to it aborted the process (SIGABRT, "terminate called
        # without an active exception") in one CI run out of three
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()
    # this rank's work is done and its group gone: what follows is the
    # interpreter's exit (see train_ddp)
    with open(f"{result_path}.rank{rank}.done", "w"):
        pass


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_ddp(world=2, epochs=10, batch=64, lr=0.05, seed=0, dtype="float32", steps=None,
              result_path=None):
    """The same training under DistributedDataParallel: ``world`` processes
    (spawned), gloo on loopback, each rank taking ``batch / world`` samples of
    every global batch. Returns the list of global-batch losses (rank 0 writes
    them to ``result_path``, a temporary file by default)."""
    if batch % world:
        raise ValueError(f"the global batch {batch} must split evenly over {world} processes")
    kwargs = dict(epochs=epochs, batch=batch, lr=lr, seed=seed, dtype=dtype, steps=steps)
    with tempfile.TemporaryDirectory() as tmp:
        path = result_path or os.path.join(tmp, "ddp_losses.pt")
        try:
            torch.multiprocessing.spawn(_ddp_worker, args=(world, _free_port(), kwargs, path),
                                        nprocs=world, join=True)
        except torch.multiprocessing.ProcessExitedException as exc:
            # a rank aborted ("terminate called without an active exception",
            # SIGABRT) in about one run in fifteen of tests/test_digits_torch.py's
            # DDP test on a 2-core machine, at bccff86 as at 307ec14, 2026-12-05;
            # where it happens is not established. A rank that aborts after it
            # finished its work, left the group and wrote its marker aborted in the
            # interpreter's exit: the results stand, with a warning; any other
            # failure is raised
            done = all(os.path.exists(f"{path}.rank{r}.done") for r in range(world))
            if not (done and getattr(exc, "signal_name", None) == "SIGABRT"):
                raise
            import warnings
            warnings.warn(f"train_ddp: {exc} after every rank had finished (in the "
                          "interpreter's exit); the results are complete", RuntimeWarning)
        return torch.load(path)


def main(argv=None):
    ap = argparse.ArgumentParser(description="digits with a texpr layer in PyTorch")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reference", action="store_true", help="also train the all-PyTorch model")
    ap.add_argument("--ddp", type=int, default=0, help="also train data-parallel on N processes")
    args = ap.parse_args(argv)
    common = dict(epochs=args.epochs, batch=args.batch_size, lr=args.lr, seed=args.seed)
    _, losses, acc = train(log=sys.stdout, **common)
    print(f"texpr layer:  final loss {losses[-1]:.4f}  test accuracy {acc:.4f}")
    if args.reference:
        _, ref_losses, ref_acc = train(reference=True, **common)
        print(f"all PyTorch:  final loss {ref_losses[-1]:.4f}  test accuracy {ref_acc:.4f}")
    if args.ddp:
        ddp = train_ddp(world=args.ddp, **common)
        diff = max(abs(a - b) for a, b in zip(ddp, losses))
        print(f"DDP x{args.ddp}: final loss {ddp[-1]:.4f}; max |loss - single process| = {diff:.2e}")


if __name__ == "__main__":
    main()
