"""One framework (JAX, PyTorch, or texpr) timed alone in its own process: bench_suite.py's worker.

bench_suite.py times texpr, JAX and PyTorch alternating in one process, where
numba's, OpenBLAS's, XLA's and PyTorch's thread pools share two cores. Until
2026-12-07 importing texpr's code generator also set ``OMP_WAIT_POLICY=PASSIVE``
for the whole process, and PyTorch's OpenMP workers then slept between the
many small operations of a backward pass: the digits CNN's training step took
0.7-1.0 ms in a PyTorch-only process and 2.8-9 ms beside texpr (2026-12-01,
this machine; benchmarks/bench_neighbours.py measures it now). So bench_suite also runs each
peer here, in a fresh process that never imports texpr's code generator, with
the same cases, inputs, head and thread count, and compares texpr with the
better of the two figures; texpr alone too (``--peer texpr``, its kernels loaded
from bench_suite's cache directory), so that all three are also compared with
no other framework in the process. Prints one JSON line: ``{case: median ms}``.

    python benchmarks/peer_alone.py --peer torch --cases dense,conv2d_s1 --repeat 9

``--suite models`` does the same for bench_models.py's whole-model training steps
(benchmarks/model_cases.py: ``resnet``, ``gpt2l``, ``gpt8l``), where the peers are
``torch`` (eager), ``torch_compile``, ``jax`` and ``texpr``.

    python benchmarks/peer_alone.py --suite models --peer torch_compile --cases gpt2l
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import texpr as te  # noqa: E402  (the IR only: the code generator stays unloaded)
from cases import (jax_value_and_grad, make_cases, median_ms, random_inputs,  # noqa: E402
                   torch_value_and_grad)


def models_alone(args):
    """``{model: median ms}`` of the peer's training step of each model of ``args.cases``."""
    from model_cases import MODELS, PEERS

    out = {}
    for n in [n for n in args.cases.split(",") if n] or list(MODELS):
        case = MODELS[n]()
        if args.peer == "texpr":
            from bench_models import texpr_step
            run = texpr_step(case)[1]
        else:
            run = PEERS[args.peer](case)
        run()
        out[n] = median_ms(run, args.repeat)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peer", choices=("jax", "torch", "torch_compile", "texpr"), required=True)
    ap.add_argument("--suite", choices=("ops", "models"), default="ops",
                    help="the gradient suite's operators (cases.py, the default) or the "
                         "example models' training steps (model_cases.py)")
    ap.add_argument("--cases", default="")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    if args.peer == "torch_compile" and args.suite != "models":
        ap.error("--peer torch_compile times the models only (--suite models)")
    if args.peer in ("torch", "torch_compile"):
        import torch
        torch.set_num_threads(args.threads)
    if args.peer == "texpr":
        import numba
        numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(args.threads)
    except ImportError:
        pass
    if args.suite == "models":
        out = models_alone(args)
        assert args.peer == "texpr" or "texpr.codegen" not in sys.modules
        print(json.dumps(out))
        return
    cases = make_cases(args.scale)
    names = [n for n in args.cases.split(",") if n] or list(cases)
    out = {}
    for n in names:
        case = cases[n]
        arrays = random_inputs(case)
        phs = [te.placeholder(shape, name, dtype) for name, shape, dtype, _ in case.inputs]
        head = np.random.default_rng(1).standard_normal(case.texpr(*phs).shape).astype("float32")
        if args.peer == "texpr":
            from bench_suite import texpr_value_and_grad
            run = texpr_value_and_grad(case, arrays, head)[2]
        else:
            run = (jax_value_and_grad if args.peer == "jax" else torch_value_and_grad)(
                case, arrays, head)
        run()
        out[n] = median_ms(run, args.repeat)
    assert args.peer == "texpr" or "texpr.codegen" not in sys.modules
    print(json.dumps(out))


if __name__ == "__main__":
    main()
