import pytest
import torch
import torch.nn.functional as F

from nmt.data.special import PAD
from nmt.train.loss import output_cross_entropy


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("chunk_rows", [7, 1000])
@pytest.mark.parametrize("vocab,bias", [(50, True), (50, False), (48, True)])   # padded to 64 inside, or not
def test_fused_loss_equals_linear_plus_cross_entropy(label_smoothing, chunk_rows, vocab, bias):
    torch.manual_seed(0)
    features = torch.randn(3, 9, 16, requires_grad=True)
    layer = torch.nn.Linear(16, vocab, bias=bias)
    targets = torch.randint(4, vocab, (3, 9))
    targets[1, 6:] = PAD
    targets[2, 2:] = PAD
    targets[0, 0] = vocab - 1                       # the last real row of W_s, next to the padding
    fused = output_cross_entropy(features, layer.weight, layer.bias, targets, label_smoothing, chunk_rows)
    (fused * 0.5).backward()
    parameters = [layer.weight, layer.bias] if bias else [layer.weight]
    got = [features.grad.clone()] + [p.grad.clone() for p in parameters]
    features.grad = None
    for p in parameters:
        p.grad = None

    logits = layer(features)
    plain = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1), ignore_index=PAD,
                            label_smoothing=label_smoothing, reduction="sum")
    (plain * 0.5).backward()
    assert torch.allclose(fused, plain, rtol=1e-5)
    for mine, reference in zip(got, [features.grad] + [p.grad for p in parameters], strict=True):
        assert mine.shape == reference.shape
        assert torch.allclose(mine, reference, atol=1e-5)
    assert torch.all(got[0][2, 2:] == 0)            # padded positions get no gradient


def test_fused_loss_under_bfloat16_autocast_is_close():
    torch.manual_seed(0)
    features = torch.randn(64, 32)
    layer = torch.nn.Linear(32, 100)
    targets = torch.randint(4, 100, (64,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = output_cross_entropy(features.unsqueeze(0), layer.weight, layer.bias, targets.unsqueeze(0))
    plain = F.cross_entropy(layer(features), targets, reduction="sum")
    assert fused.dtype == torch.float32
    assert torch.allclose(fused, plain, rtol=2e-2)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_all_rows_masks_the_padding_as_the_gathered_rows_do(label_smoothing):
    """`all_rows` (a captured CUDA step: static shapes, no nonzero) gives the same loss and gradients."""
    torch.manual_seed(0)
    features = torch.randn(3, 5, 8, requires_grad=True)
    weight = torch.randn(11, 8, requires_grad=True)
    bias = torch.randn(11, requires_grad=True)
    targets = torch.randint(4, 11, (3, 5))
    targets[1, 3:] = PAD
    targets[2, 1:] = PAD
    results = []
    for all_rows in (False, True):
        loss = output_cross_entropy(features, weight, bias, targets, label_smoothing, chunk_rows=4, all_rows=all_rows)
        grads = torch.autograd.grad(loss, (features, weight, bias))
        results.append((loss, *grads))
    for gathered, masked in zip(*results, strict=True):
        assert torch.allclose(gathered, masked, atol=1e-5)
    assert results[1][1][2, 1:].abs().max() == 0                      # padded positions get no gradient
