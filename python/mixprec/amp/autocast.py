"""``mixprec.autocast``: :class:`torch.autocast` by precision name, re-entrant.

:class:`autocast` subclasses :class:`torch.autocast`, also takes ``precision="fp16" | "bf16"
| "fp32" | "auto"`` and can be re-entered while active (each exit restores what its enter
found). :func:`resolve_precision` maps a name to a dtype; :func:`cast_floating` casts the
16-bit tensors of a nested structure. Nothing here syncs with the device.
"""

from __future__ import annotations

import threading
from typing import Any, Optional, Sequence

import torch

__all__ = ["autocast", "resolve_precision", "PRECISIONS", "cast_floating"]

#: Accepted values of ``precision``.
PRECISIONS = ("fp16", "bf16", "fp32", "auto")

_NAME_TO_DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
_LOW = (torch.float16, torch.bfloat16)


def resolve_precision(device_type: str, precision: str) -> tuple[Optional[torch.dtype], bool]:
    """Map a precision name to ``(autocast dtype or None, needs_loss_scaling)``.

    ``"fp16"`` -> ``(float16, True)``; ``"bf16"`` -> ``(bfloat16, False)``; ``"fp32"`` ->
    ``(None, False)`` (autocast off); ``"auto"`` -> bfloat16 where supported, else float16
    with loss scaling (older CUDA GPUs), else fp32. Host only.
    """
    if precision not in PRECISIONS:
        raise ValueError(
            f"mixprec.autocast: precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "auto":
        if device_type != "cuda":
            supported = device_type in ("cpu", "xpu", "mps", "hpu")
            return (torch.bfloat16, False) if supported else (None, False)
        if not torch.cuda.is_available():
            return None, False
        return (torch.bfloat16, False) if torch.cuda.is_bf16_supported() else (torch.float16, True)
    dtype = _NAME_TO_DTYPE[precision]
    if dtype == torch.float32:
        return None, False
    return dtype, dtype == torch.float16


class autocast(torch.autocast):
    """:class:`torch.autocast` with a ``precision`` shortcut, re-entrant.

    Args:
        device_type: ``"cuda"``, ``"cpu"``, ... as for torch.
        dtype: the low-precision dtype (torch's keyword); must agree with ``precision``.
        enabled, cache_enabled: as torch.
        precision: ``"fp16"``, ``"bf16"``, ``"fp32"`` (autocast disabled) or ``"auto"``
            (:func:`resolve_precision`). ``None`` (default): use ``dtype``.

    Attributes:
        precision: the resolved name (``"fp16"``, ``"bf16"`` or ``"fp32"``).
        needs_loss_scaling: ``True`` when the region computes in float16.

    A context manager (also nested with itself) or a decorator; the saved states are
    thread-local, as torch's autocast state. No host sync.
    """

    def __init__(
        self,
        device_type: str = "cuda",
        dtype: Optional[torch.dtype] = None,
        enabled: bool = True,
        cache_enabled: Optional[bool] = None,
        *,
        precision: Optional[str] = None,
    ) -> None:
        needs_scaling = dtype == torch.float16
        if precision is not None:
            pdtype, needs_scaling = resolve_precision(device_type, precision)
            if pdtype is None:
                if dtype not in (None, torch.float32):
                    raise ValueError(
                        f"mixprec.autocast: precision={precision!r} disables autocast but "
                        f"dtype={dtype} was also given")
                enabled = False
            elif dtype is not None and dtype != pdtype:
                raise ValueError(
                    f"mixprec.autocast: dtype={dtype} conflicts with precision={precision!r} "
                    f"(which means {pdtype})")
            else:
                dtype = pdtype
        elif dtype == torch.float32:
            # torch would warn that float32 is unsupported; mean "no autocast"
            dtype, enabled = None, False
        super().__init__(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
        self.needs_loss_scaling: bool = bool(needs_scaling and self._enabled)
        names = {torch.float16: "fp16", torch.bfloat16: "bf16"}
        name = names.get(self.fast_dtype, str(self.fast_dtype))
        self.precision = name if self._enabled else "fp32"
        self._saved = threading.local()

    def _stack(self) -> list[tuple[Any, Any, Any]]:
        return self._saved.__dict__.setdefault("stack", [])  # this thread's

    def __enter__(self) -> autocast:  # type: ignore[override]
        super().__enter__()
        if not torch.jit.is_scripting():
            self._stack().append((self.prev_cache_enabled, self.prev, self.prev_fastdtype))
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> Any:  # type: ignore[override]
        stack = self._stack()
        if stack:
            self.prev_cache_enabled, self.prev, self.prev_fastdtype = stack.pop()
        return super().__exit__(exc_type, exc_val, exc_tb)

    def __getstate__(self) -> dict[str, Any]:
        # the per-thread stack of an active region is not copied (deepcopy/pickle)
        state = self.__dict__.copy()
        state.pop("_saved", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._saved = threading.local()

    def __repr__(self) -> str:
        return (f"mixprec.autocast(device_type={self.device!r}, precision={self.precision!r}, "
                f"dtype={self.fast_dtype}, enabled={self._enabled})")


def cast_floating(obj: Any, dtype: torch.dtype, only: Sequence[torch.dtype] = _LOW) -> Any:
    """Cast every tensor of a dtype in ``only`` inside ``obj`` to ``dtype``.

    ``obj``: a tensor or a nested tuple/list/dict; other values pass through. Returns new
    containers; other tensors are returned as they are (no copy).
    """
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.dtype in only and obj.dtype != dtype else obj
    if isinstance(obj, tuple):
        items = [cast_floating(o, dtype, only) for o in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    if isinstance(obj, list):
        return [cast_floating(o, dtype, only) for o in obj]
    if isinstance(obj, dict):
        return {k: cast_floating(v, dtype, only) for k, v in obj.items()}
    return obj


def _first_low_dtype(obj: Any) -> Optional[torch.dtype]:
    if isinstance(obj, torch.Tensor):
        return obj.dtype if obj.dtype in _LOW else None
    if isinstance(obj, (tuple, list, dict)):
        for o in obj.values() if isinstance(obj, dict) else obj:
            d = _first_low_dtype(o)
            if d is not None:
                return d
    return None
