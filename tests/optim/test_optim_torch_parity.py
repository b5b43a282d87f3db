"""What torch's own optimizer tests (pytorch test/test_optim.py) expect of an optimizer,
on mixprec's classes: non-param entries in ``state``, load_state_dict post hooks, sparse
grads, meta-device params, the wording of argument errors; and a checkpoint of the removed
flat-buffer mode loading into the plain optimizer."""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
import torch
from torch import nn

import mixprec
import mixprec.optim
from _helpers import DATA


def _stepped(cls: Any, **kwargs: Any) -> torch.optim.Optimizer:
    torch.manual_seed(0)
    p = nn.Parameter(torch.randn(8, 4))
    opt = cls([p], lr=0.1, **kwargs)
    p.grad = torch.randn(8, 4)
    opt.step()
    return opt


CLASSES = [(mixprec.optim.AdamW, {}), (mixprec.optim.SGD, {"momentum": 0.9}),
           (mixprec.optim.AdamW, {"state_bits": 8, "min_8bit_size": 1}),
           (mixprec.optim.SGD, {"momentum": 0.9, "state_bits": 8, "min_8bit_size": 1})]


@pytest.mark.parametrize("cls,kwargs", CLASSES)
def test_state_entry_that_is_not_a_param_survives_a_load(cls: Any, kwargs: Dict[str, Any]
                                                         ) -> None:
    """torch keeps a ``state`` entry whose key is not a param through state_dict and
    load_state_dict (test_optim.py's test_state_dict_with_non_param_state); 32- and 8-bit
    state alike."""
    opt = _stepped(cls, **kwargs)
    opt.state["note"] = 1
    p = opt.param_groups[0]["params"][0]
    before = {k: v.clone() for k, v in opt.state[p].items() if isinstance(v, torch.Tensor)}
    opt.load_state_dict(opt.state_dict())
    assert opt.state["note"] == 1
    for k, v in before.items():
        assert torch.equal(opt.state[p][k], v), k
    p.grad = torch.ones_like(p)
    opt.step()  # (the loaded state steps on)
    assert float(opt.state[p]["step"]) == 2.0


@pytest.mark.parametrize("cls,kwargs", CLASSES[:2])
def test_load_state_dict_post_hook_sees_the_converted_state(cls: Any, kwargs: Dict[str, Any]
                                                            ) -> None:
    """A post hook runs after mixprec converted the loaded state: it sees ``step`` as a
    float32 tensor (a torch checkpoint's step, here a Python float, already converted)
    and the float32 master of a bf16 param, as a step will use them."""
    torch.manual_seed(0)
    p = nn.Parameter(torch.randn(8, 4).bfloat16())
    ref = getattr(torch.optim, cls.__name__)([nn.Parameter(p.detach().float())], lr=0.1,
                                             **kwargs)
    ref.param_groups[0]["params"][0].grad = torch.randn(8, 4)
    ref.step()
    saved = ref.state_dict()
    saved["state"][0]["step"] = 1.0  # (an old torch checkpoint: a plain number)
    opt = cls([p], lr=0.1, **kwargs)
    seen: List[Any] = []

    def post(o: torch.optim.Optimizer) -> None:
        st = o.state[p]
        seen.append((type(st["step"]), st["step"].dtype, st["master_param"].dtype))

    opt.register_load_state_dict_post_hook(post)
    opt.load_state_dict(saved)
    assert seen == [(torch.Tensor, torch.float32, torch.float32)]
    # the conversion's own hooks are gone again: a second load runs the user's hook once
    opt.load_state_dict(saved)
    assert len(seen) == 2
    assert len(opt._optimizer_load_state_dict_post_hooks) == 1
    assert len(opt._optimizer_load_state_dict_pre_hooks) == 0


def test_load_state_dict_pre_hook_result_is_what_is_converted() -> None:
    """A pre hook that returns a new dict: that dict is the one converted."""
    opt = _stepped(mixprec.optim.AdamW)
    p = opt.param_groups[0]["params"][0]
    saved = opt.state_dict()
    other = {"state": {0: {**saved["state"][0], "exp_avg": torch.full((8, 4), 7.0)}},
             "param_groups": saved["param_groups"]}
    opt.register_load_state_dict_pre_hook(lambda o, sd: other)
    opt.load_state_dict(saved)
    assert torch.equal(opt.state[p]["exp_avg"], torch.full((8, 4), 7.0))


@pytest.mark.parametrize("name", ["SGD", "AdamW"])
def test_sparse_grad_is_refused_naming_the_param(name: str) -> None:
    """A sparse grad (``nn.Embedding(sparse=True)``) gets a clear error naming the param
    and what to use instead, before anything changes (docs/optimizers.md)."""
    emb = nn.Embedding(10, 3, sparse=True)
    lin = nn.Linear(3, 1)
    opt = getattr(mixprec.optim, name)(list(lin.parameters()) + list(emb.parameters()), lr=0.1)
    lin(emb(torch.tensor([1, 2, 2]))).sum().backward()
    assert emb.weight.grad.is_sparse
    before = [p.detach().clone() for p in (*lin.parameters(), emb.weight)]
    with pytest.raises(RuntimeError, match=r"does not support sparse gradients: "
                       r"param_groups\[0\]\['params'\]\[2\].*torch\.optim\.SGD"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, (*lin.parameters(), emb.weight)))
    assert not opt.state[emb.weight]


@pytest.mark.parametrize("cls,kwargs", CLASSES)
def test_step_on_meta_params_creates_state_and_computes_nothing(cls: Any,
                                                                kwargs: Dict[str, Any]) -> None:
    """Params on the meta device step as torch's optimizers' do: no error, the state is
    created (on meta), nothing to compute."""
    for dtype in (torch.float32, torch.bfloat16):
        p = nn.Parameter(torch.empty(8, 4, device="meta", dtype=dtype))
        p.grad = torch.empty(8, 4, device="meta", dtype=dtype)
        opt = cls([p], lr=0.1, **kwargs)
        opt.step()
        opt.step()
        st = opt.state[p]
        assert st and all(v.device.type == "meta" for v in st.values()
                          if isinstance(v, torch.Tensor))
        assert ("master_param" in st) is (dtype == torch.bfloat16)


@pytest.mark.parametrize("make,match", [
    (lambda p: mixprec.optim.AdamW(p, lr=-1.0), "Invalid learning rate: -1.0"),
    (lambda p: mixprec.optim.SGD(p, lr=-0.5), "Invalid learning rate: -0.5"),
    (lambda p: mixprec.optim.Adam(p, betas=(1.0, 0.999)),
     "Invalid beta parameter at index 0: 1.0"),
    (lambda p: mixprec.optim.Adam(p, betas=(0.9, -0.1)),
     "Invalid beta parameter at index 1: -0.1"),
    (lambda p: mixprec.optim.AdamW(p, eps=-1e-8), "Invalid epsilon value: -1e-08"),
    (lambda p: mixprec.optim.AdamW(p, weight_decay=-1.0), "Invalid weight_decay value: -1.0"),
    (lambda p: mixprec.optim.SGD(p, lr=0.1, weight_decay=-1.0),
     "Invalid weight_decay value: -1.0"),
    (lambda p: mixprec.optim.SGD(p, lr=0.1, momentum=-0.5), "Invalid momentum value: -0.5"),
    (lambda p: mixprec.optim.SGD(p, lr=0.1, nesterov=True),
     "Nesterov momentum requires a momentum and zero dampening"),
    (lambda p: mixprec.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.5, nesterov=True),
     "Nesterov momentum requires a momentum and zero dampening"),
    (lambda p: mixprec.optim.AdamW(p, lr=torch.tensor([1e-3, 1e-3])),
     "Tensor lr must be 1-element"),
])
def test_argument_errors_are_worded_as_torchs(make: Any, match: str) -> None:
    """ValueError with torch's wording (what torch's test_optim.py matches), after
    mixprec's prefix naming the class."""
    p = [nn.Parameter(torch.zeros(2))]
    with pytest.raises(ValueError, match=match):
        make(p)
    torch_make = {"Invalid learning rate": lambda: torch.optim.SGD(p, lr=-1.0)}
    for prefix, ref in torch_make.items():
        if match.startswith(prefix):
            with pytest.raises(ValueError, match=prefix):
                ref()


# -- a checkpoint of the flat-buffer mode (removed after 9471ec2) --------------------------


class _Mixed(nn.Module):
    """tests/data/make_flat_buffer_checkpoint.py's model: a bf16 layer, then a float32 one."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8).to(torch.bfloat16)
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x.to(torch.bfloat16)).float().relu())


def _train(model: nn.Module, opt: torch.optim.Optimizer, inputs: torch.Tensor) -> None:
    for x in inputs:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()


@pytest.mark.parametrize("case,make", [
    ("adamw", lambda ps: mixprec.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)),
    ("sgd", lambda ps: mixprec.optim.SGD(ps, lr=1e-2, momentum=0.9)),
])
def test_flat_buffer_checkpoint_loads_into_the_plain_optimizer(case: str, make: Any) -> None:
    """``tests/data/flat_buffer_checkpoint.pt`` was saved at 9471ec2 by an optimizer in
    the flat-buffer mode (its moments and masters views of flat state buffers, see
    tests/data/make_flat_buffer_checkpoint.py). It loads into the plain optimizer, which
    then trains on exactly as the flat run did, and exactly as a plain run from the same
    start; the loaded state does not alias the checkpoint's buffers."""
    data = torch.load(DATA / "flat_buffer_checkpoint.pt", weights_only=True)[case]
    n_saved = 3
    # resumed from the checkpoint
    model = _Mixed()
    model.load_state_dict(data["checkpoint"]["model"])
    opt = make(model.parameters())
    opt.load_state_dict(data["checkpoint"]["optimizer"])
    flat_state = data["checkpoint"]["optimizer"]["state"]
    for k, p in enumerate(model.parameters()):
        st = opt.state[p]
        assert float(st["step"]) == n_saved and st["step"].dtype == torch.float32
        assert ("master_param" in st) is (p.dtype == torch.bfloat16)
        for name, v in st.items():
            assert v.is_contiguous() and v.untyped_storage().data_ptr() != \
                flat_state[k][name].untyped_storage().data_ptr(), name
    _train(model, opt, data["inputs"][n_saved:])
    resumed = model.state_dict()
    # a plain run from the same start
    plain = _Mixed()
    plain.load_state_dict(data["init"])
    _train(plain, make(plain.parameters()), data["inputs"])
    for name, want in data["continued"].items():
        assert torch.equal(resumed[name], want), name
        assert torch.equal(plain.state_dict()[name], want), name
