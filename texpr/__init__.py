"""texpr: automatic differentiation of tensor compute expressions.

Write operators as ``compute(shape, lambda i, j: ...)``, differentiate them
with ``differentiate``, run them with ``evaluate`` (numpy reference) or
:func:`texpr.codegen.build` (Numba kernels). The Jacobian simplifier is
:mod:`texpr.simplify`. ``import texpr`` loads none of numba, islpy or sympy:
the passes of ``texpr.simplify`` (whose light package face ``differentiate``
imports) and ``texpr.codegen`` are imported on first use.

Documentation (in the repository's ``docs/``): ``docs/pipeline.md`` (data
flow, the pass pipeline, ``explain``), ``docs/stages.md`` (materialisation,
scatter-add and support stages), ``docs/conventions.md`` (floor semantics,
negative indices, ties, singular points, dtypes, adjoint names),
``docs/extending.md`` (adding an operator, a pass, a rule),
``docs/testing.md``.
"""

import importlib as _importlib

from . import dtypes
# the errors of float(e), bool(e), np.exp(e), ... (installed into texpr.expr)
from . import habits  # noqa: F401
from .errors import (AxisError, ConcretizationError, DTypeError, FeedError,
                     NotDifferentiableError, OutOfBoundsError, ScanBodyInputError,
                     ScanDependenceError, ScanError, ScanInitError, ScanShapeError,
                     ScheduleError, ShapeError, TexprError, TexprWarning)
from .evaluate import evaluate
from .expr import (Expr, IterVar, Var, all_of as all, any_of as any, cast, const, floordiv,
                   floormod, logical_and, logical_not, logical_or, select)
from .expr import select as if_then_else
from .intrinsics import (abs, ceil, cos, erf, exp, floor, log, power, round, rsqrt, sigmoid,
                         sin, sqrt, stop_gradient, tanh, trunc)
from .printer import expr_str, graph_str, tensor_str
from .reduction import CommReducer, comm_reducer, max, min, prod, sum
from .tensor import (ComputeOp, Operation, PlaceholderOp, ScatterAddOp, Tensor, compute,
                     placeholder, reduce_axis, scatter_add, topo_order)
# recurrences (the module texpr.scan is shadowed by the function)
from .scan import ScanOp, scan  # noqa: E402
# differentiation (the module texpr.differentiate is shadowed by the function)
from .differentiate import DifferentiationResult, differentiate, jvp  # noqa: E402
# the operator library, te.nn
from . import nn  # noqa: E402
from .version import __version__  # noqa: E402


# the framework bridges (texpr.torch, texpr.jax) import torch/jax: only on access
_LAZY_SUBPACKAGES = ("simplify", "codegen", "torch", "jax")


def __getattr__(name):
    """``te.simplify`` / ``te.codegen`` import the subpackage on first access."""
    if name in _LAZY_SUBPACKAGES:
        return _importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'texpr' has no attribute {name!r}")
