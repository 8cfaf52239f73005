"""How numba compiles one unit: its settings beyond the text, and the compile call.

One job: :func:`compile_with_flags` compiles a dispatcher for one signature
under the unit's settings (:func:`unit_flags`: LLVM's vectorisers, ``noalias``
parameters, the first module round at -O3), restored after, falling back to
numba's own settings when LLVM rejects its output. :data:`FLAGS_VERSION` names
these settings in every cache key
(:func:`codegen.backends.numba_cpu.compile.source_key`).
"""

import contextlib
import re
import warnings

import numba

__all__ = ["FLAGS_VERSION", "compile_with_flags", "unit_flags", "jit_codegen",
           "reset_block_labels"]


def _reset_block_labels():
    """Start numba's process-wide block-label counter again before a top-level
    compile. Inlining a function (the ``inline="always"`` helpers of every unit)
    offsets its block labels by the counter and raises the counter to the new
    largest label, so the counter roughly doubles per inlining: after a few
    hundred kernels in one process the labels have hundreds of digits and LLVM
    rejects the module ("name is too long"). Labels need only be unique within
    the function being compiled, which numba ensures from the function's own
    labels; called under numba's compiler lock, so no compile is in progress."""
    from numba.core import ir_utils
    counter = getattr(ir_utils, "_the_max_label", None)
    if counter is not None and hasattr(counter, "_value"):
        counter._value = 0


#: how units are compiled beyond their text (part of every cache key): numba's
#: noalias flag on a unit's parameters and the -O3 first module round (see
#: :func:`compile_with_flags`); a change here compiles every unit again
FLAGS_VERSION = "noalias+o3-cheap-1"
#: an unrolled partial sum of a generated reduction (``acc0_0_p0``)
_PARTIAL_SUM = re.compile(r"\bacc\d+_\d+_p0\b")


def _jit_codegen():
    """numba's CPU JIT code generator (its module optimisation settings), or None."""
    try:
        from numba.core.registry import cpu_target
        cg = cpu_target.target_context.codegen()
    except Exception:  # noqa: BLE001 - numba internals: without them, numba's defaults
        return None
    return cg if hasattr(cg, "_opt_level") and hasattr(cg, "_loopvect") else None


@contextlib.contextmanager
def _unit_flags(fn, source):
    """numba's settings while the unit ``fn`` (of text ``source``) compiles, all
    restored after (other numba users keep theirs; the caller holds numba's
    compiler lock):

    * LLVM's SLP vectoriser on (numba leaves it off; the unrolled partial sums of
      the generated reductions need it); the loop vectoriser where it pays
      (:mod:`codegen.backends.numba_cpu.vectorize`, a choice made from the text);
    * the unit's array parameters ``noalias`` (numba's flag, which it sets itself
      on a parfor's body): they are distinct buffers, each base buffer one
      parameter (:class:`codegen.loopnest.lower._UnitBuffers`), inputs never written,
      ``out=`` buffers checked not to overlap (:func:`codegen.build._check_out`);
    * the module's first ("cheap") optimisation round at -O3 with the loop
      vectoriser, as NUMBA_OPT=max does, except in a unit with unrolled partial
      sums. Measured 2026-12-02 (2 cores, in-process per-unit timings, loaded
      from the cache): max_pool2d's gradient unit 1.02 -> 0.21 ms and its argmax
      0.55 -> 0.42; the same argmax unit serial, one thread, 2.35 -> 0.69 (both
      settings are needed: either alone left it at 2.3-2.4); depthwise's dW unit,
      whose partial sums the early loop vectoriser mangled, 0.39 -> 0.98 without
      the exception. Compile time 5-15% more. It also ends a parallel unit's
      slowdown where it was compiled (see :data:`PARENT_COMPILES`);
    * the loop vectoriser off in both rounds for a unit with an inner loop that
      compares and does not depend on an enclosing loop
      (:func:`codegen.backends.numba_cpu.vectorize.invariant_comparison_loop`): LLVM's vectoriser
      takes exponential time on it.
    """
    from numba.core.cpu import CPUTargetOptions

    from .vectorize import invariant_comparison_loop, loop_vectorize_pays
    slp, lv = numba.config.SLP_VECTORIZE, numba.config.LOOP_VECTORIZE
    unit = "\ndef unit(" in source
    cg = _jit_codegen() if unit and not _PARTIAL_SUM.search(source) else None
    cheap = (cg._opt_level, cg._loopvect) if cg is not None else None

    def settle():
        # the text's analyses (Python AST walks, 5-10 ms a unit) and the settings
        # they give: run when numba compiles, not for a unit its cache loads
        never = invariant_comparison_loop(source)
        loops = loop_vectorize_pays(source) and not never
        numba.config.SLP_VECTORIZE, numba.config.LOOP_VECTORIZE = 1, int(loops)
        if cg is not None:
            cg._opt_level, cg._loopvect = 3, not never

    finalize = CPUTargetOptions.finalize
    if unit:
        mine = fn.targetoptions  # the dict numba's compiler of fn parses: fn alone

        def noalias(self, flags, options):
            # numba parses a function's options when it compiles it (never when
            # it loads it from its cache), before typing and LLVM
            finalize(self, flags, options)
            if options is mine:
                settle()
                flags.noalias = True
        CPUTargetOptions.finalize = noalias
    else:
        settle()
    try:
        yield
    finally:
        numba.config.SLP_VECTORIZE, numba.config.LOOP_VECTORIZE = slp, lv
        CPUTargetOptions.finalize = finalize
        if cg is not None:
            cg._opt_level, cg._loopvect = cheap


def compile_with_flags(fn, sig, source):
    """Compile the dispatcher ``fn`` (of text ``source``) for ``sig`` under the
    unit's settings (:func:`unit_flags`); the caller holds numba's compiler lock.
    Raises what numba raises when it rejects the code."""
    try:
        with _unit_flags(fn, source):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _reset_block_labels()
                fn.compile(sig)
    except RuntimeError:
        # LLVM rejected its own output under _unit_flags' passes ("Instruction
        # does not dominate all uses!" after the SLP vectoriser, fuzz seed
        # 7015000583 on 778bd5e): compiled again with numba's own settings,
        # which verify; a second failure is numba's and raises
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _reset_block_labels()
            fn.compile(sig)
    return fn


# (the names this module had inside compile.py)
unit_flags, jit_codegen, reset_block_labels = _unit_flags, _jit_codegen, _reset_block_labels
