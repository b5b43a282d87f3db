"""Grad mode around the scaler's passes and the optimizer step: grads that require grad
(``backward(create_graph=True)``) are unscaled with grad mode off (the ops refuse to write
a tensor that requires grad in grad mode), the inf check only reads them, and the
caller's grad mode comes back."""

from __future__ import annotations

import torch

import mixprec


def _create_graph_grads(model: torch.nn.Module, scaler: mixprec.GradScaler) -> None:
    loss = model(torch.randn(4, 3)).pow(2).sum()
    for p, g in zip(model.parameters(),
                    torch.autograd.grad(scaler.scale(loss), list(model.parameters()),
                                        create_graph=True)):
        p.grad = g
    assert all(p.grad.requires_grad for p in model.parameters())


def test_unscale_of_grads_that_require_grad_runs_with_grad_mode_off() -> None:
    """Grads from ``create_graph=True`` require grad; the unscale writes them, which the
    ops refuse in grad mode. So the unscale only works if its grad-mode switch works."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = mixprec.GradScaler("cpu", init_scale=4.0)
    _create_graph_grads(model, scaler)
    expected = [p.grad.detach() / 4.0 for p in model.parameters()]
    assert torch.is_grad_enabled()
    scaler.unscale_(opt)
    assert torch.is_grad_enabled()
    for p, e in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad.detach(), e, rtol=0, atol=0)
    assert scaler.found_inf(opt).item() == 0.0
    scaler.step(opt)
    scaler.update()


def test_inf_check_and_step_of_grads_that_require_grad() -> None:
    """The inf check of a mixprec optimizer only reads the grads: it runs in grad mode
    (without switching it) on ``create_graph`` grads, and the step equals the same step
    on detached copies of them."""
    torch.manual_seed(0)
    models = [torch.nn.Linear(3, 2) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    before = [p.detach().clone() for p in models[0].parameters()]
    opts = [mixprec.optim.AdamW(m.parameters(), lr=0.1) for m in models]
    scalers = [mixprec.GradScaler("cpu", init_scale=4.0) for _ in models]
    _create_graph_grads(models[0], scalers[0])
    scalers[1].scale(torch.ones(()))
    for p, q in zip(models[0].parameters(), models[1].parameters()):
        q.grad = p.grad.detach().clone()
    for opt, scaler in zip(opts, scalers):
        assert torch.is_grad_enabled()
        scaler.step(opt)
        assert torch.is_grad_enabled()
        assert scaler.found_inf(opt).item() == 0.0
        scaler.update()
    for p, q, b in zip(models[0].parameters(), models[1].parameters(), before):
        assert p.grad.requires_grad
        torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=0)
        assert not torch.equal(p.detach(), b)
