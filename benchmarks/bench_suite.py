"""Value-and-grad of the gradient suite's cases (docs/testing.md): texpr kernels vs JAX (jit, CPU) vs PyTorch (CPU
autograd), side by side in one process.

For each case: the forward output plus the gradients of ``sum(out * H)`` w.r.t.
every listed float input (``H`` a fixed random head). texpr runs one compiled
kernel (``codegen.build`` of ``[out] + te.differentiate(out, inputs, head=H)``);
JAX runs ``jax.jit`` of ``jax.vjp``; PyTorch runs the forward and
``torch.autograd.grad``. The frameworks alternate run by run, in a rotating
order (each follows each other as often). Reported: median
milliseconds over ``--repeat`` runs,
the ratios texpr/JAX and texpr/torch, the largest difference from torch
(relative to the largest magnitude), and texpr's build time: *cold* (an
empty cache directory, numba compiles) and *warm* (a second process with the
same cache directory loads the machine code). Each peer is also timed alone, in
a process of its own that never loads texpr's code generator
(benchmarks/peer_alone.py: beside texpr and JAX, PyTorch's OpenMP workers share
the cores with numba's, OpenBLAS's and XLA's; until 2026-12-07 they also
inherited the ``OMP_WAIT_POLICY=PASSIVE`` texpr set, and ran small backward
passes up to several times slower: benchmarks/bench_neighbours.py); the
ratios "best peer" take the
fastest figure of a peer, in this process or alone. Then the forward and
both gradients as separate kernels, in ms and GFLOP/s.

    python benchmarks/bench_suite.py                 # every case, suite sizes
    python benchmarks/bench_suite.py --cases dense,conv2d_s1 --repeat 20
    python benchmarks/bench_suite.py --scale 0.25    # smaller batches

Also printed: the machine's SGEMM rate (numpy, 2048x2048, float32: the BLAS
that texpr's contraction stages call, see ``texpr.codegen.analysis.contraction``), the
BLAS libraries threadpoolctl finds (kernel, threads), and per case the stages
that ran as GEMMs. Every framework runs with ``--threads`` threads (default 2).

This machine sets OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, which slow numpy's
OpenBLAS; unset them for the benchmark command only::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_suite.py

Timings drift between runs and machines: compare ratios from one run only.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from texpr import codegen  # noqa: E402
import texpr as te  # noqa: E402
from cases import (jax_value_and_grad, make_cases, median_ms, random_inputs,  # noqa: E402
                   torch_value_and_grad, value_and_grad_graph)


def texpr_value_and_grad(case, arrays, head, loops_only=False):
    """(kernel, build seconds, run closure) of one case; ``loops_only``: every
    stage keeps its loop nest (``blas(False)``: the kernels before GEMM stages)."""
    phs, h, out, grads = value_and_grad_graph(case)
    t = time.perf_counter()
    if loops_only:
        from texpr import simplify
        outs = list(simplify.simplify([out] + grads))
        s = codegen.create_schedule(outs)
        for op in s.ops:
            if not isinstance(op, te.PlaceholderOp):
                s[op].blas(False)
        kernel = codegen.build(outs, phs + [h], s)
    else:
        kernel = codegen.build([out] + grads, phs + [h])
    seconds = time.perf_counter() - t
    args = list(arrays) + [head]
    return kernel, seconds, lambda: kernel(*args)


def sgemm_rate(n=2048, repeat=5):
    """GFLOP/s of numpy's float32 matmul of two n x n matrices (best of ``repeat``)."""
    a = np.random.default_rng(0).standard_normal((n, n)).astype("float32")
    b = a.T.copy()
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeat))
    return 2 * n ** 3 / best / 1e9


def _timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def blas_info():
    """One line per BLAS library loaded (threadpoolctl): its kernel and threads."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return ["threadpoolctl is not installed (pip install texpr-autodiff[bench])"]
    return [f"{d.get('internal_api')} {d.get('version')} kernel={d.get('architecture')} "
            f"threads={d.get('num_threads')} ({os.path.basename(d.get('filepath', ''))})"
            for d in threadpool_info() if d.get("user_api") == "blas"]


def _rel_diff(got, ref):
    ref = np.asarray(ref, dtype=np.float64)
    scale = max(float(np.abs(ref).max()), 1e-30)
    return float(np.abs(np.asarray(got, dtype=np.float64).reshape(ref.shape) - ref).max()) / scale


def bench_case(case, repeat, use_jax, use_torch, use_loops=False):
    arrays = random_inputs(case)
    row = {"case": case.name}
    # the head has the output's shape: build the texpr graph once to learn it
    phs = [te.placeholder(shape, name, dtype) for name, shape, dtype, _ in case.inputs]
    out_shape = case.texpr(*phs).shape
    head = np.random.default_rng(1).standard_normal(out_shape).astype("float32")
    kernel, build_s, run = texpr_value_and_grad(case, arrays, head)
    row["build_s"] = build_s
    row["blas_stages"] = kernel.source.count("# BLAS:")
    runs = {"texpr": run}
    got = run()
    if use_loops:
        runs["loops"] = texpr_value_and_grad(case, arrays, head, loops_only=True)[2]
    if use_torch:
        trun = torch_value_and_grad(case, arrays, head)
        tout, tgrads = trun()
        refs = [tout.detach().numpy()] + [g.numpy() for g in tgrads]
        row["max_rel_diff_vs_torch"] = max(_rel_diff(g, r) for g, r in zip(got, refs))
        runs["torch"] = trun
    if use_jax:
        runs["jax"] = jax_value_and_grad(case, arrays, head)
    # rounds alternate the frameworks, so that the load of a shared machine weighs
    # on all of them alike; the order rotates, so that each follows each other as
    # often (torch's OpenMP workers spin for 10-20 ms after a call and slow
    # whichever framework runs next; pausing between runs was tried and slowed
    # every framework about 2x: idle cores lose their caches and clock)
    for f in runs.values():
        f()
    row.update({f"{k}_ms": v for k, v in time_rotating(runs, repeat).items()})
    return row


def print_blas_header():
    """Print which BLAS numpy runs, and a warning for each OpenBLAS setting that
    slows it (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE: unset them for benchmarks)."""
    for line in blas_info():
        print(f"BLAS: {line}")
    for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if k in os.environ:
            print(f"warning: {k}={os.environ[k]} is set (it slows OpenBLAS; unset it for "
                  "benchmarks)")


def time_rotating(runs, repeat):
    """``{framework: median ms}`` of ``repeat`` rounds, each calling every closure of
    ``runs`` once, in an order that rotates round by round (each follows each other
    as often)."""
    times = {k: [] for k in runs}
    order = list(runs)
    for r in range(repeat):
        for k in order[r % len(order):] + order[:r % len(order)]:
            t = time.perf_counter()
            runs[k]()
            times[k].append(time.perf_counter() - t)
    return {k: float(np.median(v)) * 1e3 for k, v in times.items()}


def kernel_detail(name, repeat, scale):
    """The forward, dX and dW of case ``name`` (dense or a convolution) as separate
    kernels: ms and GFLOP/s (each does the forward's FLOP count)."""
    case = make_cases(scale)[name]
    x, w = random_inputs(case)
    X = te.placeholder(x.shape, "X", "float32")
    W = te.placeholder(w.shape, "W", "float32")
    Y = case.texpr(X, W)
    H = te.placeholder(Y.shape, "H", "float32")
    h = np.random.default_rng(1).standard_normal(Y.shape).astype("float32")
    dX, dW = te.differentiate(Y, [X, W], head=H).result
    rows = []
    for kname, out, ins, args in (("forward", Y, [X, W], (x, w)), ("dX", dX, [W, H], (w, h)),
                                  ("dW", dW, [X, H], (x, h))):
        t = time.perf_counter()
        k = codegen.build([out], ins)
        b = time.perf_counter() - t
        ms = median_ms(lambda: k(*args), repeat)
        rows.append({"kernel": kname, "ms": ms, "gflops": case.flop / ms / 1e6, "build_s": b,
                     "blas": "# BLAS:" in k.source})
    return rows


def _set_threads(n):
    """``n`` threads for numpy's BLAS, numba and PyTorch (XLA takes the machine's
    cores: 2 here)."""
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(n)
    except ImportError:
        pass
    import numba
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    try:
        import torch
        torch.set_num_threads(n)
    except ImportError:
        pass


PEER_KEYS = ("jax_ms", "torch_ms", "jax_alone_ms", "torch_alone_ms")


def best_peer_ms(row, keys=PEER_KEYS):
    """The fastest peer figure of a row (in this process or alone), or None."""
    got = [row[k] for k in keys if row.get(k)]
    return min(got) if got else None


def peers_alone(names, args):
    """``{peer: {case: ms}}``: each peer timed in a process of its own
    (benchmarks/peer_alone.py: texpr's code generator and its thread settings
    not loaded there); a peer whose worker fails is left out."""
    out = {}
    for peer in [p for p, off in (("jax", args.no_jax), ("torch", args.no_torch),
                                  ("texpr", False)) if not off]:
        cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                            "peer_alone.py"), "--peer", peer,
               "--cases", ",".join(names), "--repeat", str(args.repeat),
               "--scale", str(args.scale), "--threads", str(args.threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              env=dict(os.environ, TEXPR_CACHE_DIR=args.cache_dir
                                       or os.environ.get("TEXPR_CACHE_DIR", "")))
        if proc.returncode == 0:
            out[peer] = json.loads(proc.stdout.strip().splitlines()[-1])
        else:
            print(f"warning: {peer} alone failed: {proc.stderr[-300:]}")
    return out


def markdown_table(rows):
    """README.md's benchmark table of ``rows`` (:func:`bench_case` results, timed
    with ``loops``): median ms per framework (the peers in this process and
    alone), ratios to the best peer figure, GEMMs."""
    lines = ["| case | texpr ms | loops only ms | jax ms | torch ms | texpr alone ms "
             "| jax alone ms | torch alone ms | loops only ÷ best | texpr ÷ best "
             "| alone ÷ best alone | GEMMs |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    nan = float("nan")
    for r in rows:
        best = best_peer_ms(r)
        loops = r.get("loops_ms", nan)
        lines.append(f"| {r['case']} | {r['texpr_ms']:.2f} | {loops:.2f} | "
                     f"{r.get('jax_ms', nan):.2f} | {r.get('torch_ms', nan):.2f} | "
                     f"{r.get('texpr_alone_ms') or nan:.2f} | "
                     f"{r.get('jax_alone_ms') or nan:.2f} | {r.get('torch_alone_ms') or nan:.2f}"
                     f" | {loops / best:.2f} | {r['texpr_ms'] / best:.2f} | "
                     f"{(r.get('texpr_alone_ms') or nan) / (best_peer_ms(r, PEER_KEYS[2:]) or nan):.2f}"
                     f" | {r['blas_stages']} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--scale", type=float, default=1.0, help="batch scale (1 = SUITE sizes)")
    ap.add_argument("--no-jax", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-alone", action="store_true",
                    help="skip timing each peer alone in a process of its own")
    ap.add_argument("--cache-dir", default="", help="TEXPR_CACHE_DIR (default: a fresh one: cold)")
    ap.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", default="", help="also write the results to this file")
    ap.add_argument("--threads", type=int, default=2, help="threads of every framework")
    ap.add_argument("--loops", action="store_true",
                    help="also time texpr with every stage on its loop nest (no GEMMs)")
    ap.add_argument("--markdown", action="store_true",
                    help="also print the results as README.md's table (needs --loops)")
    args = ap.parse_args(argv)
    _set_threads(args.threads)

    cache = args.cache_dir or tempfile.mkdtemp(prefix="texpr_bench_")
    os.environ["TEXPR_CACHE_DIR"] = cache
    cases = make_cases(args.scale)
    names = [n for n in args.cases.split(",") if n] or list(cases)

    if args.build_only:  # the warm-cache process: build every kernel, print build times
        out = {}
        for n in names:
            arrays = random_inputs(cases[n])
            phs = [te.placeholder(s, nm, d) for nm, s, d, _ in cases[n].inputs]
            head = np.zeros(cases[n].texpr(*phs).shape, "float32")
            _, b, _ = texpr_value_and_grad(cases[n], arrays, head)
            out[n] = b
        print(json.dumps(out))
        return

    rate = sgemm_rate()
    print(f"SGEMM (numpy, 2048x2048, float32): {rate:.1f} GFLOP/s")
    print_blas_header()
    rows = []
    print(f"{'case':22s} {'texpr ms':>9s} {'jax ms':>8s} {'torch ms':>9s} {'/jax':>7s} "
          f"{'/torch':>7s} {'/best':>6s} {'cold s':>7s} {'diff':>8s} {'gemm':>4s}"
          + (f" {'loops ms':>9s} {'/best':>6s}" if args.loops else ""), flush=True)
    for n in names:
        r = bench_case(cases[n], args.repeat, not args.no_jax, not args.no_torch, args.loops)
        rows.append(r)
        j, t = r.get("jax_ms"), r.get("torch_ms")
        print(f"{n:22s} {r['texpr_ms']:9.2f} {j if j is not None else float('nan'):8.2f} "
              f"{t if t is not None else float('nan'):9.2f} "
              f"{r['texpr_ms'] / j if j else float('nan'):7.2f} "
              f"{r['texpr_ms'] / t if t else float('nan'):7.2f} "
              f"{r['texpr_ms'] / min(j or t, t or j) if (j or t) else float('nan'):6.2f} "
              f"{r['build_s']:7.2f} "
              f"{r.get('max_rel_diff_vs_torch', float('nan')):8.1e} {r['blas_stages']:4d}"
              + (f" {r['loops_ms']:9.2f} {r['loops_ms'] / min(j or t, t or j):6.2f}"
                 if args.loops and (j or t) else ""), flush=True)
    # warm: a second process with the same cache directory
    env = dict(os.environ, TEXPR_CACHE_DIR=cache)
    cmd = [sys.executable, os.path.abspath(__file__), "--build-only", "--cases", ",".join(names),
           "--scale", str(args.scale), "--cache-dir", cache]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    warm = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {}
    cold_total = sum(r["build_s"] for r in rows)
    print(f"\nbuild (compile) time, all cases: cold {cold_total:.1f} s, "
          f"warm (second process) {sum(warm.values()):.1f} s")
    for r in rows:
        r["warm_build_s"] = warm.get(r["case"])
    if not args.no_alone:
        alone = peers_alone(names, args)
        print("\npeers alone (each in a process of its own, without texpr's code generator):")
        print(f"{'case':22s} {'texpr ms':>9s} {'jax ms':>8s} {'torch ms':>9s} "
              f"{'alone ÷ alone':>14s} {'texpr ÷ best':>13s}")
        nan = float("nan")
        for r in rows:
            for peer, ms in alone.items():
                r[f"{peer}_alone_ms"] = ms.get(r["case"])
            j, t, x = r.get("jax_alone_ms"), r.get("torch_alone_ms"), r.get("texpr_alone_ms")
            best = best_peer_ms(r)
            best_alone = best_peer_ms(r, PEER_KEYS[2:])
            print(f"{r['case']:22s} {x or nan:9.2f} {j or nan:8.2f} {t or nan:9.2f} "
                  f"{x / best_alone if x and best_alone else nan:14.2f} "
                  f"{r['texpr_ms'] / best if best else nan:13.2f}")
    ratios_j = [r["texpr_ms"] / r["jax_ms"] for r in rows if r.get("jax_ms")]
    ratios_t = [r["texpr_ms"] / r["torch_ms"] for r in rows if r.get("torch_ms")]
    if ratios_j:
        print(f"geometric mean texpr/jax {np.exp(np.mean(np.log(ratios_j))):.2f}")
    if ratios_t:
        print(f"geometric mean texpr/torch {np.exp(np.mean(np.log(ratios_t))):.2f}")
    for label, keys, mine in (("in this process", PEER_KEYS[:2], "texpr_ms"),
                              ("in this process or alone", PEER_KEYS, "texpr_ms"),
                              ("all three alone", PEER_KEYS[2:], "texpr_alone_ms")):
        best = [(r[mine] / best_peer_ms(r, keys), r["case"]) for r in rows
                if best_peer_ms(r, keys) and r.get(mine)]
        if best:
            worst = max(best)
            print(f"geometric mean texpr/best peer ({label}) "
                  f"{np.exp(np.mean(np.log([b for b, _ in best]))):.2f} "
                  f"(worst {worst[1]} {worst[0]:.2f})")
    if args.loops:
        lb = [r["loops_ms"] / best_peer_ms(r) for r in rows if best_peer_ms(r)]
        if lb:
            print(f"geometric mean texpr loops only (no GEMMs)/best peer "
                  f"{np.exp(np.mean(np.log(lb))):.2f}")
    detail = {}
    for name in ("dense", "conv2d_s1", "conv2d_s2", "conv2d_dil2", "conv2d_transpose_s2"):
        if name not in names:
            continue
        print(f"\n{name} kernels (float32; SGEMM {rate:.1f} GFLOP/s):")
        detail[name] = kernel_detail(name, args.repeat, args.scale)
        for d in detail[name]:
            print(f"  {d['kernel']:8s} {d['ms']:8.2f} ms  {d['gflops']:6.1f} GFLOP/s "
                  f"({100 * d['gflops'] / rate:.0f}% of SGEMM){' BLAS' if d['blas'] else ''}")
    if args.markdown:
        print()
        print(markdown_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "kernels": detail, "cache_dir": cache,
                       "sgemm_gflops": rate, "blas": blas_info()}, f, indent=1)


if __name__ == "__main__":
    main()
