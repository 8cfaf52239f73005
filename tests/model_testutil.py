"""The check both example models' float64 tests run: the loss and every weight
gradient of one compiled kernel (and te.evaluate's loss) against a PyTorch twin."""

import numpy as np

import texpr as te


def assert_step_matches_torch(model, data, weights, torch_loss):
    """``model`` (texpr.examples.resnet.ResNet or gpt_model.GPT, float64), ``data``
    ``{placeholder: array}`` of its non-weight inputs, ``weights`` ``{name: array}``,
    ``torch_loss(torch_weights) -> loss tensor``: the step kernel's loss and
    gradients equal PyTorch's (rtol 1e-12 for the loss, 1e-8 for gradients)."""
    from texpr import codegen
    from texpr.examples.models_torch import as_torch

    feed = dict(data)
    feed.update({model.weights[n]: a for n, a in weights.items()})
    tw = as_torch(weights)
    ref = torch_loss(tw)
    ref.backward()
    grads = list(te.differentiate(model.loss, list(model.weights.values())).result)
    kernel = codegen.build([model.loss] + grads, model.inputs_list())
    loss, *got = kernel(*(feed[t] for t in model.inputs_list()))
    np.testing.assert_allclose(loss, ref.item(), rtol=1e-12)
    np.testing.assert_allclose(te.evaluate(model.loss, feed), ref.item(), rtol=1e-12)
    for name, g in zip(model.weights, got):
        want = tw[name].grad.numpy()
        assert g.shape == want.shape, name
        np.testing.assert_allclose(g, want, rtol=1e-8, atol=1e-11, err_msg=name)
