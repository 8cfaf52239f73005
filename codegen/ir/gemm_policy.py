"""When a GEMM's result stands for a sum of products: the one rule of both GEMM paths.

A contraction ``out[s] = sum_r c * A[..] * B[..]`` runs as a GEMM in two places:
a materialised stage as a :class:`codegen.ir.contraction_plan.ContractionPlan` on
numpy's BLAS between units (:mod:`codegen.backends.numpy_host.gemm`), and a scan
step as ``np.dot`` inside the scan's compiled unit (:mod:`codegen.loopnest.scan_gemm`).
A BLAS adds the terms in its own order and may fuse a multiply and an add
(FMA). Both paths follow this rule:

**Accepted.** A GEMM's result is used as it is when every operand value it
reads is finite and

    max|A| * max|B| * K * |c|  <=  limit(dtype, K)

where ``K`` is the number of terms of an output element (for a plan of several
pieces: the sum over its pieces of ``max|A_p| * max|B_p| * K_p``) and
:func:`limit` is the dtype's largest finite value divided by ``(1 + u)^(K + 4)``
(``u`` the unit roundoff: every rounding of a term and of a partial sum). Then
no product and no partial sum can overflow in any order of the terms, with or
without FMA: the result is the loop nest's and the evaluator's up to rounding.

**Otherwise** (an inf or NaN operand value, or values large enough that some
order of the sum could overflow) the result is computed again with every term
the evaluator's (``c * a * b`` rounded on its own: an overflowing product is
+-inf; ``0 * inf`` and NaN are NaN; padded and masked terms stay absent):

* a scan step runs its loop nest for the whole step instead of ``np.dot``;
* a stage's plan (:func:`codegen.backends.numpy_host.gemm.run_exact`) runs its
  GEMMs on the operands with non-finite values as zeros, then recomputes term
  by term (numpy, :func:`numpy.sum` over the reduction) exactly the output
  elements whose own bound ``|c| * sum_r |A| * |B|`` (a GEMM of the absolute
  values) exceeds :func:`limit`, then adds, per output element, the
  infinity or NaN that its non-finite terms make (found by GEMMs of 0/1
  indicators). The other elements keep their GEMM values.

Where a partial sum leaves the dtype's range, its value depends on the order
of the terms (docs/conventions.md, "The order of a sum's terms"): the exact
paths use one order (the loop nest's, or numpy's), not the BLAS's.

One job: the rule (this docstring) and the bound it checks, for both paths.
"""

import math

import numpy as np

__all__ = ["limit", "max_abs", "accepts"]


def limit(dtype, terms):
    """The largest bound :func:`accepts` takes for sums of ``terms`` terms.

    Args:
        dtype: the sum's float dtype (a name or numpy dtype).
        terms: the number of terms of an output element (``K``).
    Returns:
        A Python float: the dtype's largest finite value divided by
        ``(1 + u)^(terms + 4)``, ``u`` its unit roundoff.
    """
    info = np.finfo(np.dtype(dtype))
    u = float(info.eps) / 2
    return float(info.max) / math.exp((int(terms) + 4) * math.log1p(u))


def max_abs(x):
    """``max|x|`` as a Python float (0.0 for an empty array); inf or NaN when ``x``
    holds a non-finite value (two passes, no temporary array).

    Args:
        x: a float ndarray.
    """
    if x.size == 0:
        return 0.0
    return max(float(x.max()), -float(x.min()))


def accepts(bound, dtype, terms):
    """Whether a GEMM's result is accepted (the module docstring's rule).

    Args:
        bound: ``max|A| * max|B| * K * |c|`` (summed over a plan's pieces), a
            Python float, inf or NaN where an operand value is non-finite.
        dtype: the sum's float dtype.
        terms: ``K``, the number of terms of an output element.
    Returns:
        True when ``bound <= limit(dtype, terms)`` (False for NaN).
    """
    return bool(bound <= limit(dtype, terms))
