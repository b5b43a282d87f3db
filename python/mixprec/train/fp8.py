"""The FP8 precision level: torchao's Float8 linears under mixprec's trainer and manager.

``MixedPrecisionConfig(precision_level="fp8")`` converts the eligible ``nn.Linear`` layers with
``torchao.float8.convert_to_float8_training`` (recipe ``config.fp8_recipe``) and runs the rest of
the model in bfloat16 autocast (AUTOMATIC) or with bfloat16 params and float32 masters (MANUAL).
torchao is optional (``pip install "mixprec[fp8]"``); :func:`fp8_unavailable` says why not.

Eligible: an ``nn.Linear`` (not yet a ``Float8Linear``) with both dimensions multiples of 16
(float8 GEMMs need it) and, by default, not the model's first or last ``nn.Linear``
(``named_modules`` order), as torchao and torchtitan advise; a
``module_filter_fn(module, fqn) -> bool`` replaces that first/last rule.

Autocast. torchao's ``Float8Linear.forward`` casts its input to the *CUDA* autocast dtype only;
under CPU autocast the backward of ``rowwise_with_gw_hp`` fails on a bfloat16/float32 mismatch. So
every converted linear runs with autocast off and its floating inputs cast to the compute dtype
(bfloat16), on every device (on CUDA what torchao does itself: the same numbers).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn

from .._dtensor import is_dtensor
from ..amp.autocast import autocast
from ..amp.module_policy import ModuleForward, unwrap_forwards, wrap_forward

__all__ = ["FP8_INSTALL", "fp8_unavailable", "fp8_available", "fp8_info", "require_torchao",
           "fp8_eligible", "default_module_filter", "convert_model", "float8_linears",
           "Fp8Handle"]

#: what to install for the FP8 level
FP8_INSTALL = 'pip install "mixprec[fp8]" (or: pip install torchao>=0.18)'

#: a ``module_filter_fn``: ``(module, fully qualified name) -> convert it``
ModuleFilter = Callable[[nn.Module, str], bool]


def fp8_unavailable() -> Optional[str]:
    """``None`` when the FP8 level can run here; else why not (a sentence naming the
    install). Host only; imports torchao."""
    if not hasattr(torch, "float8_e4m3fn"):
        return f"this torch ({torch.__version__}) has no float8 dtypes"
    try:
        importlib.import_module("torchao.float8")
    except ImportError as e:
        return f"torchao is not installed or does not import ({e}); {FP8_INSTALL}"
    except Exception as e:  # a torchao built for another torch may fail otherwise
        return f"torchao does not import with torch {torch.__version__} ({e!r}); {FP8_INSTALL}"
    return None


def fp8_available() -> bool:
    """Whether ``precision_level="fp8"`` can run here (see :func:`fp8_unavailable`)."""
    return fp8_unavailable() is None


def fp8_info() -> dict[str, Any]:
    """For ``mixprec.info``: ``fp8`` (bool), ``fp8_torchao`` (its version or ``None``),
    ``fp8_detail`` (why not, or where float8 matmuls run fast)."""
    why = fp8_unavailable()
    if why is not None:
        return {"fp8": False, "fp8_torchao": None, "fp8_detail": why}
    version = getattr(importlib.import_module("torchao"), "__version__", "unknown")
    detail = "no GPU: float8 matmuls run on the CPU (correct, slow; for tests)"
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        detail = f"GPU sm{major}{minor}: " + (
            "float8 tensor cores" if (major, minor) >= (8, 9) else
            "no float8 tensor cores (sm89+ needed); torchao's matmuls will fail")
    return {"fp8": True, "fp8_torchao": version, "fp8_detail": detail}


def require_torchao() -> Any:
    """``torchao.float8``, or ImportError saying what to install."""
    try:
        return importlib.import_module("torchao.float8")
    except ImportError as e:
        raise ImportError(f'MixedPrecisionConfig(precision_level="fp8") needs torchao, which is '
                          f"not installed or does not import ({e}): {FP8_INSTALL}") from e


def _is_float8_linear(module: nn.Module) -> bool:
    return any(c.__name__ == "Float8Linear" for c in type(module).__mro__)


def fp8_eligible(module: nn.Module) -> bool:
    """An ``nn.Linear`` (not yet converted) with both dimensions multiples of 16."""
    return (isinstance(module, nn.Linear) and not _is_float8_linear(module)
            and module.in_features % 16 == 0 and module.out_features % 16 == 0)


def default_module_filter(model: nn.Module, keep_first_last: bool = True) -> ModuleFilter:
    """The default ``module_filter_fn`` for ``model``: every eligible linear, except (with
    ``keep_first_last``) the first and the last ``nn.Linear`` of the model."""
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    kept = {linears[0], linears[-1]} if keep_first_last and linears else set()
    return lambda module, fqn: fqn not in kept


def float8_linears(model: nn.Module) -> list[str]:
    """The qualified names of the model's ``Float8Linear`` modules."""
    return [name for name, m in model.named_modules() if _is_float8_linear(m)]


def convert_model(model: nn.Module, recipe: str = "tensorwise",
                  module_filter_fn: Optional[ModuleFilter] = None,
                  keep_first_last: bool = True) -> list[str]:
    """Convert ``model``'s eligible linears to torchao ``Float8Linear`` in place (what the
    FP8 level does at setup; call it yourself *before* ``fully_shard``); returns the names
    of the model's Float8 linears (converted now or before).

    ``module_filter_fn(module, fqn)``: which eligible linears to convert (default
    :func:`default_module_filter`); the multiple-of-16 rule always applies.
    Raises ImportError without torchao, ValueError for an unknown recipe, a root
    ``nn.Linear`` (torchao would return a new module) or a model sharded with
    ``fully_shard`` whose eligible linears are not converted yet.
    """
    from .config import FP8_RECIPES

    f8 = require_torchao()
    if recipe not in FP8_RECIPES:
        raise ValueError(f"fp8 recipe: expected one of {list(FP8_RECIPES)}, got {recipe!r}")
    if isinstance(model, nn.Linear):
        raise ValueError(
            "the FP8 level converts the nn.Linear layers inside a model; the model itself is "
            "an nn.Linear (wrap it, e.g. nn.Sequential(linear))")
    user = module_filter_fn or default_module_filter(model, keep_first_last)

    def chosen(module: nn.Module, fqn: str) -> bool:
        return fp8_eligible(module) and bool(user(module, fqn))

    todo = [(n, m) for n, m in model.named_modules() if n and chosen(m, n)]
    for name, m in todo:
        if any(is_dtensor(p) for p in m.parameters(recurse=False)):
            raise ValueError(
                f"precision_level=fp8: {name!r} is sharded (fully_shard) and not converted; "
                "convert before sharding: mixprec.train.fp8.convert_model(model, recipe) "
                "(with the same module filter), then fully_shard(model), then set up the "
                "trainer/manager with precision_level='fp8'")
    if todo:
        config = f8.Float8LinearConfig.from_recipe_name(recipe)
        f8.convert_to_float8_training(model, module_filter_fn=chosen, config=config)
    return float8_linears(model)


def _refuse_float8_all_gather(model: nn.Module) -> None:
    for name, p in model.named_parameters():
        inner = p.to_local() if is_dtensor(p) else p  # type: ignore[attr-defined]
        if type(inner) not in (nn.Parameter, Tensor) and "Float8" in type(inner).__name__:
            raise ValueError(
                f"precision_level=fp8: param {name!r} is a {type(inner).__name__} (torchao's "
                "enable_fsdp_float8_all_gather=True); the float8 all-gather is refused for now "
                "(unmeasured on GPU with mixprec's optimizers; gloo cannot all-gather float8): "
                "convert with enable_fsdp_float8_all_gather=False, as precision_level='fp8' does")


#: the input dtypes a Float8 linear's wrapper casts to the compute dtype
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class Fp8Handle:
    """The FP8 level on a model: its Float8 linears and their forward wrappers.

    Attributes: ``recipe`` (torchao's recipe name), ``modules`` (qualified names of the Float8
    linears), ``dtype`` (the dtype of their inputs and outputs, bfloat16).
    """

    def __init__(self, model: nn.Module, recipe: str, dtype: torch.dtype, device_type: str,
                 module_filter_fn: Optional[ModuleFilter] = None,
                 keep_first_last: bool = True) -> None:
        self.model, self.recipe, self.dtype = model, recipe, dtype
        self.modules = convert_model(model, recipe, module_filter_fn, keep_first_last)
        _refuse_float8_all_gather(model)
        self._installed: list[Any] = []
        by_name = dict(model.named_modules())
        for name in self.modules:  # autocast off, floating inputs cast to ``dtype``
            m = by_name[name]
            wrap_forward(self._installed, m, ModuleForward(
                m, m.__dict__.get("forward"), autocast(device_type, enabled=False),
                cast_inputs_to=dtype, cast_only=_FLOATS))

    def remove(self) -> None:
        """Take the forward wrappers off (the linears stay Float8; idempotent)."""
        unwrap_forwards(self._installed)
