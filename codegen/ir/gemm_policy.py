"""When a GEMM's result stands for a sum of products: the one rule of both GEMM paths.

A contraction ``out[s] = sum_r c * A[..] * B[..]`` runs as a GEMM in two places:
a materialised stage as a :class:`codegen.ir.contraction_plan.ContractionPlan` on
numpy's BLAS between units (:mod:`codegen.backends.numpy_host.gemm`), and a scan
step as ``np.dot`` inside the scan's compiled unit (:mod:`codegen.loopnest.scan_gemm`).
A BLAS adds the terms in its own order and may fuse a multiply and an add
(FMA). Both paths follow this rule:

**Accepted.** A GEMM's result is used as it is when every operand value it
reads is finite and

    K * M_A * M_B * |c|  <=  limit(dtype, n)

where ``K`` is the number of terms of an output element, ``M_A`` and ``M_B``
bound ``max|A|`` and ``max|B|`` (for a plan of several pieces: the sum over its
pieces of ``K_p * M_Ap * M_Bp``), and :func:`limit` is the dtype's largest
finite value divided by ``(1 + u)^(n + 4)``, ``u`` the unit roundoff and ``n``
the roundings the bound and the sum carry. Then no product and no partial sum
can overflow in any order of the terms, with or without fused multiply-adds:
the result is the loop nest's and the evaluator's up to rounding. The two paths
bound the maxima differently, for speed, never the rule: a scan step's guard
computes ``max|A|`` itself (``n = K``); a stage's plan takes ``sqrt(sum x^2)``
of each operand buffer (:func:`magnitude`: one BLAS dot product, a faster pass
than numpy's max and min; ``n`` adds the buffers' sizes), a looser bound that
sends only values within a factor of about ``sqrt(size)`` of overflowing to
the exact path.

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

import functools
import math

import numpy as np

__all__ = ["limit", "magnitude", "accepts"]


@functools.lru_cache(maxsize=256)
def limit(dtype, terms):
    """The largest bound :func:`accepts` takes for a bound carrying ``terms`` roundings.

    Args:
        dtype: the sum's float dtype (a name or numpy dtype).
        terms: ``n`` of the module docstring: the terms of an output element
            (``K``), plus the elements summed into the bound itself.
    Returns:
        A Python float: the dtype's largest finite value divided by
        ``(1 + u)^(terms + 4)``, ``u`` its unit roundoff.
    """
    info = np.finfo(np.dtype(dtype))
    u = float(info.eps) / 2
    return float(info.max) / math.exp((int(terms) + 4) * math.log1p(u))


def magnitude(x):
    """An upper bound of ``max|x|``: ``sqrt(sum x^2)`` (a BLAS dot product, one pass
    with no temporary array), as a Python float; inf or NaN when ``x`` holds a
    non-finite value or its squares overflow. It carries ``x.size`` roundings
    (see :func:`limit`).

    Args:
        x: a 1-D C-contiguous float ndarray.
    """
    if x.size == 0:
        return 0.0
    return math.sqrt(float(np.dot(x, x)))


def accepts(bound, dtype, terms):
    """Whether a GEMM's result is accepted (the module docstring's rule).

    Args:
        bound: ``K * M_A * M_B * |c|`` (summed over a plan's pieces), a Python
            float, inf or NaN where an operand value is non-finite.
        dtype: the sum's float dtype.
        terms: ``n``: the roundings the bound and the sum carry (``K``, plus
            the operand sizes where :func:`magnitude` gave ``M``).
    Returns:
        True when ``bound <= limit(dtype, terms)`` (False for NaN).
    """
    return bound <= limit(dtype, terms)
