"""texpr.codegen: a texpr graph -> a compiled :class:`Kernel`, as a pipeline.

    s = codegen.create_schedule([Y])          # optional
    k = codegen.build([Y], [X, W], s)         # -> Kernel
    (y,) = k(x, w)

The stages, each a subpackage (docs/pipeline.md draws the flow):

* :mod:`codegen.rewrite` -- graph rewrites that prepare a simplified graph for
  its lowerings, as a pass list (:mod:`codegen.rewrite.passes`);
* :mod:`codegen.ir` -- the schedule (:mod:`codegen.ir.schedule`: user
  primitives), the marks rewrites leave, and the lowered program's data
  (:mod:`codegen.ir.program`);
* :mod:`codegen.analysis` -- what isl proves about a stage: affine offsets,
  bounds and checks, which stages are GEMMs (:mod:`codegen.analysis.contraction`,
  matched once per stage and build: :mod:`codegen.analysis.matches`) or shift
  plans (:mod:`codegen.analysis.shifts`);
* :mod:`codegen.strategy` -- how each stage is lowered, decided once as data: a
  ``StagePlan`` per stage from an ordered list of rules, the first that applies
  winning; the lowering follows it, and ``kernel.explain()`` prints it;
* :mod:`codegen.loopnest` -- the target-neutral loop-nest lowering (buffers and
  units: :mod:`codegen.loopnest.lower`; one stage: :mod:`codegen.loopnest.stage`;
  values: :mod:`codegen.loopnest.emit`), written through a target dialect
  (:mod:`codegen.loopnest.dialect`);
* :mod:`codegen.backends` -- what runs: each backend's unit kinds and dialect
  (registered in :mod:`codegen.backends.registered`), the shared worker
  threads and the errors units raise;
* :mod:`codegen.units` (the unit interface the kernel's driver calls),
  :mod:`codegen.build` (``build`` and ``Kernel``), :mod:`codegen.explain` and
  :mod:`codegen.profile` (``kernel.explain``, ``kernel.profile``).

Every tuning knob is a field of :class:`codegen.options.Options`
(``codegen.build(..., options=)``, ``with codegen.options(unroll=4):``;
docs/options.md). Which stages get buffers by default is the materialisation rule of
``docs/stages.md``. The module paths of the flat layout before this one
(``texpr.codegen.stage``, ...) stay importable for one release
(:mod:`codegen._aliases`); the module constants the knobs were refuse
assignment with the field to use (:mod:`codegen._retired`).
"""

import os as _os

from . import _aliases
from .options import Options, current as current_options, options, using

if not _os.environ.get("_TEXPR_COMPILE_WORKER"):
    # (a compile worker process of the loop-nest backend needs its compiler only:
    # it skips the simplifier, sympy and islpy that build and lower import)
    from .build import Kernel, build
    from .backends.registered import CacheWarning, CompileError, cache_dir, clear_memory_cache
    from .profile import report as profile_report
    from .ir.schedule import Schedule, Stage, create_schedule
    from . import _retired
    _retired.install()  # (stage.UNROLL = 1 would change nothing: an error)

__all__ = ["build", "Kernel", "create_schedule", "Schedule", "Stage", "CompileError",
           "CacheWarning", "cache_dir", "clear_memory_cache", "profile_report",
           "Options", "options", "using", "current_options"]

_aliases.install(__name__)


def __getattr__(name):
    """``codegen.stage`` and the other modules that moved (:mod:`codegen._aliases`)."""
    return _aliases.attribute(__name__, name)
