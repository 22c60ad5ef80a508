"""Training is bitwise reproducible on one machine for a fixed thread count: the same step twice
gives the same gradients. The embedding lookups are where this broke: indexing a table
(``W_E[tokens]``) has ``index_put_`` with accumulation as its backward, which on the CPU adds the
rows of repeated tokens from several threads in whatever order they arrive, so two identical
steps differed by an ulp and, over hundreds of steps, became different models."""

import pytest
import torch
import torch.nn.functional as F

from workbench import build_model


@pytest.mark.parametrize("arch,kwargs", [("fbt", {}), ("hd", {"n_streams": 2})])
def test_a_training_step_is_bitwise_reproducible_with_two_threads(arch, kwargs):
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(0)
        model = build_model(arch, "tiny", **kwargs)
        x, y = torch.randint(0, model.cfg.d_vocab, (2, 8, 256))
        grads = []
        for _ in range(4):
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
            grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    finally:
        torch.set_num_threads(threads)
    for other in grads[1:]:
        assert [n for n in other if not torch.equal(other[n], grads[0][n])] == []
