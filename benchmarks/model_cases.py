"""The example models as benchmark cases: bench_models.py's models, in four forms.

``MODELS[name]`` builds a :class:`ModelCase`: the texpr graph (its ``loss``,
``weights`` and ``inputs_list()``), fixed random inputs and weights (the model's
own ``init_weights``, seed 0), and the step -- the loss and every weight's
gradient -- as a closure in each peer framework:

* :func:`torch_step` (``compiled=False``): PyTorch eager, ``torch.autograd.grad``
  of texpr.examples.models_torch's loss;
* :func:`torch_step` (``compiled=True``): the same loss through ``torch.compile``
  (Inductor; its backward compiled by AOTAutograd);
* :func:`jax_step`: ``jax.jit(jax.value_and_grad(...))`` of benchmarks/models_jax.py's
  twin.

Each closure returns ``(loss, [gradient per weight, in the weights' order])``.
Only the texpr IR is imported here (no code generator): peer_alone.py times the
peers in processes that never load it.
"""

import numpy as np

from texpr.examples.gpt_model import GPT
from texpr.examples.resnet import ResNet


class ModelCase:
    """A model with fixed inputs and weights.

    Attributes:
        name, model (the texpr graph object), data (the data inputs: list of numpy
        arrays, ``model.inputs_list()``'s first entries), weights (dict name -> numpy
        array), torch_loss(weights, *data) and jax_loss(weights, *data) (the twins).
    """

    def __init__(self, name, model, data, torch_loss, jax_loss):
        self.name, self.model, self.data = name, model, data
        self.weights = model.init_weights(np.random.default_rng(0))
        self.torch_loss, self.jax_loss = torch_loss, jax_loss

    def texpr_args(self):
        """The arrays a texpr kernel of ``model.inputs_list()`` takes, in order."""
        return list(self.data) + list(self.weights.values())


def _resnet():
    m = ResNet(batch=64)
    rng = np.random.default_rng(1)
    data = [rng.standard_normal(m.x.shape).astype("float32"),
            rng.integers(0, m.classes, m.labels.shape).astype("int64")]

    def tl(w, x, y):
        from texpr.examples.models_torch import resnet_loss
        return resnet_loss(w, x, y)

    def jl(w, x, y):
        from models_jax import resnet_loss
        return resnet_loss(w, x, y)

    return ModelCase("resnet", m, data, tl, jl)


def _gpt(layers):
    def make():
        m = GPT(layers=layers)
        rng = np.random.default_rng(1)
        data = [rng.integers(0, m.vocab, m.idx.shape).astype("int64"),
                rng.integers(0, m.vocab, m.targets.shape).astype("int64")]

        def tl(w, idx, tg):
            from texpr.examples.models_torch import gpt_loss
            return gpt_loss(w, idx, tg, m.heads)

        def jl(w, idx, tg):
            from models_jax import gpt_loss
            return gpt_loss(w, idx, tg, m.heads)

        return ModelCase(f"gpt{layers}l", m, data, tl, jl)
    return make


#: name -> builder of the case: ResNet (batch 64, 3x32x32), GPT with 2 and 8 layers
MODELS = {"resnet": _resnet, "gpt2l": _gpt(2), "gpt8l": _gpt(8)}


def torch_step(case, compiled=False):
    """The step in PyTorch (eager, or ``torch.compile`` of the loss when ``compiled``):
    a closure returning ``(loss, gradients)``. The first call of a compiled step
    compiles it."""
    import torch

    names = list(case.weights)
    leaves = [torch.from_numpy(case.weights[n].copy()).requires_grad_(True) for n in names]
    data = [torch.from_numpy(a.copy()) for a in case.data]

    def loss_of(*ws):
        return case.torch_loss(dict(zip(names, ws[len(data):])), *ws[:len(data)])

    fn = torch.compile(loss_of) if compiled else loss_of

    def run():
        loss = fn(*data, *leaves)
        return loss, torch.autograd.grad(loss, leaves)
    return run


def jax_step(case):
    """The step in JAX: ``jax.jit`` of ``jax.value_and_grad`` of the twin, a closure
    returning ``(loss, gradients)`` once the results are ready."""
    import jax
    import jax.numpy as jnp

    names = list(case.weights)
    fn = jax.jit(jax.value_and_grad(case.jax_loss))
    w = {n: jnp.asarray(case.weights[n]) for n in names}
    data = [jnp.asarray(a) for a in case.data]

    def run():
        loss, grads = fn(w, *data)
        jax.block_until_ready((loss, grads))
        return loss, [grads[n] for n in names]
    return run


#: peer name -> builder of its step closure from a case
PEERS = {"torch": torch_step, "torch_compile": lambda c: torch_step(c, compiled=True),
         "jax": jax_step}
