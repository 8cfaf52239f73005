"""One LSTM training step, texpr vs PyTorch (issue 13's target: at most 2x PyTorch).

The model is the digits job's ``--model lstm`` (texpr/examples/digits.py,
``LSTMModel``, the same graph and so the same cached kernel): an LSTM over T steps
of I features (``te.nn.lstm``, torch's layout) with hidden size H, its last hidden
state through a dense layer to 10 classes, mean cross-entropy (the job's masked
mean, every sample real here). A
*step* is the loss and the gradients of every weight plus the SGD update:

* texpr: one compiled kernel (``codegen.build`` of the loss and
  ``te.differentiate(loss, weights)``) called on numpy arrays, then the update in
  numpy;
* PyTorch: ``torch.nn.LSTM`` + ``torch.nn.Linear`` forward, ``backward`` and
  ``torch.optim.SGD.step`` (CPU, float32, its default threads unless
  ``--torch-threads``).

Both start from the same weights and batch and alternate run by run; reported:
median milliseconds over ``--repeat`` steps, the ratio texpr/torch, texpr's build
time, and the largest difference between the two first-step gradients.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_lstm.py
    ... --batch 64 --steps 8 --hidden 64 --repeat 200 [--parallel] [--torch-threads 1]
    ... --no-step-gemm    (the scan steps' matrix products as loop nests: the A/B of
                           codegen/loopnest/scan_gemm.py)

Timings drift between runs and machines: compare ratios from one run only.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=8, help="sequence length T (default 8)")
    ap.add_argument("--input", type=int, default=8, help="input features I (default 8)")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--parallel", action="store_true", help="texpr: parallel (prange) kernels")
    ap.add_argument("--no-step-gemm", action="store_true",
                    help="texpr: scan steps' matrix products as loop nests, not np.dot")
    ap.add_argument("--torch-threads", type=int, default=0,
                    help="torch.set_num_threads (default: torch's own choice)")
    args = ap.parse_args()

    import torch

    import texpr as te
    from texpr import codegen

    # --no-step-gemm: no scan step is worth a BLAS call (codegen.Options.scan_gemm_min_macs)
    options = {"scan_gemm_min_macs": 1 << 62} if args.no_step_gemm else {}
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    B, T, I, H = args.batch, args.steps, args.input, args.hidden
    lr = 0.1

    # ---- texpr: the digits job's model and step kernel (the same graph, so the same cache)
    from texpr.examples.digits import LSTMModel

    model = LSTMModel(B, hidden=H, inputs=I, steps=T)
    names = list(model.weights)
    wts = [model.weights[n] for n in names]
    t0 = time.perf_counter()
    grads = te.differentiate(model.loss, wts).result
    kernel = codegen.build([model.loss] + list(grads), [model.x, model.labels, model.mask] + wts,
                           parallel=args.parallel, options=options)
    t_build = time.perf_counter() - t0
    mask = np.ones(B, "float32")

    # ---- torch, same weights and batch
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(I, H, batch_first=True)
    dense = torch.nn.Linear(H, 10)
    tparams = {"lstm.w_ih": lstm.weight_ih_l0, "lstm.w_hh": lstm.weight_hh_l0,
               "lstm.b_ih": lstm.bias_ih_l0, "lstm.b_hh": lstm.bias_hh_l0,
               "dense.w": dense.weight, "dense.b": dense.bias}
    params = {n: tparams[n].detach().numpy().copy() for n in names}
    opt = torch.optim.SGD(list(lstm.parameters()) + list(dense.parameters()), lr=lr)
    rng = np.random.default_rng(0)
    xv = rng.uniform(0, 1, (B, T, I)).astype("float32")
    yv = rng.integers(0, 10, B)
    xt, yt = torch.from_numpy(xv), torch.from_numpy(yv)

    def texpr_step():
        _, *g = kernel(xv, yv, mask, *[params[n] for n in names])
        for n, gn in zip(names, g):
            params[n] -= lr * gn
        return g

    def torch_step():
        _, (hn, _) = lstm(xt)
        out = torch.nn.functional.cross_entropy(dense(hn[0]), yt)
        opt.zero_grad()
        out.backward()
        grads = [tparams[n].grad.numpy().copy() for n in names]
        opt.step()
        return grads

    g_te, g_torch = texpr_step(), torch_step()
    diff = max(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
               for a, b in zip(g_te, g_torch))
    times = {"texpr": [], "torch": []}
    for _ in range(args.repeat):
        for name, fn in (("texpr", texpr_step), ("torch", torch_step)):
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    print(f"LSTM training step: batch {B}, T {T}, input {I}, hidden {H} (float32); "
          f"torch threads {torch.get_num_threads()}, texpr {'parallel' if args.parallel else 'serial'}"
          f"{', step GEMMs off' if args.no_step_gemm else ''}")
    print(f"texpr build (differentiate + compile, cached kernels load): {t_build:.1f} s")
    print(f"{'':8} {'median ms':>10}")
    for k in ("texpr", "torch"):
        print(f"{k:8} {med[k]:10.3f}")
    print(f"ratio texpr/torch: {med['texpr'] / med['torch']:.2f}x (target <= 2x)")
    print(f"first-step gradients, largest difference relative to torch's largest: {diff:.1e}")


if __name__ == "__main__":
    main()
