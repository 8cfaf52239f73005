"""The digits example with a texpr layer in a PyTorch model: the layer against
PyTorch's own dilated depthwise conv, training against the all-PyTorch model,
and DistributedDataParallel (2 processes, gloo) against one process."""

import torch
import torch.nn.functional as F

from texpr.examples import digits_torch as dt

BATCH = 8


def test_texpr_layer_matches_pytorch_conv_and_gradcheck():
    layer = dt.TexprDepthwise(3, 5, dtype="float64")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(3, 3, 3, generator=g, dtype=torch.float64))
    x = torch.randn(2, 3, 5, 5, generator=g, dtype=torch.float64, requires_grad=True)
    ref = F.conv2d(x, layer.weight[:, None], padding=2, dilation=2, groups=3)
    torch.testing.assert_close(layer(x), ref, rtol=1e-12, atol=1e-12)
    op = layer._ops[2]
    assert torch.autograd.gradcheck(op, (x, layer.weight.detach().clone().requires_grad_()))


def test_training_matches_the_all_pytorch_model():
    # same initial weights, same batches: the losses agree step by step
    kw = dict(epochs=1, batch=BATCH, steps=4, dtype="float64")
    _, losses, acc = dt.train(**kw)
    _, ref_losses, ref_acc = dt.train(reference=True, **kw)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-10,
                               atol=1e-12)
    assert abs(acc - ref_acc) < 0.01


def test_ddp_two_processes_match_one_process(tmp_path):
    kw = dict(epochs=1, batch=BATCH, steps=3, dtype="float64")
    _, single, _ = dt.train(**kw)
    # compile the ranks' batch size here once: the spawned ranks load it from the disk cache
    dt.TexprDepthwise(dt.CHANNELS, dt.IMAGE, "float64")(
        torch.zeros(BATCH // 2, dt.CHANNELS, dt.IMAGE, dt.IMAGE, dtype=torch.float64,
                    requires_grad=True)).sum().backward()
    ddp = dt.train_ddp(world=2, result_path=str(tmp_path / "losses.pt"), **kw)
    assert len(ddp) == len(single) == 3
    torch.testing.assert_close(torch.tensor(ddp), torch.tensor(single), rtol=1e-10, atol=1e-12)
