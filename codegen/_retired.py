"""The module constants codegen's tuning knobs were before :class:`codegen.options.Options`
(``texpr.codegen.loopnest.stage.UNROLL``, ...): setting one is a TexprError.

One job: the knobs are Options fields now and no code reads the constants, so
``stage.UNROLL = 1`` would be silently accepted and change nothing. Each module
that had them gets a module class whose ``__setattr__`` refuses those names
with the field to use instead (reading one is an AttributeError saying the
same); every other attribute is set as usual.
"""

import types

from texpr.errors import TexprError

from .analysis import contraction, shifts
from .backends import registered
from .loopnest import cse, emit, scan_gemm, stage
from .options import Options
from .rewrite import split_reductions, tap_split, windows

__all__ = ["RETIRED", "install"]

_STAGE = ("REST_PARALLEL_FRACTION INLINE_NODES SHORT_CONTIGUOUS CONDITION_INVARIANT "
          "SPECULATE_SELECTS SPECULATE_MAX_NODES SUM_FLOAT64 SELECT_WHERE BUFFER_TILE "
          "PARALLEL_MIN_POINTS PARALLEL_POINTS PARALLEL_MIN_WORK CHUNKS UNROLL_MIN_POINTS UNROLL "
          "JAM JAM_UNROLL JAM_MOVE MAX_LANES SPLIT_LANES MAX_RESIDUE_SPLITS REASSOCIATE "
          "REASSOCIATE_MIN_TRIPS UNROLL_MAX_NODES CSE INVARIANT_FREE AFFINE_OFFSETS NEAR_STRIDE")

#: module path under texpr.codegen -> {retired constant: the Options field now}; the
#: backends' modules name theirs in their ``backend`` module
#: (:data:`codegen.backends.registered.RETIRED`)
RETIRED = {
    "analysis.contraction": {
        "BLAS_MIN_FLOP": "blas_min_flop", "BLAS_MIN_DIM": "blas_min_dim",
        "BLAS_MIN_EFFICIENCY": "blas_min_efficiency", "MAX_PIECES": "blas_max_pieces",
        "MAX_CLASSES": "blas_max_classes", "MASK_MACS": "blas_mask_macs",
        "TAP_EFFICIENCY": "blas_tap_efficiency", "PAD_MAX_RATIO": "blas_pad_max_ratio",
        "PAD_MIN_ELEMENTS": "blas_pad_min_elements"},
    "analysis.shifts": {"MAX_MOVES": "shift_max_moves", "ENABLED": "shifts",
                        "LATTICE_BUDGET": "shift_lattice_budget"},
    "loopnest.cse": {"MIN_NODES": "cse_min_nodes", "SPLIT_NODES": "cse_split_nodes"},
    "loopnest.emit": {"LET_TREE_NODES": "let_tree_nodes", "LET_MIN_NODES": "let_min_nodes",
                      "LET_MAX_DAG_NODES": "let_max_dag_nodes",
                      "TEXT_MAX_HEIGHT": "text_max_height"},
    "loopnest.scan_gemm": {"GEMM_MIN_MACS": "scan_gemm_min_macs"},
    "loopnest.stage": {name: name.lower() for name in _STAGE.split()},
    "rewrite.split_reductions": {
        "ENABLED": "split_reductions", "PARTS": "split_reduction_parts",
        "MAX_OUTPUTS": "split_reduction_max_outputs", "MIN_POINTS": "split_reduction_min_points"},
    "rewrite.tap_split": {"ENABLED": "tap_split", "MIN_DENSITY": "tap_split_min_density"},
    "rewrite.windows": {"MIN_READERS": "window_min_readers", "ENABLED": "windows"},
}

_MODULES = {"analysis.contraction": contraction, "analysis.shifts": shifts,
            "loopnest.cse": cse, "loopnest.emit": emit,
            "loopnest.scan_gemm": scan_gemm, "loopnest.stage": stage,
            "rewrite.split_reductions": split_reductions, "rewrite.tap_split": tap_split,
            "rewrite.windows": windows}
_BY_MODULE = {}


def _hint(module, name, field):
    return (f"{module}.{name} is no module constant any more: the knob is the codegen "
            f"Options field {field!r} (codegen.build(..., options={{{field!r}: ...}}) or "
            f"`with codegen.options({field}=...)`; docs/options.md)")


class _Module(types.ModuleType):
    """A module with retired constants (see the module docstring)."""

    def __setattr__(self, name, value):
        field = _BY_MODULE.get(self.__name__, {}).get(name)
        if field is not None:
            raise TexprError(_hint(self.__name__, name, field))
        super().__setattr__(name, value)

    def __getattr__(self, name):
        field = _BY_MODULE.get(self.__name__, {}).get(name)
        if field is not None:
            raise AttributeError(_hint(self.__name__, name, field))
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")


def install():
    """Guard the retired constants of the modules of :data:`RETIRED`."""
    fields = Options.__dataclass_fields__
    pairs = [(_MODULES[path], names) for path, names in RETIRED.items()]
    for module, names in pairs + list(registered.RETIRED.items()):
        assert all(f in fields for f in names.values()), module.__name__
        _BY_MODULE[module.__name__] = names
        if type(module) is types.ModuleType:
            module.__class__ = _Module
