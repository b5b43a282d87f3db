"""8-bit optimizer state (``state_bits=8``), shared by Adam/AdamW and SGD.

A param with at least ``min_8bit_size`` elements keeps each of its moments (the class's
``_MOMENTS8``: name, name of the maxima, code table) as uint8 codes of the param's shape
plus float32 block maxima (:mod:`mixprec.ops._quant8`), and ``state["quant"] = QUANT``
names the layout. A smaller param keeps float32 moments and empty maxima (so that every
param of a bucket has an entry in every list). The step runs the class's ``_run8`` on the
8-bit params of a bucket (:func:`split_coded`) and its usual op on the rest.

Checkpoints: the codes, the maxima and ``quant`` are saved as they are; loading converts
to the loading optimizer's ``state_bits`` (a float32 moment is quantized, codes are read
back to float32), after every 8-bit entry of the dict was checked (:meth:`_check_coded`),
so a corrupted one changes nothing.
"""

from __future__ import annotations

from typing import Any, ClassVar, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from .. import _dtensor
from .. import flat as _flat
from ..ops import _quant8 as q8

__all__ = ["QUANT", "EightBitState", "check_state_bits", "split_coded"]

#: what a quantized param's state records under "quant": the code tables of
#: mixprec.ops._quant8 and the block size
QUANT = "dynamic8/b256"

Bucket = Dict[str, List[Tensor]]


def check_state_bits(cls: str, state_bits: Any, min_8bit_size: Any) -> None:
    """The constructors' checks of ``state_bits`` and ``min_8bit_size`` (ValueError)."""
    if state_bits not in (8, 32) or isinstance(state_bits, bool):
        raise ValueError(f"mixprec.optim.{cls}: state_bits must be 8 or 32, got "
                         f"{state_bits!r}")
    if not (isinstance(min_8bit_size, int) and min_8bit_size >= 0):
        raise ValueError(f"mixprec.optim.{cls}: min_8bit_size must be an int >= 0, got "
                         f"{min_8bit_size!r}")


def split_coded(bucket: Bucket, group: Dict[str, Any], first: str
                ) -> Tuple[Optional[Bucket], Bucket]:
    """``(the bucket's 8-bit params, the rest)``, told apart by the dtype of moment
    ``first``; ``(None, bucket)`` when none is 8-bit."""
    if group.get("state_bits", 32) != 8 or first not in bucket:
        return None, bucket
    coded = [c.dtype == torch.uint8 for c in bucket[first]]
    if not any(coded):
        return None, bucket

    def part(keep: bool) -> Bucket:
        return {k: [t for t, c in zip(v, coded) if c == keep] if v else v
                for k, v in bucket.items()}

    return part(True), part(False)


class EightBitState:
    """Mixin of a :class:`~mixprec.optim.FusedOptimizer` subclass with 8-bit moments."""

    _MOMENTS8: ClassVar[Tuple[Tuple[str, str, str], ...]] = ()

    state: Any
    param_groups: List[Dict[str, Any]]

    def _moments8(self, group: Dict[str, Any]) -> Tuple[Tuple[str, str, str], ...]:
        """The 8-bit moments this group keeps (its ``_state_names``)."""
        names = self._state_names(group)  # type: ignore[attr-defined]
        return tuple(m for m in self._MOMENTS8 if m[0] in names)

    def _quantized(self, p: Tensor, group: Dict[str, Any]) -> bool:
        """Whether ``p``'s moments are 8-bit (``state_bits=8``, a moment to keep, and
        ``p`` big enough)."""
        return (group.get("state_bits", 32) == 8 and bool(self._moments8(group))
                and p.numel() >= group.get("min_8bit_size", 4096))

    def _init_state(self, p: Tensor, group: Dict[str, Any]) -> Dict[str, Any]:
        moments = self._moments8(group)
        if group.get("state_bits", 32) != 8 or not moments:
            return super()._init_state(p, group)  # type: ignore[misc]
        cls = type(self).__name__
        if _dtensor.is_dtensor(p):
            raise RuntimeError(f"mixprec.optim.{cls}: state_bits=8 does not take DTensor "
                               "(FSDP2) params yet; use state_bits=32")
        if _flat.any_flat([p]):
            raise RuntimeError(f"mixprec.optim.{cls}: state_bits=8 does not combine with "
                               "flat buffers yet; use state_bits=32 or no flat_buffers")
        state = self.state[p]
        if "step" not in state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
        if state.get(moments[0][0]) is None:
            if self._quantized(p, group):
                for name, absname, table in moments:
                    state[name], state[absname] = q8.quantize(
                        torch.zeros(p.shape, device=p.device), table)
                state["quant"] = QUANT
            else:  # small: float32 moments, empty maxima (one list per name in the op)
                for name, absname, _ in moments:
                    state[name] = torch.zeros_like(p, dtype=torch.float32,
                                                   memory_format=torch.preserve_format)
                    state[absname] = torch.zeros(0, dtype=torch.float32, device=p.device)
        if self._wants_master(p, group) and state.get("master_param") is None:  # type: ignore[attr-defined]
            state["master_param"] = p.detach().to(torch.float32, copy=True)
        return state

    def _convert_state(self, p: Tensor, group: Dict[str, Any],
                       saved: Dict[str, Any]) -> Dict[str, Any]:
        out = super()._convert_state(p, group, saved)  # type: ignore[misc]
        moments: Dict[str, Optional[Tensor]] = {}
        for name, absname, table in self._MOMENTS8:
            v = out.get(name)
            if isinstance(v, Tensor) and v.dtype == torch.uint8:  # 8-bit: read it back
                v = q8.dequantize(v, out[absname], table)
            moments[name] = v
            out.pop(absname, None)
        out.pop("quant", None)
        moments8 = self._moments8(group) if group.get("state_bits", 32) == 8 else ()
        if not moments8:  # 32-bit state
            out.update({k: v for k, v in moments.items() if v is not None})
            return out
        for name, absname, table in moments8:
            m = moments[name]
            if m is None:
                m = torch.zeros(p.shape, device=p.device)
            if self._quantized(p, group):
                out[name], out[absname] = q8.quantize(m, table)
            else:
                out[name] = m.float()
                out[absname] = torch.zeros(0, dtype=torch.float32, device=p.device)
        if self._quantized(p, group):
            out["quant"] = QUANT
        return out

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """As :meth:`FusedOptimizer.load_state_dict`; moments are converted to this
        optimizer's ``state_bits`` (a 32-bit checkpoint, mixprec's or torch's, loads into
        an 8-bit optimizer and the other way round), which each group keeps. Every 8-bit
        entry is checked before anything is loaded: ValueError naming it otherwise."""
        self._check_coded(state_dict)
        bits = [g.get("state_bits", 32) for g in self.param_groups]
        super().load_state_dict(state_dict)  # type: ignore[misc]
        for g, b in zip(self.param_groups, bits):
            g["state_bits"] = b
        # (super converted with the saved groups' state_bits: convert again now)
        group_of = {id(p): g for g in self.param_groups for p in g["params"]}
        for p, st in list(self.state.items()):
            self.state[p] = self._convert_state(p, group_of[id(p)], st)

    def _check_coded(self, state_dict: Dict[str, Any]) -> None:
        cls = type(self).__name__
        params = [p for g in self.param_groups for p in g["params"]]
        keys = [k for g in state_dict.get("param_groups", []) for k in g.get("params", [])]
        index = dict(zip(keys, params))
        for key, st in state_dict.get("state", {}).items():
            if not isinstance(st, dict):
                continue
            coded = [m for m in self._MOMENTS8
                     if isinstance(st.get(m[0]), Tensor) and st[m[0]].dtype == torch.uint8]
            if not coded:
                continue
            where = f"mixprec.optim.{cls}.load_state_dict: state[{key!r}]"
            if st.get("quant") != QUANT:
                raise ValueError(f"{where}: unknown 8-bit layout {st.get('quant')!r} "
                                 f"(this version reads {QUANT!r})")
            p = index.get(key)
            n = p.numel() if p is not None else st[coded[0][0]].numel()
            for name, absname, _ in self._MOMENTS8:
                if name not in st:
                    continue
                c, a = st.get(name), st.get(absname)
                if not (isinstance(c, Tensor) and c.dtype == torch.uint8 and c.numel() == n
                        and (p is None or c.shape == p.shape)):
                    raise ValueError(f"{where}[{name!r}]: expected uint8 codes of "
                                     f"{n} elements, got {getattr(c, 'dtype', c)} of shape "
                                     f"{list(getattr(c, 'shape', []))}")
                if not (isinstance(a, Tensor) and a.dtype == torch.float32
                        and tuple(a.shape) == (q8.num_blocks(n),)):
                    raise ValueError(f"{where}[{absname!r}]: expected float32 of shape "
                                     f"[{q8.num_blocks(n)}], got {getattr(a, 'dtype', a)} "
                                     f"of shape {list(getattr(a, 'shape', []))}")
