# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # texpr basics: compute, differentiate, simplify, schedule
#
# texpr differentiates *tensor compute expressions*. This notebook writes a
# few operators, differentiates them, looks at an adjoint before and after the
# Jacobian simplifier, overrides a Jacobian by hand and compiles a gradient to
# a Numba loop nest.

# %%
import numpy as np

from texpr import codegen
from texpr import simplify
import texpr as te

# %% [markdown]
# ## Compute definitions
# A flatten: `C[i] = A[i // W, i % W]`, followed by a dense layer and a scalar loss.

# %%
H, W = 4, 5
A = te.placeholder((H, W), name="A", dtype="float64")
C = te.compute((H * W,), lambda i: A[i // W, i % W], name="C")
V = te.placeholder((3, H * W), name="V", dtype="float64")
k = te.reduce_axis(H * W, "k")
D = te.compute((3,), lambda j: te.sum(V[j, k] * C[k], axis=k), name="D")
r = te.reduce_axis(3, "r")
L = te.compute((), lambda: te.sum(D[r] * D[r], axis=r), name="L")
print(te.graph_str(L))

# %% [markdown]
# ## Differentiate
# `differentiate(L, [A])` gives the gradient of the scalar `L` w.r.t. `A`.
# With `simplify=False` we see the naive adjoint of `A`: a sum over every `i`
# of a condition `i // W == a && i % W == b`.

# %%
raw = te.differentiate(L, [A], simplify=False)
print(te.tensor_str(raw.adjoints[A]))
print("iterations, raw:", simplify.iteration_count([raw.adjoints[A]]))

# %% [markdown]
# The simplifier lifts the condition into the reduction domain, and ISL solves
# the equality `i = W*a + b`: the reduction disappears.

# %%
res = te.differentiate(L, [A])
print(te.tensor_str(res.adjoints[A]))
print("iterations, simplified:", simplify.iteration_count([res.adjoints[A]]))
print(simplify.explain(res.adjoints[A]))

# %%
a = np.random.default_rng(0).normal(size=(H, W))
v = np.random.default_rng(1).normal(size=(3, H * W))
(dA,) = te.evaluate(res.result, {A: a, V: v})
d = v @ a.reshape(-1)
np.testing.assert_allclose(dA, (2 * d @ v).reshape(H, W), rtol=1e-10)
dA

# %% [markdown]
# ## Overriding a Jacobian
# `manual={(out, inp): fn}` replaces the automatic rule on one edge. `fn(out,
# inp, head)` returns the adjoint contribution of `out` to `inp` given `out`'s
# adjoint `head` (shape `prefix + out.shape` to `prefix + inp.shape`). Here: a
# hand-written flatten gradient.

# %%
def flatten_grad(out, inp, head):
    return te.compute(inp.shape, lambda a, b: head[a * W + b], name="dA_manual")

manual = te.differentiate(L, [A], manual={(C, A): flatten_grad})
np.testing.assert_allclose(te.evaluate(manual.result[0], {A: a, V: v}), dA, rtol=1e-12)
print(te.tensor_str(manual.result[0]))

# %% [markdown]
# ## Scheduling and compiling an adjoint
# Every intermediate adjoint is reachable through `result.adjoints`; give it a
# schedule and compile it with Numba. `Kernel.source` is the generated loop nest.

# %%
dC = res.adjoints[C]
s = codegen.create_schedule([res.result[0]])
s[dC].compute_root()
kernel = codegen.build([res.result[0]], [A, V], s)
print(kernel.source)
(dA_compiled,) = kernel(a, v)
np.testing.assert_allclose(dA_compiled, dA, rtol=1e-12)
