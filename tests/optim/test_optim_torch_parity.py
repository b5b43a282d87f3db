"""What torch's own optimizer tests (pytorch test/test_optim.py) expect of an optimizer,
on mixprec's classes: non-param entries in ``state``, load_state_dict post hooks, sparse
grads, meta-device params, the wording of argument errors; and a checkpoint of the removed
flat-buffer mode loading into the plain optimizer."""

from __future__ import annotations

import io
from typing import Any, Dict, List

import pytest
import torch
from torch import nn

import mixprec
import mixprec.optim
from _helpers import assert_bitwise_equal, load_stored


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


_FLAT_CASES = [
    ("adamw", lambda ps: mixprec.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)),
    ("sgd", lambda ps: mixprec.optim.SGD(ps, lr=1e-2, momentum=0.9)),
]
_FLAT_STATE_NAMES = {"adamw": {"exp_avg", "exp_avg_sq"}, "sgd": {"momentum_buffer"}}


def _dense_copy(state_dict: Dict[str, Any]) -> Dict[str, Any]:
    """An optimizer ``state_dict`` as today's release writes it: every state tensor its own
    dense storage (no views of shared flat buffers)."""
    out = dict(state_dict)
    out["state"] = {k: {n: v.clone() for n, v in st.items()}
                    for k, st in state_dict["state"].items()}
    return out


def _states(opt: torch.optim.Optimizer) -> List[Dict[str, torch.Tensor]]:
    return [dict(opt.state[p]) for g in opt.param_groups for p in g["params"]]


@pytest.mark.parametrize("case,make", _FLAT_CASES)
def test_flat_buffer_checkpoint_loads_into_the_plain_optimizer(case: str, make: Any) -> None:
    """``tests/data/flat_buffer_checkpoint.pt`` was saved at 9471ec2 by an optimizer in
    the flat-buffer mode (its moments and masters views of flat state buffers, see
    tests/data/make_flat_buffer_checkpoint.py). It loads into the plain optimizer: every
    state tensor holds exactly the stored bits (written by mixprec's kernels, so they do
    not depend on the CPU), dense and not aliasing the checkpoint's buffers; and it then
    trains on exactly as the same state loaded from today's dense form does.

    Only bits computed here are compared with each other: the file's params and
    ``continued`` went through torch's CPU GEMMs on another machine, whose bits depend
    on the CPU, so they are checked for keys, dtypes and shapes only."""
    data = load_stored("flat_buffer_checkpoint.pt")[case]
    n_saved, n_inputs = 3, len(data["inputs"])
    saved = data["checkpoint"]["optimizer"]
    model = _Mixed()
    model.load_state_dict(data["checkpoint"]["model"])
    opt = make(model.parameters())
    opt.load_state_dict(saved)
    params = list(model.parameters())
    assert len(saved["state"]) == len(params)
    for k, (p, st) in enumerate(zip(params, _states(opt))):
        want = _FLAT_STATE_NAMES[case] | {"step"} | (
            {"master_param"} if p.dtype == torch.bfloat16 else set())
        assert set(st) == want == set(saved["state"][k]), (k, sorted(st))
        assert float(st["step"]) == n_saved and st["step"].dtype == torch.float32
        for name, v in st.items():
            stored = saved["state"][k][name]
            assert_bitwise_equal(v, stored, f"param {k} {name}")
            assert v.is_contiguous() and v.untyped_storage().data_ptr() != \
                stored.untyped_storage().data_ptr(), name
            if name != "step":
                assert v.shape == p.shape and v.dtype == torch.float32, name
    # the CPU-dependent parts of the file: their form only
    for key in ("init", "continued"):
        assert {n: (t.dtype, t.shape) for n, t in data[key].items()} == \
            {n: (t.dtype, t.shape) for n, t in model.state_dict().items()}, key
    # the same checkpoint in today's dense form, trained on here beside the flat one
    dense_model = _Mixed()
    dense_model.load_state_dict(data["checkpoint"]["model"])
    dense_opt = make(dense_model.parameters())
    dense_opt.load_state_dict(_dense_copy(saved))
    _train(model, opt, data["inputs"][n_saved:])
    _train(dense_model, dense_opt, data["inputs"][n_saved:])
    for name, t in model.state_dict().items():
        assert_bitwise_equal(t, dense_model.state_dict()[name], name)
    for k, (st, dense_st) in enumerate(zip(_states(opt), _states(dense_opt))):
        assert float(st["step"]) == n_inputs
        for name, v in st.items():
            assert_bitwise_equal(v, dense_st[name], f"param {k} {name}")


@pytest.mark.parametrize("case,make", _FLAT_CASES)
def test_plain_resume_trains_on_as_the_uninterrupted_run(case: str, make: Any) -> None:
    """The flat-buffer test's model and optimizer, trained here: a run checkpointed after
    three steps (``torch.save``/``torch.load``) and resumed in a fresh model and optimizer
    ends with the bits of the uninterrupted run from the same start."""
    torch.manual_seed(0 if case == "adamw" else 1)
    init = _Mixed().state_dict()
    inputs = torch.randn(5, 5, 6)
    plain = _Mixed()
    plain.load_state_dict(init)
    plain_opt = make(plain.parameters())
    _train(plain, plain_opt, inputs)
    first = _Mixed()
    first.load_state_dict(init)
    first_opt = make(first.parameters())
    _train(first, first_opt, inputs[:3])
    buf = io.BytesIO()
    torch.save({"model": first.state_dict(), "optimizer": first_opt.state_dict()}, buf)
    buf.seek(0)
    checkpoint = torch.load(buf, weights_only=True)
    resumed = _Mixed()
    resumed.load_state_dict(checkpoint["model"])
    resumed_opt = make(resumed.parameters())
    resumed_opt.load_state_dict(checkpoint["optimizer"])
    _train(resumed, resumed_opt, inputs[3:])
    for name, t in resumed.state_dict().items():
        assert_bitwise_equal(t, plain.state_dict()[name], name)
    for k, (st, plain_st) in enumerate(zip(_states(resumed_opt), _states(plain_opt))):
        assert set(st) == set(plain_st)
        for name, v in st.items():
            assert_bitwise_equal(v, plain_st[name], f"param {k} {name}")
