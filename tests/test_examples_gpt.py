"""The GPT main job (texpr.examples.gpt): its text, its baseline, its sampler, its
optimiser, and a few training steps of a tiny model whose loss falls."""

import io
import math
import os

import numpy as np
import pytest

from texpr.errors import TexprError
from texpr.examples import gpt, gpt_data
from texpr.examples.gpt_data import TextData, TextDataError, Vocabulary


def test_the_stdlib_selection_exists_and_gives_the_documented_text():
    data = TextData.from_stdlib()
    # about 1 MB of training text, about 100 KB held out (3.11-3.13 differ a little)
    assert 0.95e6 < data.n_train_chars < 1.15e6
    assert 0.09e6 < data.n_val_chars < 0.12e6
    assert data.vocab.size == gpt_data.VOCAB == 65 and len(data.vocab.chars) == 64
    assert data.train.dtype == np.int64 and len(data.train) == data.n_train_chars
    assert data.train.min() >= 0 and data.val.max() <= gpt_data.OTHER
    # the 64 characters cover nearly all of both texts
    assert (data.train == gpt_data.OTHER).mean() < 0.01
    assert (data.val == gpt_data.OTHER).mean() < 0.02
    # the held-out modules are whole files the training text does not contain
    assert not set(gpt_data.HELD_OUT_FILES) & set(gpt_data.TRAIN_FILES)
    # ids decode to the held-out files' text, characters outside the 64 as U+FFFD
    text = gpt_data.read_files(gpt_data.HELD_OUT_FILES)
    keep = set(data.vocab.chars)
    assert data.vocab.decode(data.val[:2000]) == "".join(
        c if c in keep else "\ufffd" for c in text[:2000])


def test_missing_sources_are_named(tmp_path):
    (tmp_path / "argparse.py").write_text("x = 1\n")
    with pytest.raises(TextDataError, match=r"inspect\.py, subprocess\.py.*not in") as e:
        TextData.from_stdlib(root=str(tmp_path))
    assert "argparse.py," not in str(e.value)
    assert isinstance(e.value, TexprError)


def test_vocabulary_most_frequent_characters_and_other():
    v = Vocabulary("ccbbaa\nd", size=4)  # a, b, c tie at 2: code point order
    assert v.chars == ["a", "b", "c"] and v.other == 3
    assert v.encode("abcd\n\u00e9a").tolist() == [0, 1, 2, 3, 3, 3, 0]
    assert v.decode([2, 0, 3]) == "ca\ufffd"
    v = Vocabulary("\u00e9\u00e9\u00e9x", size=3)  # a non-ASCII character can be in it
    assert v.encode("x\u00e9y").tolist() == [1, 0, 2]
    with pytest.raises(TextDataError, match="at least 2"):
        Vocabulary("ab", size=1)


def test_text_data_split_and_windows():
    data = TextData("abcabcabcx", "cab", vocab_size=4)
    assert data.vocab.chars == ["a", "b", "c"]
    assert data.train.tolist() == [0, 1, 2] * 3 + [3] and data.val.tolist() == [2, 0, 1]
    ids = np.arange(100)
    idx, tg = gpt_data.random_windows(ids, 5, 7, np.random.default_rng(0))
    assert idx.shape == tg.shape == (5, 7)
    assert np.array_equal(tg[:, :-1], idx[:, 1:])
    assert np.array_equal(np.diff(idx, axis=1), np.ones((5, 6)))  # consecutive characters
    assert (tg[:, -1] <= 99).all()
    with pytest.raises(TextDataError, match="no window of 101"):
        gpt_data.random_windows(ids, 2, 100, np.random.default_rng(0))
    # held-out windows: non-overlapping, every character after the first a target once
    batches = gpt_data.eval_windows(np.arange(30), 2, 4)
    assert len(batches) == 3  # 7 windows of 5, whole batches of 2
    targets = np.concatenate([t.ravel() for _, t in batches])
    assert targets.tolist() == list(range(1, 25))
    assert batches[0][0].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(gpt_data.eval_windows(np.arange(30), 2, 4, max_batches=2)) == 2
    with pytest.raises(TextDataError, match="fewer than one batch"):
        gpt_data.eval_windows(np.arange(8), 2, 4)


def test_bigram_baseline_known_answer():
    # pairs of "ababa": a->b twice, b->a twice; V = 3 (a, b, other)
    b = gpt.Bigram([0, 1, 0, 1, 0], 3)
    # P(b|a) = (2 + 1) / (2 + 3), P(a|a) = 1/5, P(other|b) = 1/5
    idx = np.array([[0, 0, 1]])
    tg = np.array([[1, 0, 2]])
    want = -(math.log2(3 / 5) + math.log2(1 / 5) + math.log2(1 / 5)) / 3
    assert b.bits_per_char([(idx, tg)]) == pytest.approx(want, rel=1e-12)
    # an unseen context: uniform over V
    assert gpt.Bigram([0, 1], 3).bits_per_char([(np.array([[2]]), np.array([[0]]))]) == \
        pytest.approx(math.log2(3))


def test_generate_reads_the_context_position_and_slides():
    seen = []

    def next_logits(x):  # a "model" that predicts (id + 1) % 7 after each position
        seen.append(x.copy())
        z = np.full((x.shape[1], 7), -50.0)
        z[np.arange(x.shape[1]), (x[0] + 1) % 7] = 50.0
        return z

    out = gpt.generate(next_logits, [3], 5, 4, np.random.default_rng(0), temperature=0)
    assert out.tolist() == [4, 5, 6, 0, 1]
    assert seen[0].tolist() == [[3, 0, 0, 0]]  # the context at positions 0.., padding after
    assert seen[3].tolist() == [[3, 4, 5, 6]]
    assert seen[4].tolist() == [[4, 5, 6, 0]]  # the last 4 ids once the text is longer
    # temperature sampling: the same seed draws the same ids
    a = gpt.generate(next_logits, [1, 2], 6, 4, np.random.default_rng(3), temperature=0.8)
    b = gpt.generate(next_logits, [1, 2], 6, 4, np.random.default_rng(3), temperature=0.8)
    assert a.tolist() == b.tolist() == [3, 4, 5, 6, 0, 1]
    with pytest.raises(ValueError, match="at least one"):
        gpt.generate(next_logits, [], 3, 4, np.random.default_rng(0))


def test_adamw_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(4)}
    tp = {n: torch.tensor(v.copy(), requires_grad=True) for n, v in params.items()}
    topt = torch.optim.AdamW([{"params": [tp["w"]], "weight_decay": 0.1},
                              {"params": [tp["b"]], "weight_decay": 0.0}],
                             lr=0.01, betas=(0.9, 0.99), eps=1e-8)
    opt = gpt.AdamW(params, weight_decay=0.1)
    for k in range(4):
        g = {n: rng.standard_normal(v.shape) for n, v in params.items()}
        lr = 0.01 * (k + 1) / 4
        for group in topt.param_groups:
            group["lr"] = lr
        for n, t in tp.items():
            t.grad = torch.tensor(g[n])
        topt.step()
        opt.step(g, lr)
    for n in params:
        np.testing.assert_allclose(params[n], tp[n].detach().numpy(), rtol=1e-12, atol=1e-14)


def test_learning_rate_schedule():
    lrs = [gpt.learning_rate(s, 100, 1.0) for s in range(100)]
    assert lrs[0] == pytest.approx(0.2) and lrs[4] == pytest.approx(1.0)
    assert lrs[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:]))


def test_bad_flags_exit_with_usage():
    for argv in (["--steps", "0"], ["--width", "30", "--heads", "4"], ["--lr", "0"],
                 ["--limit", "100"], ["--temperature", "-1"], ["--dtype", "float16"]):
        with pytest.raises(SystemExit):
            gpt.parse_args(argv)


def test_main_exit_code_says_whether_the_bigram_is_beaten(monkeypatch):
    for val, code in ((2.0, 0), (3.5, 1)):
        monkeypatch.setattr(gpt, "train", lambda args, v=val: {"val_bits": v, "bigram_bits": 3.0})
        assert gpt.main(["--steps", "1"]) == code


def test_a_tiny_model_trains_and_its_loss_falls():
    out = io.StringIO()
    args = gpt.parse_args(["--steps", "40", "--batch", "4", "--layers", "1", "--width", "16",
                           "--heads", "2", "--seq", "16", "--limit", "20000",
                           "--val-batches", "4", "--sample-chars", "8", "--lr", "1e-2"])
    res = gpt.train(args, out=out)
    losses = res["losses"]
    assert len(losses) == 40 and all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5
    text = out.getvalue()
    assert "bits per character" in text and "bigram baseline" in text
    assert np.isfinite(res["val_bits"]) and res["bigram_bits"] > 0
    assert len(res["sample"]) == 8 and gpt.PROMPT in text
