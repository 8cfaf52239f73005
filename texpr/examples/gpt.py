"""Train a mini-GPT on Python's own standard library with texpr gradients.

Data (offline, no download): the ``.py`` sources of 16 long-lived modules of
the running Python's standard library (``argparse``, ``inspect``, ``subprocess``,
``tarfile``, ...: about 1 MB, present in Python 3.11, 3.12 and 3.13), and two
held-out modules (``difflib``, ``textwrap``: about 103 KB) for validation.
Characters are the tokens: the 64 most frequent characters of the training
text and one id for every other character, 65 in all
(:mod:`texpr.examples.gpt_data` lists the files and the rules).

Model: :class:`texpr.examples.gpt_model.GPT` -- a pre-LayerNorm decoder-only
transformer: token and position embeddings, ``--layers`` blocks of causal
self-attention (4 heads) and a 4x-wide GELU MLP, width 128, context 64
characters, an untied head and the mean cross-entropy over all positions.

Training: each step draws ``--batch`` windows of 65 characters at random
places in the training text (inputs the first 64, targets the next 64); one
compiled kernel (``codegen.build([loss] + te.differentiate(loss, weights))``)
gives the loss and every weight's gradient; AdamW, written out in numpy
(:class:`AdamW`), updates the weights, its learning rate warmed up linearly
over the first 5% of the steps, then cosine-decayed to a tenth.

Then it prints the validation loss in bits per character (over every
non-overlapping 65-character window of the held-out modules, through a
forward-only kernel), and the same figure for a bigram model (character pair
counts of the training text, add-one smoothing) on the same windows. The job
exits with status 1 if the transformer does not beat the bigram model. Last,
it continues a prompt with ``--sample-chars`` characters drawn from the
model (a batch-1 kernel; temperature sampling with a fixed seed).

What to expect from the defaults (1,500 steps of batch 16: 1.5 M characters,
about 1.5 passes over the text; Python 3.11, float32, seed 0; 2026-12-07 on a
2-core machine shared with other jobs, load average 4-6)::

    training loss (mean of the last 20 steps): 1.279 nats = 1.845 bits per character
    validation (1600 held-out windows of 65 characters): 2.603 bits per character
    bigram baseline on the same windows: 3.641 bits per character (beaten)
    time: 98.3 s (build and compile 16.9 s, training 76.6 s = 19.6 steps/s, ...)

The held-out modules are harder than the training text (other code, long
docstrings), so the validation loss sits well above the training loss. Other
Python versions read slightly different sources, and other BLAS builds round
differently: expect the validation loss within a few hundredths of 2.60. The
sample is recognisably Python-shaped (indentation, ``def``, ``self.``, ``try:``)
but not code; U+FFFD marks the "other" id.

Run ``python -m texpr.examples.gpt --help`` (or ``texpr-gpt --help``) for the flags.
"""

import argparse
import math
import sys
import time

import numpy as np

import texpr as te
from texpr.examples.gpt_data import (HELD_OUT_FILES, TRAIN_FILES, VOCAB, TextData,
                                     eval_windows, random_windows)
from texpr.examples.gpt_model import GPT

#: the prompt the sample continues (unless ``--prompt``)
PROMPT = "    def __init__(self, "


class AdamW:
    """AdamW (Loshchilov and Hutter, "Decoupled Weight Decay Regularization", 2019),
    as ``torch.optim.AdamW`` computes it, on a dict of numpy arrays.

    Per weight ``p`` with gradient ``g`` at step ``t`` (from 1)::

        m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
        p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + lr * wd * p

    The decay term applies to the weights ``decay(name, array)`` selects (by default
    those of two or more dimensions: dense layers and embeddings, not biases or
    LayerNorm gains, GPT-2's rule).

    Args:
        params: dict name -> numpy array (updated in place).
        betas, eps, weight_decay: the hyperparameters above.
        decay: ``decay(name, array) -> bool``.
    """

    def __init__(self, params, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, decay=None):
        self.params = params
        self.b1, self.b2 = betas
        self.eps, self.weight_decay = eps, weight_decay
        decay = decay or (lambda name, a: a.ndim >= 2)
        self.decayed = {n for n, a in params.items() if decay(n, a)}
        self.m = {n: np.zeros_like(a) for n, a in params.items()}
        self.v = {n: np.zeros_like(a) for n, a in params.items()}
        self.t = 0

    def step(self, grads, lr):
        """One update of every weight in place.

        Args:
            grads: dict name -> gradient (the params' names and shapes).
            lr: this step's learning rate.
        """
        self.t += 1
        c1, c2 = 1.0 - self.b1 ** self.t, 1.0 - self.b2 ** self.t
        for n, p in self.params.items():
            g = grads[n]
            m, v = self.m[n], self.v[n]
            m *= self.b1
            m += (1.0 - self.b1) * g
            v *= self.b2
            v += (1.0 - self.b2) * (g * g)
            if n in self.decayed:
                p -= (lr * self.weight_decay) * p
            p -= (lr / c1) * m / (np.sqrt(v / c2) + self.eps)


def learning_rate(step, steps, peak, warmup_fraction=0.05, floor=0.1):
    """The learning rate of ``step`` (0-based) of ``steps``: linear warm-up from
    ``peak / warmup`` to ``peak`` over the first ``warmup_fraction`` of the steps (at
    least one), then a cosine decay to ``floor * peak`` at the last step."""
    warmup = max(1, int(warmup_fraction * steps))
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - 1 - warmup)
    return peak * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))


class Bigram:
    """The bigram baseline: ``P(b | a) = (count(a, b) + 1) / (count(a) + V)``, the
    character-pair counts of a training text with add-one (Laplace) smoothing.

    Args:
        ids: the training text as ids in ``[0, vocab)``.
        vocab: V.
    """

    def __init__(self, ids, vocab):
        ids = np.asarray(ids)
        counts = np.zeros((vocab, vocab))
        np.add.at(counts, (ids[:-1], ids[1:]), 1.0)
        self.log2p = np.log2((counts + 1.0) / (counts.sum(axis=1, keepdims=True) + vocab))

    def bits_per_char(self, batches):
        """Mean ``-log2 P(target | previous character)`` over the targets of
        ``batches``, a list of ``(idx, targets)``: the previous character of
        ``targets[b, t]`` is ``idx[b, t]``."""
        total, n = 0.0, 0
        for idx, targets in batches:
            total -= float(self.log2p[idx, targets].sum())
            n += targets.size
        return total / n


def generate(next_logits, prompt_ids, n, seq, rng, temperature=0.8):
    """``n`` ids continuing ``prompt_ids``, each drawn from the model's next-character
    distribution.

    The context is the last ``seq`` ids so far (a sliding window). It sits at positions
    ``0 .. L-1`` of a ``(1, seq)`` input and the rest is padded with id 0; with causal
    attention the padding after position ``L - 1`` cannot change that position's
    logits, so the prediction is the one for the context alone, positions as in
    training (each training window also starts at position 0).

    Args:
        next_logits: ``next_logits(idx) -> logits`` for an int64 ``(1, seq)`` input,
            logits ``(seq, V)`` (row ``t``: the distribution of the id after position t).
        prompt_ids: the prompt's ids (at least one).
        n: how many ids to draw.
        seq: the model's context length.
        rng: a ``numpy.random.Generator``.
        temperature: logits are divided by it before the softmax; 0 takes the most
            likely id (greedy).
    Returns:
        int64 array of the ``n`` new ids.
    Raises:
        ValueError: an empty prompt or a negative temperature.
    """
    ids = [int(i) for i in prompt_ids]
    if not ids:
        raise ValueError("generate: the prompt must hold at least one character")
    if temperature < 0:
        raise ValueError(f"generate: temperature must be >= 0, got {temperature}")
    out = []
    for _ in range(n):
        ctx = ids[-seq:]
        x = np.zeros((1, seq), dtype=np.int64)
        x[0, :len(ctx)] = ctx
        z = np.asarray(next_logits(x), dtype=np.float64)[len(ctx) - 1]
        if temperature == 0:
            nxt = int(np.argmax(z))
        else:
            p = np.exp((z - z.max()) / temperature)
            nxt = int(rng.choice(len(p), p=p / p.sum()))
        ids.append(nxt)
        out.append(nxt)
    return np.array(out, dtype=np.int64)


def parse_args(argv=None):
    """Parse the command line (``argv``, default ``sys.argv[1:]``); exits with a usage
    message for bad values (argparse's ``error``)."""
    p = argparse.ArgumentParser(prog="texpr-gpt", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1500, help="training steps (default 1500)")
    p.add_argument("--batch", type=int, default=16, help="windows per step (default 16)")
    p.add_argument("--layers", type=int, default=2, help="transformer blocks (default 2)")
    p.add_argument("--lr", type=float, default=3e-3,
                   help="peak AdamW learning rate (default 3e-3; warm-up, then cosine decay)")
    p.add_argument("--weight-decay", type=float, default=0.1,
                   help="AdamW's decoupled weight decay of the matrices (default 0.1)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the initial weights, the windows and the sample (default 0)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                   help="the weights' and activations' dtype (default float32)")
    p.add_argument("--width", type=int, default=128, help="model width d (default 128)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    p.add_argument("--seq", type=int, default=64, help="context length T (default 64)")
    p.add_argument("--val-batches", type=int, default=0,
                   help="validate on at most this many batches of held-out windows "
                        "(default 0: all of them)")
    p.add_argument("--prompt", default=PROMPT, help=f"the sample's prompt (default {PROMPT!r})")
    p.add_argument("--sample-chars", type=int, default=300,
                   help="characters to generate after the prompt (default 300; 0: no sample)")
    p.add_argument("--temperature", type=float, default=0.8,
                   help="sampling temperature (default 0.8; 0: always the likeliest)")
    p.add_argument("--limit", type=int, default=0,
                   help="use only the first N characters of the training and of the "
                        "held-out text (quick runs)")
    args = p.parse_args(argv)
    for name in ("steps", "batch", "layers", "width", "heads", "seq"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.width % args.heads:
        p.error(f"--heads ({args.heads}) must divide --width ({args.width})")
    if not args.lr > 0:
        p.error(f"--lr must be > 0, got {args.lr}")
    if args.weight_decay < 0 or args.val_batches < 0 or args.sample_chars < 0:
        p.error("--weight-decay, --val-batches and --sample-chars must be >= 0")
    if args.temperature < 0:
        p.error(f"--temperature must be >= 0, got {args.temperature}")
    if args.limit and args.limit < 2 * args.batch * (args.seq + 1):
        p.error(f"--limit must be 0 (all the text) or at least 2 * batch * (seq + 1) = "
                f"{2 * args.batch * (args.seq + 1)}, got {args.limit}")
    if args.sample_chars and not args.prompt:
        p.error("--prompt must not be empty")
    return args


def train(args, out=sys.stdout):
    """Train with ``args`` (see :func:`parse_args`) and validate.

    Returns:
        dict: ``losses`` (the training loss of every step, nats), ``val_bits`` and
        ``bigram_bits`` (bits per character on the held-out windows), ``sample`` (the
        generated text), ``params`` (the trained weights), ``seconds`` (build, train).
    Raises:
        TextDataError: the standard-library sources are missing.
    """
    from texpr import codegen
    from tqdm import tqdm

    t_start = time.perf_counter()
    data = TextData.from_stdlib(limit=args.limit)
    part = f"the first {args.limit:,} characters of " if args.limit else ""
    print(f"text: {data.n_train_chars:,} training characters ({part}{len(TRAIN_FILES)} "
          f"standard-library modules), {data.n_val_chars:,} held out ({part}"
          f"{' and '.join(HELD_OUT_FILES)}); vocabulary {data.vocab.size} "
          f"({data.vocab.size - 1} characters + other)", file=out)
    print("building the model and its gradients, compiling the kernels with Numba "
          "(cached on disk: only the first run with these settings compiles) ...",
          file=out, flush=True)
    sizes = dict(seq=args.seq, vocab=VOCAB, d=args.width, heads=args.heads,
                 layers=args.layers, dtype=args.dtype)
    model = GPT(batch=args.batch, **sizes)
    names = list(model.weights)
    wts = [model.weights[n] for n in names]
    grads = te.differentiate(model.loss, wts).result
    step = codegen.build([model.loss] + list(grads), model.inputs_list())
    forward = codegen.build([model.loss], model.inputs_list())
    rng = np.random.default_rng(args.seed)
    params = model.init_weights(rng)
    opt = AdamW(params, weight_decay=args.weight_decay)
    t_built = time.perf_counter()

    tokens = args.batch * args.seq
    losses = []
    bar = tqdm(total=args.steps, desc="training", file=out, disable=None, unit="step")
    report = max(1, args.steps // 10)
    t0 = time.perf_counter()
    for s in range(args.steps):
        idx, targets = random_windows(data.train, args.batch, args.seq, rng)
        loss, *g = step(idx, targets, *[params[n] for n in names])
        opt.step(dict(zip(names, g)), learning_rate(s, args.steps, args.lr))
        losses.append(float(loss))
        rate = tokens * (s + 1) / (time.perf_counter() - t0)
        recent = float(np.mean(losses[-20:]))
        bar.set_postfix(loss=f"{recent:.3f}", tok_s=f"{rate:,.0f}", refresh=False)
        bar.update(1)
        if bar.disable and ((s + 1) % report == 0 or s + 1 == args.steps):
            print(f"step {s + 1}/{args.steps}: loss {recent:.3f} (mean of the last 20), "
                  f"{rate:,.0f} tokens/s", file=out, flush=True)
    bar.close()
    t_trained = time.perf_counter()
    recent = float(np.mean(losses[-20:]))
    print(f"training loss (mean of the last 20 steps): {recent:.3f} nats = "
          f"{recent / math.log(2):.3f} bits per character", file=out)

    val = eval_windows(data.val, args.batch, args.seq, args.val_batches)
    nats = float(np.mean([forward(i, t, *[params[n] for n in names])[0] for i, t in val]))
    val_bits = nats / math.log(2)
    bigram_bits = Bigram(data.train, VOCAB).bits_per_char(val)
    print(f"validation ({len(val) * args.batch} held-out windows of {args.seq + 1} "
          f"characters): {val_bits:.3f} bits per character", file=out)
    print(f"bigram baseline on the same windows: {bigram_bits:.3f} bits per character "
          f"({'beaten' if val_bits < bigram_bits else 'NOT beaten'})", file=out)

    sample = ""
    if args.sample_chars:
        one = GPT(batch=1, **sizes)
        logits = codegen.build([one.logits], [one.idx] + [one.weights[n] for n in names])
        ids = generate(lambda x: logits(x, *[params[n] for n in names])[0],
                       data.vocab.encode(args.prompt), args.sample_chars, args.seq,
                       np.random.default_rng(args.seed), args.temperature)
        sample = data.vocab.decode(ids)
        print(f"\nsample (temperature {args.temperature}, seed {args.seed}):\n"
              f"{args.prompt}{sample}\n", file=out)
    t_end = time.perf_counter()
    print(f"time: {t_end - t_start:.1f} s (build and compile {t_built - t_start:.1f} s, "
          f"training {t_trained - t_built:.1f} s = {args.steps / (t_trained - t_built):.1f} "
          f"steps/s, validation and sample {t_end - t_trained:.1f} s)", file=out)
    return {"losses": losses, "val_bits": val_bits, "bigram_bits": bigram_bits,
            "sample": sample, "params": params,
            "seconds": {"build": t_built - t_start, "train": t_trained - t_built}}


def main(argv=None):
    """Console entry point (``texpr-gpt``): 0 when the validation loss beats the bigram
    baseline, 1 when it does not."""
    args = parse_args(argv)
    result = train(args)
    if result["val_bits"] < result["bigram_bits"]:
        return 0
    print(f"texpr-gpt: the validation loss ({result['val_bits']:.3f} bits per character) does "
          f"not beat the bigram baseline ({result['bigram_bits']:.3f}): exit status 1",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
