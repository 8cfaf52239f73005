"""Build time: texpr cold and warm against JAX's first jit call, in one run (issue 11).

For every case of the gradient suite (benchmarks/cases.py) the same
value-and-grad -- the output and the gradients of ``sum(out * H)`` w.r.t.
every differentiated input, ``H`` a fixed head:

* **JAX first call**: ``jax.jit(jax.value_and_grad(f))`` called once, ``f =
  sum(case.jax(...) * H)``; in a fresh process per case, after a trivial jit
  call so that JAX's backend start-up is not counted (only tracing and XLA's
  compilation of this function are).
* **texpr cold**: ``te.differentiate`` + ``codegen.build`` + the kernel's first
  call (as JAX's first call runs too; a chunked unit's trampoline,
  :mod:`texpr.codegen.backends.numba_cpu.chunks`, is compiled or loaded there) in a fresh process
  per case with an empty cache directory (kernel and symbolic caches), so
  numba's first compile in a process (its target start-up, ~0.7 s on a quiet
  2-core machine) is counted, as a new user pays it. Reported beside it,
  "(numba)": the part numba took (``Kernel.compile_seconds``), and once for the
  run, numba's first-compile cost on its own (a trivial function in a fresh
  process).
* **texpr warm**: the same in a second fresh process with the same cache
  directory (symbolic results and machine code loaded from disk; "(numba)"
  is numba loading the machine code, its first load in a process included).

Imports (texpr, numba, JAX) are never counted. Then: the main job's build
phase (``python -m texpr.examples.digits --epochs 0``: "build and compile"
seconds it prints) with an empty cache and again warm; the two MLPs of issue
11 (te.nn layers: 64x20 -> 32 -> 5 and 128x256 -> 512 -> 64, tanh, cross
entropy, value and grads of every weight) cold; and a second MLP sharing a
layer shape with the first (64x20 -> 32 -> 7, same process and cache): its
build time and, when codegen reports them, the units compiled and reused
(:func:`unit_counts` is the hook: it reads ``Kernel.units_compiled`` /
``Kernel.units_reused`` when the kernel has them).

Command (OpenBLAS's core-type overrides of this machine's environment are
removed for the benchmark only)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_compile.py
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_compile.py \\
        --cases dense,cumsum --skip-main --skip-mlp        # a quick subset
    ... --json out.json                                    # also write the numbers
    ... --cases dense --skip-main --skip-mlp --no-jax --deep  # the deep models: CNN 2/4/8
                                                           # conv blocks, transformer 1/2

Timings drift with the machine's load: compare numbers from one run only.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


# ---- jobs run in fresh worker processes --------------------------------------------------


def _case(name, scale):
    sys.path.insert(0, HERE)
    from cases import make_cases

    return make_cases(scale)[name]


def job_texpr_case(name, scale):
    """Build one case's value-and-grad kernel; seconds of the phases."""
    import numpy as np

    from texpr import codegen, symcache

    case = _case(name, scale)
    from cases import value_and_grad_graph

    t0 = time.perf_counter()
    phs, h, out, grads = value_and_grad_graph(case)
    t1 = time.perf_counter()
    kernel = codegen.build([out] + grads, phs + [h])
    t2 = time.perf_counter()
    sys.path.insert(0, HERE)
    from cases import random_inputs

    arrays = random_inputs(case) + [np.zeros(out.shape, "float32")]
    t3 = time.perf_counter()
    kernel(*arrays)  # the first call: a chunked unit's trampoline is compiled or loaded here
    t4 = time.perf_counter()
    return dict(build_s=t2 - t0 + (t4 - t3), first_run_s=t4 - t3, differentiate_s=t1 - t0,
                compile_s=kernel.compile_seconds,
                from_disk=kernel.from_disk_cache, symbolic_hits=symcache.stats["hit"],
                units=unit_counts(kernel))


def job_jax_case(name, scale):
    """JAX's first call of jit(value_and_grad) of one case (backend already started)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.jit(lambda x: x + 1)(jnp.zeros(3)).block_until_ready()  # backend start-up
    case = _case(name, scale)
    sys.path.insert(0, HERE)
    from cases import random_inputs

    arrays = [jnp.asarray(a) for a in random_inputs(case)]
    diff = [k for k, (_, _, _, d) in enumerate(case.inputs) if d]
    out_shape = jax.eval_shape(case.jax, *arrays).shape
    head = jnp.asarray(np.random.default_rng(1).standard_normal(out_shape).astype("float32"))

    def f(*args):
        return jnp.sum(case.jax(*args) * head)

    t0 = time.perf_counter()
    vg = jax.jit(jax.value_and_grad(f, argnums=tuple(diff)))
    jax.block_until_ready(vg(*arrays))
    return dict(first_call_s=time.perf_counter() - t0)


def job_numba_first():
    """numba's first compile in a process (after ``import numba``)."""
    import numba

    t0 = time.perf_counter()

    @numba.njit(cache=False)
    def f(x):
        s = 0.0
        for i in range(x.shape[0]):
            s += x[i]
        return s

    import numpy as np

    f(np.zeros(3))
    t1 = time.perf_counter()

    @numba.njit(cache=False)
    def g(x):
        s = 1.0
        for i in range(x.shape[0]):
            s *= x[i]
        return s

    g(np.zeros(3))
    return dict(first_s=t1 - t0, second_s=time.perf_counter() - t1)


def _mlp(te, batch, sizes, name=""):
    nn = te.nn
    X = te.placeholder((batch, sizes[0]), "X")
    labels = te.placeholder((batch,), "labels", "int64")
    weights, h = [], X
    for k, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        W = te.placeholder((b, a), f"W{k}")
        bias = te.placeholder((b,), f"b{k}")
        weights += [W, bias]
        h = nn.dense(h, W, bias)
        if k < len(sizes) - 2:
            h = nn.tanh(h)
    loss = nn.cross_entropy(h, labels)
    return loss, [X, labels] + weights, weights


def job_mlps(specs):
    """Build each MLP of ``specs`` (list of ``[batch, sizes]``) in turn in this
    process; seconds and unit counts of each."""
    import texpr as te
    from texpr import codegen

    rows = []
    for batch, sizes in specs:
        t0 = time.perf_counter()
        loss, inputs, weights = _mlp(te, batch, sizes)
        grads = list(te.differentiate(loss, weights).result)
        kernel = codegen.build([loss] + grads, inputs)
        rows.append(dict(build_s=time.perf_counter() - t0, compile_s=kernel.compile_seconds,
                         units=unit_counts(kernel)))
    return rows


def _cnn(te, blocks, batch=16, channels=16, size=32):
    """``blocks`` conv blocks (3x3 conv, padding 1, bias, relu; a 2x2 max pool after
    every second block while the image is larger than 4x4), global average
    pool, a dense layer to 10 classes, cross entropy. Returns (loss, inputs,
    weights)."""
    nn = te.nn
    X = te.placeholder((batch, 3, size, size), "X")
    labels = te.placeholder((batch,), "labels", "int64")
    weights, h, cin, hw = [], X, 3, size
    for k in range(blocks):
        W = te.placeholder((channels, cin, 3, 3), f"conv{k}_w")
        b = te.placeholder((channels,), f"conv{k}_b")
        weights += [W, b]
        h = nn.relu(nn.conv2d(h, W, b, padding=1, name=f"conv{k}"), name=f"relu{k}")
        cin = channels
        if k % 2 == 1 and hw > 4:
            h = nn.max_pool2d(h, 2, name=f"pool{k}")
            hw //= 2
    h = nn.flatten(nn.global_avg_pool2d(h))
    W = te.placeholder((10, channels), "fc_w")
    weights.append(W)
    loss = nn.cross_entropy(nn.dense(h, W, name="fc"), labels)
    return loss, [X, labels] + weights, weights


def _transformer(te, blocks, batch=8, seq=32, dim=64, heads=2, hidden=128):
    """``blocks`` pre-norm transformer encoder blocks of te.nn layers (layer norm,
    Q/K/V projections, ``heads``-head scaled dot-product attention with softmax,
    output projection, residual; layer norm, dense-gelu-dense MLP, residual),
    then a dense layer on the mean over positions to 10 classes, cross
    entropy. Returns (loss, inputs, weights)."""
    nn = te.nn
    dh = dim // heads
    X = te.placeholder((batch * seq, dim), "X")
    labels = te.placeholder((batch,), "labels", "int64")
    weights, h = [], X

    def param(shape, name):
        t = te.placeholder(shape, name)
        weights.append(t)
        return t

    def split_heads(t, name):  # (B*T, D) -> (B*H, T, dh)
        t = nn.reshape(t, (batch, seq, heads, dh), name=f"{name}_r")
        t = nn.transpose(t, (0, 2, 1, 3), name=f"{name}_t")
        return nn.reshape(t, (batch * heads, seq, dh), name=f"{name}_h")

    for k in range(blocks):
        p = f"b{k}_"
        a = nn.layer_norm(h, dim, param((dim,), p + "ln1_w"), param((dim,), p + "ln1_b"),
                          name=p + "ln1")
        q, kk, v = (split_heads(nn.dense(a, param((dim, dim), p + f"w{c}"), name=p + c), p + c)
                    for c in "qkv")
        scores = nn.batch_matmul(q, kk, transpose_b=True, name=p + "scores")
        scale = te.compute(scores.shape, lambda i, j, l: scores[i, j, l] * (1.0 / dh ** 0.5),
                           name=p + "scaled")
        att = nn.batch_matmul(nn.softmax(scale, name=p + "softmax"), v, name=p + "att")
        att = nn.reshape(nn.transpose(nn.reshape(att, (batch, heads, seq, dh), name=p + "ar"),
                                      (0, 2, 1, 3), name=p + "at"),
                         (batch * seq, dim), name=p + "am")
        o = nn.dense(att, param((dim, dim), p + "wo"), name=p + "o")
        h = te.compute(h.shape, lambda i, j, h=h, o=o: h[i, j] + o[i, j], name=p + "res1")
        m = nn.layer_norm(h, dim, param((dim,), p + "ln2_w"), param((dim,), p + "ln2_b"),
                          name=p + "ln2")
        m = nn.gelu(nn.dense(m, param((hidden, dim), p + "w1"), param((hidden,), p + "b1"),
                             name=p + "fc1"), name=p + "gelu")
        m = nn.dense(m, param((dim, hidden), p + "w2"), name=p + "fc2")
        h = te.compute(h.shape, lambda i, j, h=h, m=m: h[i, j] + m[i, j], name=p + "res2")
    t = te.reduce_axis(seq, "t")
    pooled = te.compute((batch, dim), lambda b, j: te.sum(h[b * seq + t, j], axis=t) / seq,
                        name="pooled")
    loss = nn.cross_entropy(nn.dense(pooled, param((10, dim), "head_w"), name="head"), labels)
    return loss, [X, labels] + weights, weights


def job_deep(kind, depth):
    """Build one deep model's loss-and-gradients kernel (``kind`` "cnn" or
    "transformer", ``depth`` blocks) in this process with an empty cache:
    seconds, numba's part, units, and peak resident memory (MB) of this
    process and of its compile workers (the largest one)."""
    import resource

    import texpr as te
    from texpr import codegen

    t0 = time.perf_counter()
    build = _cnn if kind == "cnn" else _transformer
    loss, inputs, weights = build(te, depth)
    grads = list(te.differentiate(loss, weights).result)
    kernel = codegen.build([loss] + grads, inputs)
    t1 = time.perf_counter()
    from texpr.codegen.backends.numba_cpu import compile as cc
    cc._shutdown_pool()  # the compile workers end: their peak counts in RUSAGE_CHILDREN
    mb = lambda who: resource.getrusage(who).ru_maxrss / 1024  # noqa: E731 - KB on Linux
    return dict(build_s=t1 - t0, compile_s=kernel.compile_seconds, units=unit_counts(kernel),
                stages=len(kernel.units), peak_mb=mb(resource.RUSAGE_SELF),
                worker_peak_mb=mb(resource.RUSAGE_CHILDREN))


def unit_counts(kernel):
    """``(compiled, reused)`` units of a kernel when codegen reports them (the
    per-stage compiled units of issue 11: ``Kernel.units_compiled`` and
    ``Kernel.units_reused``, ints or lists), else None."""
    got = []
    for attr in ("units_compiled", "units_reused"):
        v = getattr(kernel, attr, None)
        if v is None:
            return None
        got.append(v if isinstance(v, int) else len(v))
    return tuple(got)


JOBS = {"texpr_case": job_texpr_case, "jax_case": job_jax_case,
        "numba_first": job_numba_first, "mlps": job_mlps, "deep": job_deep}


# ---- the driver ---------------------------------------------------------------------------


def _run(job, args, cache, timeout=3600):
    """Run ``job(*args)`` in a fresh process with TEXPR_CACHE_DIR=cache; its result dict."""
    env = dict(os.environ, TEXPR_CACHE_DIR=cache, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps([job, args])]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"worker {job}{tuple(args)} failed:\n{p.stderr[-3000:]}")


def _fresh_dir(base, tag):
    d = os.path.join(base, tag)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def _main_job(cache):
    """The main job's "build and compile" seconds (it prints them)."""
    env = dict(os.environ, TEXPR_CACHE_DIR=cache)
    cmd = [sys.executable, "-m", "texpr.examples.digits", "--epochs", "0"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    m = re.search(r"build and compile ([0-9.]+) s", p.stdout)
    if not m:
        raise RuntimeError(f"the main job failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return float(m.group(1))


def _fmt(x, w=8, p=2):
    return f"{x:{w}.{p}f}" if isinstance(x, (int, float)) else f"{'-':>{w}s}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--scale", type=float, default=1.0, help="batch scale (1 = SUITE sizes)")
    ap.add_argument("--skip-main", action="store_true", help="skip the main job")
    ap.add_argument("--skip-mlp", action="store_true", help="skip the MLPs")
    ap.add_argument("--no-jax", action="store_true")
    ap.add_argument("--deep", action="store_true",
                    help="also the CNN at 2/4/8 conv blocks and the transformer at 1/2 blocks")
    ap.add_argument("--json", default="", help="also write the results to this file")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        job, job_args = json.loads(args.worker)
        print("RESULT " + json.dumps(JOBS[job](*job_args)), flush=True)
        return

    sys.path.insert(0, HERE)
    from cases import make_cases

    names = [n for n in args.cases.split(",") if n] or list(make_cases(args.scale))
    base = tempfile.mkdtemp(prefix="texpr_bench_compile_")
    results = {"cases": {}, "scale": args.scale}
    nb = _run("numba_first", [], _fresh_dir(base, "numba"))
    results["numba_first"] = nb
    print(f"numba alone, fresh process: first compile {nb['first_s']:.2f} s, "
          f"second {nb['second_s']:.2f} s\n", flush=True)
    print(f"{'case':22s} {'jax 1st':>8s} {'cold':>8s} {'(numba)':>8s} {'warm':>8s} "
          f"{'(numba)':>8s} {'cold/jax':>9s} {'warm/jax':>9s}", flush=True)
    for n in names:
        row = {}
        if not args.no_jax:
            row["jax_first_s"] = _run("jax_case", [n, args.scale], base)["first_call_s"]
        cache = _fresh_dir(base, f"case_{n}")
        cold = _run("texpr_case", [n, args.scale], cache)
        warm = _run("texpr_case", [n, args.scale], cache)
        row.update(cold_s=cold["build_s"], cold_compile_s=cold["compile_s"],
                   warm_s=warm["build_s"], warm_compile_s=warm["compile_s"],
                   warm_from_disk=warm["from_disk"],
                   warm_symbolic_hits=warm["symbolic_hits"])
        results["cases"][n] = row
        j = row.get("jax_first_s")
        print(f"{n:22s} {_fmt(j)} {_fmt(row['cold_s'])} {_fmt(row['cold_compile_s'])} "
              f"{_fmt(row['warm_s'])} {_fmt(row['warm_compile_s'])} "
              f"{_fmt(row['cold_s'] / j if j else None, 9, 1)} "
              f"{_fmt(row['warm_s'] / j if j else None, 9, 2)}", flush=True)
    rows = results["cases"].values()
    sj = sum(r.get("jax_first_s", 0.0) for r in rows)
    sc = sum(r["cold_s"] for r in rows)
    sn = sum(r["cold_compile_s"] for r in rows)
    sw = sum(r["warm_s"] for r in rows)
    swn = sum(r["warm_compile_s"] for r in rows)
    print(f"{'sum':22s} {_fmt(sj) if sj else _fmt(None)} {_fmt(sc)} {_fmt(sn)} {_fmt(sw)} "
          f"{_fmt(swn)} "
          f"{_fmt(sc / sj if sj else None, 9, 1)} {_fmt(sw / sj if sj else None, 9, 2)}",
          flush=True)
    results["sums"] = dict(jax_first_s=sj, cold_s=sc, cold_compile_s=sn, warm_s=sw,
                           warm_compile_s=swn)

    if not args.skip_main:
        cache = _fresh_dir(base, "main")
        cold = _main_job(cache)
        warm = _main_job(cache)
        results["main_job"] = dict(cold_build_s=cold, warm_build_s=warm)
        print(f"\nmain job (python -m texpr.examples.digits): build and compile cold "
              f"{cold:.1f} s, warm {warm:.2f} s", flush=True)
    if not args.skip_mlp:
        small, big, sibling = [64, [20, 32, 5]], [128, [256, 512, 64]], [64, [20, 32, 7]]
        (r_small,) = _run("mlps", [[small]], _fresh_dir(base, "mlp_small"))
        (r_big,) = _run("mlps", [[big]], _fresh_dir(base, "mlp_big"))
        r_first, r_second = _run("mlps", [[small, sibling]], _fresh_dir(base, "mlp_pair"))
        results["mlps"] = dict(small=r_small, big=r_big, pair=[r_first, r_second])
        print(f"\nMLP 64x20 -> 32 -> 5, cold: {r_small['build_s']:.1f} s "
              f"(numba {r_small['compile_s']:.1f} s)")
        print(f"MLP 128x256 -> 512 -> 64, cold: {r_big['build_s']:.1f} s "
              f"(numba {r_big['compile_s']:.1f} s)")
        units = r_second["units"]
        units_txt = (f"units compiled {units[0]}, reused {units[1]}" if units else
                     "units compiled/reused: not reported by this codegen (hook: "
                     "bench_compile.unit_counts reads Kernel.units_compiled/units_reused)")
        print(f"second MLP 64x20 -> 32 -> 7 after the first (same process and cache): "
              f"{r_second['build_s']:.1f} s; {units_txt}", flush=True)
    if args.deep:
        results["deep"] = {}
        print("\ndeep models, cold (fresh process, empty cache): build s (numba s), units, "
              "peak MB of the process / of its largest compile worker", flush=True)
        for kind, depths in (("cnn", (2, 4, 8)), ("transformer", (1, 2))):
            for depth in depths:
                r = _run("deep", [kind, depth], _fresh_dir(base, f"{kind}{depth}"))
                results["deep"][f"{kind}{depth}"] = r
                units = r["units"]
                print(f"{kind} {depth} blocks: {r['build_s']:.1f} s ({r['compile_s']:.1f} s), "
                      f"{r['stages']} units"
                      + (f" ({units[0]} compiled, {units[1]} reused)" if units else "")
                      + f", peak {r['peak_mb']:.0f} MB / {r['worker_peak_mb']:.0f} MB", flush=True)
    shutil.rmtree(base, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
