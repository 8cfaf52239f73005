"""codegen.backends.numba_cpu.unit_files: one listing of __pycache__ shared by a build's units, and
checksum verdicts that never rest on a stale listing (issue 11: a warm build of
the main job beside 4,842 other programs' units spent 3.6 s in 121 globs)."""

import os
import time

import numpy as np
import pytest

import texpr as te
from texpr import codegen
from texpr.codegen.backends.numba_cpu import compile as codegen_compile
from texpr.codegen.backends.numba_cpu import unit_files


def _cache_dir(tmp_path):
    d = tmp_path / "c"
    pc = d / "__pycache__"
    pc.mkdir(parents=True)
    return str(d), str(pc)


def _age(path, seconds=3600):
    t = time.time() - seconds
    os.utime(path, (t, t))


def _write(path, data=b"x"):
    with open(path, "wb") as f:
        f.write(data)


@pytest.fixture
def scans(monkeypatch):
    """The number of directory listings unit_files takes."""
    count = [0]
    real = os.scandir

    def counting(path):
        count[0] += 1
        return real(path)
    monkeypatch.setattr(unit_files.os, "scandir", counting)
    unit_files._LISTINGS.clear()
    yield count
    unit_files._LISTINGS.clear()


def test_a_listing_is_shared_while_the_directory_is_unchanged(tmp_path, scans):
    d, pc = _cache_dir(tmp_path)
    for m in ("texpr_k_a", "texpr_k_b"):
        _write(os.path.join(pc, f"{m}.unit-36.py311.nbi"))
        _write(os.path.join(pc, f"{m}.unit-36.py311.1.nbc"))
    _write(os.path.join(pc, "texpr_k_ab.unit-36.py311.nbi"))  # a longer name, not a's
    _age(pc)
    a = unit_files.numba_files(d, "texpr_k_a")
    assert sorted(os.path.basename(p) for p in a) == [
        "texpr_k_a.unit-36.py311.1.nbc", "texpr_k_a.unit-36.py311.nbi"]
    assert len(unit_files.numba_files(d, "texpr_k_b")) == 2
    assert unit_files.numba_files(d, "texpr_k_c") == []
    assert scans[0] == 1
    # a file written since: the directory's time moved, the next question lists again
    _write(os.path.join(pc, "texpr_k_c.unit-36.py311.nbi"))
    assert len(unit_files.numba_files(d, "texpr_k_c")) == 1
    assert scans[0] == 2


def test_a_recently_changed_directory_is_listed_for_every_question(tmp_path, scans):
    # within LISTING_MARGIN_S of its last change a file may be written without
    # moving the directory's time (coarse timestamps): no listing is kept
    d, pc = _cache_dir(tmp_path)
    _write(os.path.join(pc, "texpr_k_a.unit-36.py311.nbi"))
    for _ in range(3):
        assert len(unit_files.numba_files(d, "texpr_k_a")) == 1
    assert scans[0] == 3


def _unit_with_record(d, pc, m):
    _write(os.path.join(pc, f"{m}.unit-36.py311.nbi"), b"index")
    _write(os.path.join(pc, f"{m}.unit-36.py311.1.nbc"), b"code")
    unit_files.record_files(d, m)
    assert os.path.exists(os.path.join(pc, f"{m}.sha256"))


def test_damage_is_found_through_a_shared_listing(tmp_path, scans):
    d, pc = _cache_dir(tmp_path)
    _unit_with_record(d, pc, "texpr_k_a")
    _age(pc)
    assert unit_files.files_state(d, "texpr_k_a") == "ok"
    # a flipped bit changes no directory entry: the shared listing is used, the
    # content is read afresh
    _write(os.path.join(pc, "texpr_k_a.unit-36.py311.1.nbc"), b"cOde")
    assert unit_files.files_state(d, "texpr_k_a") == "damaged"
    os.remove(os.path.join(pc, "texpr_k_a.sha256"))
    assert unit_files.files_state(d, "texpr_k_a") == "unrecorded"


def test_a_stale_listing_never_gives_a_damaged_verdict(tmp_path, scans):
    # another process adds a machine-code file and records it, and the directory's
    # time stays what it was (a file system with coarse timestamps): the shared
    # listing misses the file, so its sums differ from the record; the verdict
    # comes from a listing taken again, which finds the unit intact
    d, pc = _cache_dir(tmp_path)
    _unit_with_record(d, pc, "texpr_k_a")
    _age(pc)
    assert unit_files.files_state(d, "texpr_k_a") == "ok"
    old = os.stat(pc).st_mtime_ns
    _write(os.path.join(pc, "texpr_k_a.unit-36.py311.2.nbc"), b"more code")
    unit_files._LISTINGS.clear()
    unit_files.record_files(d, "texpr_k_a")
    assert len(open(os.path.join(pc, "texpr_k_a.sha256")).read().split("\n")) == 3
    os.utime(pc, ns=(old, old))
    # (the shared listing from before the new file)
    unit_files._LISTINGS[pc] = (old, {"texpr_k_a": [
        os.path.join(pc, "texpr_k_a.unit-36.py311.nbi"),
        os.path.join(pc, "texpr_k_a.unit-36.py311.1.nbc")]})
    assert unit_files.files_state(d, "texpr_k_a") == "ok"


def _files_behind_a_stale_listing(tmp_path, code):
    """A cache whose shared listing (taken while unit texpr_k_a had no files)
    still stands after its files were written: the directory's time set back,
    as a file system with coarse timestamps could leave it. (d, __pycache__)."""
    d, pc = _cache_dir(tmp_path)
    _age(pc)
    old = os.stat(pc).st_mtime_ns
    assert unit_files.numba_files(d, "texpr_k_a") == []
    _write(os.path.join(pc, "texpr_k_a.unit-36.py311.nbi"), b"index")
    _write(os.path.join(pc, "texpr_k_a.unit-36.py311.1.nbc"), code)
    os.utime(pc, ns=(old, old))
    return d, pc


def test_a_record_is_written_from_a_listing_taken_after_the_compile(tmp_path, scans):
    # the shared listing predates numba's files (same directory time): the record
    # still names every file, so the next process finds the unit intact
    d, pc = _files_behind_a_stale_listing(tmp_path, b"code")
    unit_files.record_files(d, "texpr_k_a")
    unit_files._LISTINGS.clear()
    assert unit_files.files_state(d, "texpr_k_a") == "ok"
    assert len(open(os.path.join(pc, "texpr_k_a.sha256")).read().split("\n")) == 2


def test_removal_uses_a_fresh_listing(tmp_path, scans):
    d, pc = _cache_dir(tmp_path)
    _unit_with_record(d, pc, "texpr_k_a")
    _age(pc)
    old = os.stat(pc).st_mtime_ns
    assert len(unit_files.numba_files(d, "texpr_k_a")) == 3
    _write(os.path.join(pc, "texpr_k_a.unit-36.py311.2.nbc"))
    os.utime(pc, ns=(old, old))
    assert unit_files.remove_numba_files(d, "texpr_k_a")
    assert [n for n in os.listdir(pc) if n.startswith("texpr_k_a.")] == []


def test_a_warm_build_lists_the_cache_once_per_directory_state(tmp_path, monkeypatch):
    # the same build in a new process's state (memory cache cleared) over a cache
    # whose __pycache__ has not changed for an hour: numba's files of every unit
    # come from one listing, and the kernel's values are the evaluator's
    monkeypatch.setenv("TEXPR_CACHE_DIR", str(tmp_path / "cache"))
    X = te.placeholder((6, 5), name="X")
    W = te.placeholder((5, 3), name="W")
    k = te.reduce_axis((0, 5), "k")
    Y = te.compute((6, 3), lambda i, j: te.sum(X[i, k] * W[k, j], axis=k), name="Y")
    i = te.reduce_axis((0, 6), "i")
    j = te.reduce_axis((0, 3), "j")
    L = te.compute((), lambda: te.sum(te.tanh(Y[i, j]), axis=[i, j]), name="L")
    (dW,) = te.differentiate(L, [W])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    w = rng.standard_normal((5, 3)).astype(np.float32)
    codegen.build([L, dW], [X, W], parallel=False, blas=False)
    pc = os.path.join(str(tmp_path / "cache"), "__pycache__")
    _age(pc)
    codegen.clear_memory_cache()
    unit_files._LISTINGS.clear()
    count = [0]
    real = os.scandir

    def counting(path):
        count[0] += os.path.realpath(path) == os.path.realpath(pc)
        return real(path)
    monkeypatch.setattr(unit_files.os, "scandir", counting)
    before = codegen_compile.stats()["from_disk"]
    kern = codegen.build([L, dW], [X, W], parallel=False, blas=False)
    assert codegen_compile.stats()["from_disk"] - before >= 2
    assert count[0] == 1
    got = kern(x, w)
    want = te.evaluate([L, dW], {X: x, W: w})
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def _state_within(d, m, seconds=20):
    """files_state(d, m), in a thread that must finish in ``seconds`` (a read that
    blocks would hang the test run otherwise)."""
    import threading
    out = []
    t = threading.Thread(target=lambda: out.append(unit_files.files_state(d, m)), daemon=True)
    t.start()
    t.join(seconds)
    assert out, "files_state did not return"
    return out[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_or_a_device_in_place_of_a_cache_file_is_damage(tmp_path, scans):
    # the attack of helper-24: a FIFO named like a machine-code file hung the build
    # in open(); a checksum record linked to /dev/zero read until memory ran out
    d, pc = _cache_dir(tmp_path)
    _unit_with_record(d, pc, "texpr_k_a")
    os.mkfifo(os.path.join(pc, "texpr_k_a.unit-36.py311.2.nbc"))
    assert _state_within(d, "texpr_k_a") == "damaged"
    _unit_with_record(d, pc, "texpr_k_b")
    os.remove(os.path.join(pc, "texpr_k_b.sha256"))
    os.symlink("/dev/zero", os.path.join(pc, "texpr_k_b.sha256"))
    assert _state_within(d, "texpr_k_b") == "damaged"
    # removal and a new record replace them
    assert unit_files.remove_numba_files(d, "texpr_k_a")
    assert not [n for n in os.listdir(pc) if n.startswith("texpr_k_a.")]


def test_no_files_in_a_shared_listing_is_checked_again(tmp_path, scans):
    # the shared listing was taken while the unit had no files; files appear with
    # no record and the directory's time is set back: they are unrecorded (rebuilt),
    # never "ok" (loaded unverified, then recorded as they are)
    d, _pc = _files_behind_a_stale_listing(tmp_path, b"someone else's code")
    assert unit_files.files_state(d, "texpr_k_a") == "unrecorded"


def test_numba_cache_dir_does_not_move_a_units_files(tmp_path, monkeypatch):
    # with NUMBA_CACHE_DIR set numba kept the units' machine code there, where no
    # checksum covered it: a replaced unit ran with wrong values and no warning
    # (helper-24). The units' files stay in texpr's __pycache__, checksummed
    import numba
    import warnings

    cache = tmp_path / "cache"
    monkeypatch.setenv("TEXPR_CACHE_DIR", str(cache))
    monkeypatch.setenv("TEXPR_COMPILE_WORKERS", "0")
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path / "numba"))
    X = te.placeholder((4, 3), name="X")
    Y = te.compute((4,), lambda i: X[i, 0] * 7.0 + X[i, 2], name="Y")
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    codegen.clear_memory_cache()
    try:
        first = codegen.build([Y], [X], parallel=False, blas=False)(x)[0]
        pc = cache / "__pycache__"
        nbc = sorted(p for p in os.listdir(pc) if p.startswith("texpr_k_")
                     and not p.startswith("texpr_k_rt") and p.endswith(".nbc"))
        assert nbc and any(p.endswith(".sha256") for p in os.listdir(pc))
        assert not [f for _, _, fs in os.walk(tmp_path / "numba") for f in fs]
        with open(pc / nbc[0], "r+b") as f:  # damage after the record
            data = bytearray(f.read())
            data[len(data) // 2] ^= 0xFF
            f.seek(0)
            f.write(data)
        codegen.clear_memory_cache()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            again = codegen.build([Y], [X], parallel=False, blas=False)(x)[0]
        assert [w for w in caught if issubclass(w.category, codegen.CacheWarning)]
        np.testing.assert_array_equal(again, first)
        np.testing.assert_array_equal(first, x[:, 0] * 7 + x[:, 2])
    finally:
        codegen.clear_memory_cache()


def test_a_c_callback_unit_loads_from_the_disk_cache(tmp_path, monkeypatch):
    # a chunked unit's trampoline (a cfunc, compiled or loaded while its module
    # runs) is cached beside its module like every unit, and loads from there in
    # a later build (helper-25: with cache=False in the executed text it was
    # compiled again in every process, 0.24-0.29 s against 0.01 s)
    from texpr.codegen.backends.numba_cpu import chunks

    monkeypatch.setenv("TEXPR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TEXPR_COMPILE_WORKERS", "0")
    src = chunks._trampoline_source(3)
    codegen.clear_memory_cache()
    try:
        first = codegen_compile.compile_source(src, [("int64", 1)], "trampoline", entry="body")
        assert not first.from_disk_cache
        names = os.listdir(tmp_path / "cache" / "__pycache__")
        mod = os.path.basename(first.path)[:-3]
        assert any(n.startswith(mod + ".") and n.endswith(".nbc") for n in names)
        assert unit_files.files_state(str(tmp_path / "cache"), mod) == "ok"
        codegen.clear_memory_cache()
        again = codegen_compile.compile_source(src, [("int64", 1)], "trampoline", entry="body")
        assert again.from_disk_cache and dict(again.fn.stats.cache_hits)
    finally:
        codegen.clear_memory_cache()


def test_a_relative_cache_dir_stays_the_one_it_was_at_a_chdir(tmp_path, monkeypatch):
    # modules loaded from a relative TEXPR_CACHE_DIR kept pointing at the working
    # directory's copy after a chdir (helper-25: a damaged helper there was read
    # without a check); the directory is absolute from the start
    from texpr import cache as texpr_cache

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    monkeypatch.setenv("TEXPR_CACHE_DIR", "kc")
    assert texpr_cache.cache_dir() == str(tmp_path / "a" / "kc")
    monkeypatch.chdir(tmp_path / "b")
    assert texpr_cache.cache_dir() == str(tmp_path / "b" / "kc")
    assert os.path.isabs(codegen_compile.cache_dir())
