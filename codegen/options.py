"""Every tuning knob of codegen in one frozen object, :class:`Options`.

A build reads its knobs from the active Options (:func:`current`), never from
module constants::

    k = codegen.build([Y], [X, W], options={"blas_min_flop": 1 << 60})
    with codegen.options(unroll=4, chunks=False):    # nests; restored on exit
        k = codegen.build([Y], [X, W])

``build(..., options=)`` takes an Options (used as it is) or a dict (fields
replaced in the active Options). The active Options is a
:class:`contextvars.ContextVar`: a thread or an asyncio task sees the Options
of the context it runs in (a new thread: the defaults).

Two kinds of field (:data:`RUN_TIME`):

* **lowering** fields decide the program: the graph rewrites, which stages run
  as GEMMs or shift plans, the loop nests' order, parallelism, unrolling and
  text. Read while ``build`` runs.
* **run-time** fields (the ``gemm_*`` ones, ``park_blas``, ``chunk_runner``)
  decide how a built kernel runs. A kernel keeps the Options it was built with
  (``Kernel.options``) and runs under them, whatever is active at the call.

The fingerprint of the lowering fields (:meth:`Options.fingerprint`) is part
of the symbolic cache's key of a lowered program (:func:`codegen.build._lowered`):
a program lowered under other knobs is never loaded (one built with other
run-time fields is the same program, and is). Compiled units are keyed by
their text, which the lowering fields decide; no field changes the compiler's flags.

Not fields: facts and guards that are no tuning (the bounds of a checked
int64 index, ``analysis.bounds.DATA_INDEX_LIMIT``; OpenBLAS's threading
threshold, ``parking.THREADED_MNK``; the limits that keep LLVM's vectoriser
from exponential time, and the compile workers' settings: the loop-nest
backend's own).
"""

import contextlib
import contextvars
import dataclasses
import hashlib
import math
import numbers
import os

from texpr.errors import TexprError

__all__ = ["Options", "current", "options", "using", "RUN_TIME"]


def _park_default():
    return os.environ.get("TEXPR_PARK_BLAS", "1") != "0"


@dataclasses.dataclass(frozen=True)
class Options:
    """The tuning knobs of codegen (defaults: the tuned values). Frozen: make
    another with :meth:`replace`. docs/options.md says what each one does."""

    # ---- graph rewrites (codegen.rewrite), before lowering ----
    #: split a tap sum whose domain fills its box sparsely into dense pieces (rewrite.tap_split)
    tap_split: bool = True
    #: a loop nest's domain must fill at least this fraction of its box, else it is split
    tap_split_min_density: float = 0.5
    #: make window stages that several shifted readers share (rewrite.windows)
    windows: bool = True
    #: a window is made when at least this many stages read it
    window_min_readers: int = 2
    #: no window larger than this many bytes (its readers pack their im2col chunk by chunk in cache)
    window_max_bytes: int = 1 << 24
    #: split long reductions with few outputs into parallel partial sums (rewrite.split_reductions)
    split_reductions: bool = True
    #: slices of a split reduction axis (fixed: the result does not depend on the threads)
    split_reduction_parts: int = 16
    #: a reduction with more output points than this is parallel over its outputs already
    split_reduction_max_outputs: int = 8
    #: the fewest points (outputs x reduction box) a split stage has
    split_reduction_min_points: int = 1 << 19
    #: ... or at most this many output points where a load's layout puts the split axis
    #: outside an output axis and a reduction axis inside it (BatchNorm's sums over n, h, w:
    #: one output's pass reads short runs far apart; the slices' passes read along the rows)
    split_reduction_strided_outputs: int = 256

    # ---- GEMMs (codegen.analysis.contraction): which stages run on BLAS ----
    #: fewer floating-point operations than this: the loop nest runs (a GEMM costs ~45 us)
    blas_min_flop: int = 1 << 17
    #: a GEMM with an M, N or K below this is skinny: the loop nest runs
    blas_min_dim: int = 8
    #: the GEMMs may do at most 1/this times the domain's multiply-adds
    blas_min_efficiency: float = 0.25
    #: at most this many pieces (non-empty residue classes) per stage
    blas_max_pieces: int = 64
    #: at most this many residue classes are enumerated
    blas_max_classes: int = 1024
    #: at least this many multiply-adds per element pass of the data-dependent masks
    blas_mask_macs: int = 1
    #: a piece whose box holds more than 1/this times its domain's points tries taps
    blas_tap_efficiency: float = 0.5
    #: a zero-padded operand copy holds at most this many times what the GEMMs read
    blas_pad_max_ratio: int = 4
    #: zero-padded copies up to this many elements are always allowed
    blas_pad_min_elements: int = 1 << 20

    # ---- shift plans (codegen.analysis.shifts) ----
    #: window and tap-sum stages run as strided moves (False: their loop nests)
    shifts: bool = True
    #: at most this many tap combinations (moves) per plan
    shift_max_moves: int = 1024
    #: the lattice path evaluates the conjuncts at most this many times in all
    shift_lattice_budget: int = 1 << 15

    # ---- loop nests (codegen.loopnest: order, plan, stage, reduce, tree): order and parallelism
    #: stages visiting fewer points run sequentially
    parallel_min_points: int = 1 << 16
    #: ... and below this many points, those whose work is below parallel_min_work
    parallel_points: int = 1 << 19
    #: work (points x expression nodes) a stage below parallel_points needs to run in parallel
    parallel_min_work: int = 16_000_000
    #: a rest nest with fewer than this fraction of the stage's points runs sequentially
    rest_parallel_fraction: float = 0.125
    #: a parallel stage is a chunked serial unit where its nests allow (False: prange loops)
    chunks: bool = True
    #: a short contiguous loop may go innermost when no long one walks memory contiguously
    short_contiguous: bool = True
    #: the innermost loop is first one along which a data-dependent where does not vary
    condition_invariant: bool = True
    #: invariant loads score as unit-stride ones; the fewest far-strided tensors go innermost
    invariant_free: bool = True
    #: a stride (elements) up to which consecutive innermost iterations share cache lines
    near_stride: int = 4
    #: output tile (elements) below the reduction loops in buffer mode
    buffer_tile: int = 4096
    #: at most this many residue splits of one stage's domain
    max_residue_splits: int = 2

    # ---- loop nests: reductions ----
    #: reductions whose iteration box has fewer points are neither unrolled nor blocked
    unroll_min_points: int = 1 << 15
    #: partial sums in the innermost loop of a sum reduction (a power of two)
    unroll: int = 8
    #: larger summands (expression nodes) are not unrolled
    unroll_max_nodes: int = 64
    #: an unrolled sum's partial sums live across its outer reduction loops (set once
    #: per output element, added once at its end), not once per innermost loop
    partials_per_output: bool = True
    #: points of the innermost spatial axis blocked together in a sum (register blocking)
    jam: int = 4
    #: partial sums per blocked point of a register-blocked sum
    jam_unroll: int = 4
    #: the blocked axis may be a spatial axis other than the innermost (moved innermost)
    jam_move: bool = True
    #: a reduction loop this short, innermost in buffer mode, is unrolled inside the spatial loops
    max_lanes: int = 4
    #: a longer one (constant bounds) is unrolled by groups of this many values
    split_lanes: int = 16
    #: a vectorisable float sum's innermost loop is written once with _radd accumulators
    reassociate: bool = True
    #: ... where that loop runs at least this many times
    reassociate_min_trips: int = 128
    #: a float32 sum in registers adds in float64 and rounds once when it stores
    sum_float64: bool = True
    #: a data-dependent where over a check-free value is a select, not an if around it
    select_where: bool = True

    # ---- loop nests: values and text (stage, emit, cse) ----
    #: small check-free float selects compute both arms, then one select (no branch)
    speculate_selects: bool = True
    #: the most nodes the two arms of a speculated select have together
    speculate_max_nodes: int = 16
    #: loads with a provably affine row-major offset are addressed by that offset
    affine_offsets: bool = True
    #: a check-free subexpression of at most this many nodes stays inline in a large value
    inline_nodes: int = 16
    #: a statement whose values' tree has more nodes has its shared subexpressions bound once
    let_tree_nodes: int = 400
    #: the smallest shared subexpression (tree nodes) given a variable of its own
    let_min_nodes: int = 4
    #: a statement with more distinct nodes than this is left to the text's CSE
    let_max_dag_nodes: int = 2000
    #: a value's text nests at most this many parentheses (CPython's parser allows 200)
    text_max_height: int = 120
    #: repeated subexpressions of a statement are computed once (codegen.loopnest.cse)
    cse: bool = True
    #: the smallest subexpression (expression nodes) the CSE gives a temporary
    cse_min_nodes: int = 8
    #: the smallest conditional expression the CSE turns into an if statement
    cse_split_nodes: int = 100
    #: the smallest product (M * N * K) of a scan step worth a BLAS call (loopnest.scan_gemm)
    scan_gemm_min_macs: int = 4096

    # ---- run time (the kernel's own Options, see RUN_TIME) ----
    #: GEMM parts on worker threads (one-thread BLAS each); 1: the BLAS's own threads;
    #: 0: one part per backend thread
    gemm_threads: int = 0
    #: a GEMM (or packing copy) with fewer multiply-adds (elements) runs in one call
    gemm_split_min: int = 1 << 20
    #: how often the load average is read again (seconds)
    gemm_load_check_s: float = 1.0
    #: the cost of starting a run of a packing copy, in elements read (its layout)
    gemm_run_cost: float = 4.0
    #: packing copies above this many bytes are made in chunks (None: half the last-level cache)
    gemm_chunk_min_bytes: int = None  # (an int, or None)
    #: the size of a chunk's packing copy (bytes; a core's L2 cache)
    gemm_chunk_bytes: int = 1 << 21
    #: park the BLAS's worker threads after a kernel call (default: TEXPR_PARK_BLAS != 0)
    park_blas: bool = dataclasses.field(default_factory=_park_default)
    #: how a chunked unit's parts run: "openmp" (libgomp's team) or "threads"
    chunk_runner: str = "openmp"

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "gemm_chunk_min_bytes" and value is None:
                continue
            want = _TYPES[f.name]
            number = {int: numbers.Integral, float: numbers.Real}.get(want)
            if number is None:
                ok = isinstance(value, want)
            else:
                ok = isinstance(value, number) and not isinstance(value, bool)
            if not ok:
                raise TexprError(f"codegen Options: {f.name} must be {want.__name__}, "
                                 f"got {value!r}")
            if number is not None and type(value) is not want:
                # np.int64(8) and 8, 1 and 1.0: equal Options, so one fingerprint
                try:
                    object.__setattr__(self, f.name, want(value))
                except OverflowError:  # (an int beyond a float's range)
                    raise TexprError(f"codegen Options: {f.name} must be a finite "
                                     f"{want.__name__}, got {value!r}") from None
        for name, (lo, hi, what) in _RANGES.items():
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, float) and not math.isfinite(value) or not lo <= value <= hi:
                raise TexprError(f"codegen Options: {name} must be {what}, got {value!r}")
        if self.unroll & (self.unroll - 1):
            raise TexprError(f"codegen Options: unroll must be a power of two, got {self.unroll}")
        if self.chunk_runner not in ("openmp", "threads"):
            raise TexprError(f"codegen Options: chunk_runner must be 'openmp' or 'threads', "
                             f"got {self.chunk_runner!r}")

    def __reduce__(self):
        # every field by name, restored through the checks of a new Options (a
        # pickle's state would be set past them)
        return (_restore, (dict(vars(self)),))

    def replace(self, **fields):
        """Another Options with these fields replaced.

        Args:
            **fields: field names and their new values.
        Returns:
            Options.
        Raises:
            TexprError: a field that does not exist or a value of the wrong type or
            out of range.
        """
        unknown = sorted(set(fields) - _NAMES)
        if unknown:
            raise TexprError(f"codegen Options: no field {', '.join(unknown)} "
                             "(docs/options.md lists them)")
        return dataclasses.replace(self, **fields)

    def fingerprint(self, lowering_only=False):
        """A stable digest of the fields' names and values: equal Options give
        equal fingerprints in every process.

        Args:
            lowering_only: of the fields that decide the lowering alone (not
                :data:`RUN_TIME`): the part of the lowered program's cache key.
        Returns:
            str: 32 hex digits (sha256).
        """
        text = "\n".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                         if not (lowering_only and f.name in RUN_TIME))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]

    def changed(self):
        """The fields that differ from the defaults.

        Returns:
            dict: field name -> value.
        """
        base = Options()
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(base, f.name)}


_NAMES = frozenset(f.name for f in dataclasses.fields(Options))
_TYPES = {f.name: f.type for f in dataclasses.fields(Options)}

_INF = math.inf
#: the values a number field may take (a field not named: any int >= 0);
#: a count that divides or multiplies (parts, unroll, lanes, tiles) is >= 1
_RANGES = {f.name: (0, _INF, "an int >= 0") for f in dataclasses.fields(Options)
           if f.type is int}
_RANGES.update({name: (1, _INF, "an int >= 1") for name in (
    "window_min_readers", "split_reduction_parts", "blas_max_pieces", "blas_max_classes",
    "blas_pad_max_ratio", "shift_max_moves", "buffer_tile", "max_residue_splits", "unroll",
    "jam", "jam_unroll", "split_lanes", "text_max_height", "gemm_chunk_bytes")})
_RANGES.update({name: (0.0, 1.0, "a finite float in [0, 1]") for name in (
    "tap_split_min_density", "rest_parallel_fraction")})
_RANGES.update({name: (0.0, _INF, "a finite float >= 0") for name in (
    "blas_min_efficiency", "blas_tap_efficiency", "gemm_load_check_s", "gemm_run_cost")})

def _restore(fields):
    """The Options of a pickle (:meth:`Options.__reduce__`); a field that is gone
    or a value now out of range is a TexprError."""
    return Options().replace(**fields)


#: the fields that decide how a built kernel runs (read from ``Kernel.options``);
#: every other field decides the lowering
RUN_TIME = frozenset({"gemm_threads", "gemm_split_min", "gemm_load_check_s", "gemm_run_cost",
                      "gemm_chunk_min_bytes", "gemm_chunk_bytes", "park_blas", "chunk_runner"})

_CURRENT = contextvars.ContextVar("texpr_codegen_options")
_DEFAULT = []


def current():
    """The active :class:`Options` (the defaults unless a build's ``options=``,
    :func:`options` or :func:`using` set others in this context)."""
    got = _CURRENT.get(None)
    if got is not None:
        return got
    if not _DEFAULT:
        _DEFAULT.append(Options())
    return _DEFAULT[0]


def resolve(opts):
    """The Options ``opts`` stands for.

    Args:
        opts: an Options (as it is), a dict (its fields replaced in
            :func:`current`) or None (:func:`current`).
    Returns:
        Options.
    Raises:
        TexprError: anything else, an unknown field or a value of the wrong type
        or out of range.
    """
    if opts is None:
        return current()
    if isinstance(opts, Options):
        return opts
    if isinstance(opts, dict):
        return current().replace(**opts)
    raise TexprError(f"codegen options must be an Options or a dict of fields, "
                     f"got {type(opts).__name__}")


@contextlib.contextmanager
def using(opts):
    """A context manager: the block runs under ``opts``; the previous Options is
    active again on exit (also after an exception).

    Args:
        opts: an Options, or a dict of fields replaced in the active one.
    Returns:
        The context manager; it yields the Options now active.
    Raises:
        TexprError: as :func:`resolve`.
    """
    token = _CURRENT.set(resolve(opts))
    try:
        yield current()
    finally:
        _CURRENT.reset(token)


def options(**fields):
    """``with codegen.options(unroll=4): ...``: the block runs under the active
    Options with these fields replaced (blocks nest; restored on exit).

    Args:
        **fields: field names and values.
    Returns:
        The context manager; it yields the Options now active.
    Raises:
        TexprError: an unknown field or a value of the wrong type or out of range.
    """
    return using(current().replace(**fields))
