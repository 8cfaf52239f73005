"""One LSTM (or GRU) training step, texpr vs PyTorch (issue 13's target: at most 2x
PyTorch; issue 51's at batch 32, T 64, hidden 128: at most 1.5x, and the reverse scan at
most 3x the forward scan).

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

The GRU (``--cell gru``) is the same model with ``te.nn.gru`` and ``torch.nn.GRU``
(weights ``gru.w_ih`` (3H, I) ..., gates ``r, z, n``).

Both start from the same weights and batch and alternate run by run; reported:
median milliseconds over ``--repeat`` steps, the ratio texpr/torch, texpr's build
time, and the largest difference between the two first-step gradients; with
``--profile-scans``, the forward and the reverse scan's milliseconds per call
(``kernel.profile``) and their ratio.

By default two sizes run, each for both cells: batch 64, T 8, hidden 64 (issue 13's)
and batch 32, T 64, hidden 128 (issue 51's, where the reverse scan dominates);
``--batch``/``--steps``/``--hidden`` give one size instead.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_lstm.py
    ... --batch 64 --steps 8 --hidden 64 --repeat 200 [--parallel] [--torch-threads 1]
    ... --cell lstm gru --profile-scans
    ... --no-step-gemm    (the scan steps' matrix products as loop nests: the A/B of
                           codegen/loopnest/scan_gemm.py)

Measured 2026-12-07 on the 2-core machine (load average 4-6, ``--torch-threads 1``,
median of 20): batch 32, T 64, hidden 128: LSTM 79 ms vs PyTorch 13.5 ms (5.9x; 1.49 s
before the scan loop nests folded their step tests, codegen/loopnest/scan_lower.py),
reverse/forward scan 1.5x; GRU 66 ms vs 19.5 ms (3.4x; 2.15 s before), reverse/forward
2.25x. Batch 64, T 8, hidden 64: LSTM 11-12.5 ms vs 2.5 ms; some runs of texpr's kernel
took 10x longer on the loaded machine (108 ms), with or without the fold.
Again 2026-12-07 23:40 UTC (load 1.5-1.7, ``--torch-threads 1``, median of 10, batch 32,
T 64, hidden 128): LSTM 38.6 ms vs 13.5 ms (2.87x), reverse/forward scan 1.54x; GRU
34.6 ms vs 21.2 ms (1.63x), reverse/forward 2.05x.

Timings drift between runs and machines: compare ratios from one run only.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


#: (batch, steps T, hidden H) run by default: issue 13's size and issue 51's
SIZES = ((64, 8, 64), (32, 64, 128))


class _GRUModel:
    """The digits job's LSTM model (texpr/examples/digits.py) with ``te.nn.gru``: the
    last hidden state through a dense layer to 10 classes, the masked mean loss."""

    def __init__(self, batch, hidden, inputs, steps):
        import texpr as te
        from texpr.examples.digits import CLASSES, masked_mean_loss

        P = lambda shape, name: te.placeholder(shape, name=name)  # noqa: E731
        self.x = P((batch, steps, inputs), "x")
        self.labels = te.placeholder((batch,), name="labels", dtype="int64")
        self.mask = P((batch,), "mask")
        g = 3 * hidden
        self.weights = {
            "gru.w_ih": P((g, inputs), "gru_w_ih"), "gru.w_hh": P((g, hidden), "gru_w_hh"),
            "gru.b_ih": P((g,), "gru_b_ih"), "gru.b_hh": P((g,), "gru_b_hh"),
            "dense.w": P((CLASSES, hidden), "dense_w"), "dense.b": P((CLASSES,), "dense_b"),
        }
        w = self.weights
        _, h_n = te.nn.gru(self.x, w["gru.w_ih"], w["gru.w_hh"], w["gru.b_ih"], w["gru.b_hh"],
                           batch_first=True, name="gru")
        last = te.nn.reshape(h_n, (batch, hidden), name="last")
        logits = te.nn.dense(last, w["dense.w"], w["dense.b"], name="logits")
        self.loss = masked_mean_loss(logits, self.labels, self.mask, batch)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=None, help="with --steps and --hidden: "
                    "one size (default: both of SIZES)")
    ap.add_argument("--steps", type=int, default=None, help="sequence length T")
    ap.add_argument("--input", type=int, default=8, help="input features I (default 8)")
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--cell", nargs="+", default=["lstm", "gru"], choices=["lstm", "gru"])
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--parallel", action="store_true", help="texpr: parallel (prange) kernels")
    ap.add_argument("--no-step-gemm", action="store_true",
                    help="texpr: scan steps' matrix products as loop nests, not np.dot")
    ap.add_argument("--torch-threads", type=int, default=0,
                    help="torch.set_num_threads (default: torch's own choice)")
    ap.add_argument("--profile-scans", action="store_true",
                    help="also time the forward and the reverse scan (kernel.profile)")
    args = ap.parse_args()

    import torch

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    given = (args.batch, args.steps, args.hidden)
    if any(v is not None for v in given):
        d = SIZES[0]
        sizes = [tuple(v if v is not None else dv for v, dv in zip(given, d))]
    else:
        sizes = list(SIZES)
    print(f"load average {os.getloadavg()[0]:.2f}")
    for B, T, H in sizes:
        for cell in args.cell:
            run(args, cell, B, T, args.input, H)
    print(f"load average {os.getloadavg()[0]:.2f}")


def run(args, cell, B, T, I, H):
    """One size and cell: build, check the first step's gradients, time both."""
    import torch

    import texpr as te
    from texpr import codegen

    # --no-step-gemm: no scan step is worth a BLAS call (codegen.Options.scan_gemm_min_macs)
    options = {"scan_gemm_min_macs": 1 << 62} if args.no_step_gemm else {}
    lr = 0.1

    # ---- texpr: the digits job's model and step kernel (the same graph, so the same cache)
    from texpr.examples.digits import LSTMModel

    model = (LSTMModel(B, hidden=H, inputs=I, steps=T) if cell == "lstm"
             else _GRUModel(B, hidden=H, inputs=I, steps=T))
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
    rnn = (torch.nn.LSTM if cell == "lstm" else torch.nn.GRU)(I, H, batch_first=True)
    dense = torch.nn.Linear(H, 10)
    tparams = {f"{cell}.w_ih": rnn.weight_ih_l0, f"{cell}.w_hh": rnn.weight_hh_l0,
               f"{cell}.b_ih": rnn.bias_ih_l0, f"{cell}.b_hh": rnn.bias_hh_l0,
               "dense.w": dense.weight, "dense.b": dense.bias}
    params = {n: tparams[n].detach().numpy().copy() for n in names}
    opt = torch.optim.SGD(list(rnn.parameters()) + list(dense.parameters()), lr=lr)
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
        out = rnn(xt)[1]
        hn = out[0] if cell == "lstm" else out
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
    target = 1.5 if (B, T, H) == SIZES[1] else 2
    print(f"{cell.upper()} training step: batch {B}, T {T}, input {I}, hidden {H} (float32); "
          f"torch threads {torch.get_num_threads()}, texpr {'parallel' if args.parallel else 'serial'}"
          f"{', step GEMMs off' if args.no_step_gemm else ''}")
    print(f"texpr build (differentiate + compile, cached kernels load): {t_build:.1f} s")
    print(f"{'':8} {'median ms':>10}")
    for k in ("texpr", "torch"):
        print(f"{k:8} {med[k]:10.3f}")
    print(f"ratio texpr/torch: {med['texpr'] / med['torch']:.2f}x (target <= {target}x)")
    print(f"first-step gradients, largest difference relative to torch's largest: {diff:.1e}")
    if args.profile_scans:
        p = kernel.profile(xv, yv, mask, *[params[n] for n in names],
                           repeat=max(3, args.repeat // 10), warmup=1, print_table=False)
        fwd = sum(r.ms_per_call for r in p.rows if r.computes == "forward scan")
        rev = sum(r.ms_per_call for r in p.rows if r.computes.startswith("gradient scan"))
        print(f"scans (kernel.profile): forward {fwd:.3f} ms, reverse {rev:.3f} ms, "
              f"reverse/forward {rev / fwd:.2f}x (target <= 3x)")
    print()


if __name__ == "__main__":
    main()
