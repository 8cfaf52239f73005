"""One training step of the example models: texpr against PyTorch eager, torch.compile
and JAX jit, every framework on the same number of threads (default 2).

The models (benchmarks/model_cases.py): ``resnet`` -- texpr.examples.resnet.ResNet,
batch 64 of 3x32x32; ``gpt2l`` and ``gpt8l`` -- texpr.examples.gpt_model.GPT (batch
16, T 64, d 128, 4 heads) with 2 and 8 layers. A step is the loss value and the
gradient of every weight, from the same float32 weights and inputs in every
framework: texpr runs one kernel (``codegen.build([loss] + te.differentiate(loss,
weights))``); PyTorch runs texpr.examples.models_torch's twin forward and
``torch.autograd.grad``, eager and through ``torch.compile``; JAX runs
``jax.jit(jax.value_and_grad(...))`` of benchmarks/models_jax.py's twin. Before
anything is timed the four losses must agree (relative difference at most
1e-4) and every gradient must match texpr's (at most 5e-2 of its largest
magnitude; the largest difference is printed): a benchmark of a wrong model
stops. The gradient bound is loose for XLA: JAX's float32 ResNet gradients
differ from float64 ones by up to 1.5e-2 (``down.conv.w``, the stride-2
convolution's; 2026-12-07), while its float64 twin matches PyTorch's float64 to
5e-14 and PyTorch's float32 stays within 2e-5.

Timed: the median milliseconds of ``--repeat`` steps, the frameworks alternating
in one process in a rotating order (as bench_suite.py), and each peer (and
texpr) again alone in a process of its own (benchmarks/peer_alone.py ``--suite
models``: beside texpr, PyTorch's OpenMP workers inherit texpr's thread
settings and share the cores with numba's). "best peer" is the fastest figure of
any peer, in this process or alone; the ratios count against it. Also printed:
texpr's build seconds *cold* (a process of its own with a fresh, empty
TEXPR_CACHE_DIR per model: symbolic differentiation, simplification and numba
compilation) and *warm* (this process, the same cache directory), the peak
resident memory of that cold process (``ru_maxrss``: the build and one step),
and the peers' first-call seconds (torch.compile's and XLA's compilation;
Inductor keeps its own disk cache, /tmp/torchinductor_$USER, so a second run's
torch.compile figure is warm).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_models.py
    python benchmarks/bench_models.py --models gpt2l --repeat 20 --skip-compile

This machine sets OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, which slow numpy's
OpenBLAS; unset them for the benchmark command only. Timings drift between runs
and machines: compare ratios from one run only, and report the load average.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from texpr import codegen  # noqa: E402
import texpr as te  # noqa: E402
from bench_suite import _set_threads, print_blas_header, time_rotating  # noqa: E402
from model_cases import MODELS, PEERS  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
#: the peers in the order of the table
PEER_ORDER = ("torch", "torch_compile", "jax")
#: the largest relative difference of a peer's loss from texpr's
LOSS_RTOL = 1e-4
#: the largest difference of a peer's gradient from texpr's, relative to its largest magnitude
GRAD_RTOL = 5e-2


def texpr_step(case):
    """``(build seconds, run)``: texpr's step kernel of ``case`` (differentiate,
    simplify, build: loaded from TEXPR_CACHE_DIR when warm) and a closure returning
    ``(loss, [gradient per weight])``."""
    m = case.model
    t = time.perf_counter()
    grads = te.differentiate(m.loss, list(m.weights.values())).result
    kernel = codegen.build([m.loss] + list(grads), m.inputs_list())
    seconds = time.perf_counter() - t
    args = case.texpr_args()

    def run():
        loss, *g = kernel(*args)
        return loss, g
    return seconds, run


def _as_numpy(x):
    if hasattr(x, "detach"):
        x = x.detach()
    return np.asarray(x, dtype=np.float64)


def check_agreement(name, results):
    """``{peer: largest gradient difference}`` of each peer's first step against
    texpr's (``results``: ``{framework: (loss, grads)}``), each relative to the
    largest magnitude of texpr's gradient.

    Raises:
        SystemExit: a loss differs by more than :data:`LOSS_RTOL` (relative) or a
            gradient by more than :data:`GRAD_RTOL`.
    """
    ref_loss, ref_grads = results["texpr"]
    ref_loss = float(_as_numpy(ref_loss))
    diffs = {}
    for peer, (loss, grads) in results.items():
        if peer == "texpr":
            continue
        loss = float(_as_numpy(loss))
        if abs(loss - ref_loss) > LOSS_RTOL * abs(ref_loss):
            raise SystemExit(f"bench_models: {name}: {peer}'s loss {loss!r} differs from "
                             f"texpr's {ref_loss!r} by more than {LOSS_RTOL:g} (relative): "
                             f"not the same model; nothing timed")
        worst = 0.0
        for g, r in zip(grads, ref_grads):
            r = _as_numpy(r)
            worst = max(worst, float(np.abs(_as_numpy(g).reshape(r.shape) - r).max())
                        / max(float(np.abs(r).max()), 1e-30))
        if worst > GRAD_RTOL:
            raise SystemExit(f"bench_models: {name}: {peer}'s gradients differ from texpr's "
                             f"by {worst:.2e} of their largest magnitude (> {GRAD_RTOL:g}); "
                             f"nothing timed")
        diffs[peer] = worst
    return diffs


def cold_build(name, cache, threads):
    """``{build_s, peak_rss_mb}`` of a process of its own that builds ``name``'s texpr
    step with the (empty) cache directory ``cache`` and runs it once."""
    cmd = [sys.executable, os.path.abspath(__file__), "--build-only", "--models", name,
           "--threads", str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env=dict(os.environ, TEXPR_CACHE_DIR=cache))
    if proc.returncode != 0:
        raise SystemExit(f"bench_models: the cold build of {name} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def alone(name, peers, args, cache):
    """``{peer: median ms}``: each of ``peers`` timed in a process of its own
    (benchmarks/peer_alone.py ``--suite models``); a peer whose process fails is left
    out with a warning."""
    out = {}
    for peer in peers:
        cmd = [sys.executable, os.path.join(HERE, "peer_alone.py"), "--suite", "models",
               "--peer", peer, "--cases", name, "--repeat", str(args.repeat),
               "--threads", str(args.threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              env=dict(os.environ, TEXPR_CACHE_DIR=cache))
        if proc.returncode == 0:
            out[peer] = json.loads(proc.stdout.strip().splitlines()[-1])[name]
        else:
            print(f"warning: {peer} alone failed: {proc.stderr[-500:]}", flush=True)
    return out


def bench_model(name, args):
    """One model's row: build figures, medians in this process and alone, ratios."""
    cache = args.cache_dir or tempfile.mkdtemp(prefix=f"texpr_bench_models_{name}_")
    row = {"model": name, "cache_dir": cache}
    row.update(cold_build(name, cache, args.threads))
    os.environ["TEXPR_CACHE_DIR"] = cache
    case = MODELS[name]()
    row["warm_build_s"], run = texpr_step(case)
    runs = {"texpr": run}
    peers = [p for p in PEER_ORDER if not (p == "torch_compile" and args.skip_compile)]
    for p in peers:
        runs[p] = PEERS[p](case)
    first = {}
    for k, f in runs.items():
        t = time.perf_counter()
        first[k] = f()
        row[f"{k}_first_call_s"] = time.perf_counter() - t
    row["grad_diff"] = check_agreement(name, first)
    row["loss"] = float(_as_numpy(first["texpr"][0]))
    for f in runs.values():  # one more untimed call each (caches, allocators)
        f()
    row.update({f"{k}_ms": v for k, v in time_rotating(runs, args.repeat).items()})
    if not args.no_alone:
        row.update({f"{k}_alone_ms": v for k, v in alone(name, peers + ["texpr"], args,
                                                         cache).items()})
    figures = [row[k] for p in peers for k in (f"{p}_ms", f"{p}_alone_ms") if row.get(k)]
    row["best_peer_ms"] = min(figures)
    row["best_peer"] = min(((row[k], k[:-3]) for p in peers
                            for k in (f"{p}_ms", f"{p}_alone_ms") if row.get(k)))[1]
    return row


def print_table(rows):
    """The results as a markdown table (medians in ms; "alone": a process of its own)."""
    nan = float("nan")
    print("\n| model | texpr ms | torch eager | torch.compile | JAX jit | texpr alone "
          "| torch alone | compile alone | JAX alone | best peer | texpr ÷ best "
          "| texpr alone ÷ best | cold build s | warm build s | peak RSS MB |")
    print("|---|" + "---|" * 14)
    for r in rows:
        g = lambda k: r.get(k) or nan  # noqa: E731
        best = r["best_peer_ms"]
        print(f"| {r['model']} | {g('texpr_ms'):.1f} | {g('torch_ms'):.1f} | "
              f"{g('torch_compile_ms'):.1f} | {g('jax_ms'):.1f} | {g('texpr_alone_ms'):.1f} | "
              f"{g('torch_alone_ms'):.1f} | {g('torch_compile_alone_ms'):.1f} | "
              f"{g('jax_alone_ms'):.1f} | {best:.1f} ({r['best_peer']}) | "
              f"{g('texpr_ms') / best:.2f} | {g('texpr_alone_ms') / best:.2f} | "
              f"{r['build_s']:.1f} | {r['warm_build_s']:.1f} | {r['peak_rss_mb']:.0f} |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="resnet,gpt2l,gpt8l",
                    help=f"comma-separated, of {', '.join(MODELS)} (default: all)")
    ap.add_argument("--repeat", type=int, default=10, help="timed steps per framework (default 10)")
    ap.add_argument("--skip-compile", action="store_true",
                    help="leave torch.compile out (its first call compiles for minutes)")
    ap.add_argument("--no-alone", action="store_true",
                    help="skip timing each framework alone in a process of its own")
    ap.add_argument("--threads", type=int, default=2, help="threads of every framework")
    ap.add_argument("--cache-dir", default="",
                    help="TEXPR_CACHE_DIR of every model (default: a fresh one per model, so "
                         "that the build is cold; a filled one makes the 'cold' build warm)")
    ap.add_argument("--json", default="", help="also write the rows to this file")
    ap.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        ap.error(f"--models: unknown {unknown}; choose from {', '.join(MODELS)}")
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    _set_threads(args.threads)

    if args.build_only:  # the cold-build process: TEXPR_CACHE_DIR is fresh
        (name,) = names
        seconds, run = texpr_step(MODELS[name]())
        run()
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps({"build_s": seconds, "peak_rss_mb": rss}))
        return

    print_blas_header()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    rows = []
    for name in names:
        r = bench_model(name, args)
        rows.append(r)
        diffs = ", ".join(f"{p} {d:.1e}" for p, d in r["grad_diff"].items())
        firsts = ", ".join(f"{p} {r[p + '_first_call_s']:.1f} s" for p in PEER_ORDER
                           if p + "_first_call_s" in r)
        print(f"{name}: loss {r['loss']:.5f}; gradients vs texpr (largest difference / "
              f"largest magnitude): {diffs}; peers' first call: {firsts}; load "
              f"{os.getloadavg()[0]:.2f}", flush=True)
    print_table(rows)
    print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
