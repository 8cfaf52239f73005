"""One training step of the main job's CNN (batch 64), texpr vs PyTorch, alternating.

The model is ``texpr.examples.digits.Model`` (conv 1->8, relu, max-pool 2, conv
8->16, relu, flatten, dense 10, masked mean cross-entropy) and the same layers
in PyTorch (``F.conv2d``, ``F.max_pool2d``, ``F.linear``, ``F.cross_entropy``),
with the same weights and batch. A *step* is the loss, the gradients of every
weight and a plain SGD update (``w -= lr * g``):

* texpr: one ``codegen.build`` kernel of the loss and its gradients (serial, as
  the example's ``--serial`` builds it, and ``parallel=True``, the example's
  default), then the update in numpy;
* PyTorch: forward, ``loss.backward()`` and ``torch.optim.SGD.step`` (CPU,
  ``--threads`` threads), here and again alone in a process of its own (beside
  texpr its OpenMP workers share the cores with numba's: see
  benchmarks/peer_alone.py, and benchmarks/bench_neighbours.py for PyTorch's
  step beside texpr against alone); the ratios are printed
  against both, "PyTorch's best" being the faster.

The steps alternate, ``--repeat`` rounds, and the medians are printed with the
ratio texpr/PyTorch; the losses of the first step are checked to agree. Run
with ``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE`` (see bench_suite.py)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_digits_step.py
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import texpr as te  # noqa: E402
from texpr.examples import digits  # noqa: E402

LR = 0.05


def texpr_step(model, params, x, y, parallel):
    """A closure running one texpr step (kernel, then the update) and returning the loss."""
    names = list(model.weights)
    wts = [model.weights[n] for n in names]
    grads = te.differentiate(model.loss, wts).result
    from texpr import codegen
    kernel = codegen.build([model.loss] + list(grads), [model.x, model.labels, model.mask] + wts,
                           parallel=parallel, blas=parallel)
    mask = np.ones(model.batch, dtype=model.dtype)
    params = {n: v.copy() for n, v in params.items()}

    def step():
        out = kernel(x, y, mask, *[params[n] for n in names])
        for n, g in zip(names, out[1:]):
            params[n] -= LR * g
        return float(out[0])
    return step


def torch_step(params, x, y, threads):
    """The same model and update in PyTorch: a closure returning the loss."""
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    w = {n: torch.tensor(v, requires_grad=True) for n, v in params.items()}
    opt = torch.optim.SGD(list(w.values()), lr=LR)
    xt, yt = torch.tensor(x), torch.tensor(y)

    def step():
        opt.zero_grad(set_to_none=True)
        h = F.relu(F.conv2d(xt, w["conv1.w"], w["conv1.b"], padding=1))
        h = F.max_pool2d(h, 2)
        h = F.relu(F.conv2d(h, w["conv2.w"], w["conv2.b"], padding=1))
        logits = F.linear(h.flatten(1), w["dense.w"], w["dense.b"])
        loss = F.cross_entropy(logits, yt)
        loss.backward()
        opt.step()
        return float(loss.detach())
    return step


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2, help="PyTorch's and numba's threads")
    ap.add_argument("--torch-alone", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    images, labels = digits.load_digits()
    x = digits.Model.inputs(images[:args.batch]).astype("float32")
    y = labels[:args.batch]
    model = digits.Model(args.batch, "float32")
    params = model.init_weights(np.random.default_rng(0))
    if args.torch_alone:  # the worker: PyTorch in a process without texpr's code generator
        from cases import median_ms
        ms = median_ms(torch_step(params, x, y, args.threads), args.repeat)
        assert "texpr.codegen" not in sys.modules
        print(ms)
        return
    import numba
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    runs = {"texpr": texpr_step(model, params, x, y, parallel=False),
            "texpr parallel": texpr_step(model, params, x, y, parallel=True),
            "torch": torch_step(params, x, y, args.threads)}
    first = {k: f() for k, f in runs.items()}
    ref = first["torch"]
    for k, v in first.items():
        if abs(v - ref) > 1e-4 * max(1.0, abs(ref)):
            raise SystemExit(f"{k}'s first loss {v} differs from PyTorch's {ref}")
    times = {k: [] for k in runs}
    order = list(runs)
    for r in range(args.repeat):
        for k in order[r % len(order):] + order[:r % len(order)]:
            t = time.perf_counter()
            runs[k]()
            times[k].append(time.perf_counter() - t)
    torch_ms = float(np.median(times["torch"])) * 1e3
    print(f"digits CNN training step, batch {args.batch}, float32, {args.repeat} steps each, "
          f"alternating (first loss {ref:.6f})")
    import subprocess
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--torch-alone",
                           "--repeat", str(args.repeat), "--batch", str(args.batch),
                           "--threads", str(args.threads)], capture_output=True, text=True)
    alone = float(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    best = min(torch_ms, alone or torch_ms)
    for k, ts in times.items():
        ms = float(np.median(ts)) * 1e3
        print(f"  {k:15s} {ms:7.3f} ms   {ms / torch_ms:5.2f}x PyTorch here   "
              f"{ms / best:5.2f}x PyTorch's best")
    if alone is not None:
        print(f"  {'torch alone':15s} {alone:7.3f} ms   (a process of its own, without texpr's "
              "code generator: see benchmarks/peer_alone.py)")


if __name__ == "__main__":
    main()
