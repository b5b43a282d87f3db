"""8-bit optimizer state (``state_bits=8``), shared by Adam/AdamW and SGD.

A param with at least ``min_8bit_size`` elements keeps each of its moments (the class's
``_MOMENTS8``: name, name of the maxima, code table) as uint8 codes of the param's shape
plus float32 block maxima (:mod:`mixprec.optim._quant8`), and ``state["quant"] = QUANT``
names the layout. A smaller param keeps float32 moments and empty maxima (so that every
param of a bucket has an entry in every list). The step runs the class's 8-bit op on the
8-bit params of a bucket (:func:`split_coded`) and its usual op on the rest.

Checkpoints: the codes, the maxima and ``quant`` are saved as they are; loading converts
to the loading optimizer's ``state_bits`` (a float32 moment is quantized, codes are read
back to float32), after every 8-bit entry of the dict was checked (:meth:`_check_loadable`),
so a corrupted one changes nothing.
"""

from __future__ import annotations

from typing import Any, ClassVar, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from .. import _dtensor
from . import _quant8 as q8
from ._base import Bucket, float32_copy

__all__ = ["QUANT", "EightBitState", "check_state_bits", "split_coded"]

#: what a quantized param's state records under "quant": the code tables of
#: mixprec.optim._quant8 and the block size
QUANT = "dynamic8/b256"


def check_state_bits(cls: str, state_bits: Any, min_8bit_size: Any) -> None:
    """The constructors' checks of ``state_bits`` and ``min_8bit_size`` (ValueError)."""
    if state_bits not in (8, 32) or isinstance(state_bits, bool):
        raise ValueError(f"mixprec.optim.{cls}: state_bits must be 8 or 32, got "
                         f"{state_bits!r}")
    if not (isinstance(min_8bit_size, int) and min_8bit_size >= 0):
        raise ValueError(f"mixprec.optim.{cls}: min_8bit_size must be an int >= 0, got "
                         f"{min_8bit_size!r}")


def split_coded(bucket: Bucket, first: str) -> Tuple[Optional[Bucket], Bucket]:
    """``(the bucket's 8-bit params, the rest)``, told apart by the dtype of moment
    ``first``; ``(None, bucket)`` when none is 8-bit."""
    if first not in bucket:
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
        """The 8-bit moments this group keeps (its ``state_names``)."""
        names = self.state_names(group)  # type: ignore[attr-defined]
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
        state = self.state[p]
        if "step" not in state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
        if state.get(moments[0][0]) is None:
            if self._quantized(p, group):
                for name, absname, table in moments:
                    state[name], state[absname] = zero_state(p, table)
                state["quant"] = QUANT
            else:  # small: float32 moments, empty maxima (one list per name in the op)
                for name, absname, _ in moments:
                    state[name] = torch.zeros_like(p, dtype=torch.float32,
                                                   memory_format=torch.preserve_format)
                    state[absname] = torch.zeros(0, dtype=torch.float32, device=p.device)
        if self.keeps_master(p, group) and state.get("master_param") is None:  # type: ignore[attr-defined]
            state["master_param"] = float32_copy(p)
        return state

    def _convert_state(self, p: Tensor, group: Dict[str, Any],
                       saved: Dict[str, Any]) -> Dict[str, Any]:
        # 8-bit moments are read back to float32 first (whole, or this rank's shard of a
        # DTensor param); the base class then moves and shards the floats as usual
        saved = dict(saved)
        for name, absname, table in self._MOMENTS8:
            v = saved.get(name)
            a = saved.pop(absname, None)
            if isinstance(v, Tensor) and v.dtype == torch.uint8:
                saved[name] = read_back(v, a, table, p)
        saved.pop("quant", None)
        out = super()._convert_state(p, group, saved)  # type: ignore[misc]
        moments8 = self._moments8(group) if group.get("state_bits", 32) == 8 else ()
        if not moments8:  # 32-bit state
            return out
        for name, absname, table in moments8:
            m = out.get(name)
            if m is None:
                m = torch.zeros_like(p, dtype=torch.float32)
            if self._quantized(p, group):
                out[name], out[absname] = quantize_state(m.float(), table, p)
            else:
                out[name] = m.float()
                out[absname] = torch.zeros(0, dtype=torch.float32, device=p.device)
        if self._quantized(p, group):
            out["quant"] = QUANT
        return out

    def _local_state(self, name: str, t: Tensor, p: Tensor) -> Tensor:
        """The tensor the kernels take for state ``name`` of DTensor param ``p``: the local
        shard, and for block maxima only this shard's blocks (see :func:`absmax_like`)."""
        local = _dtensor.local(t)
        if name.endswith("_absmax") and _dtensor.is_dtensor(t):
            return local[:q8.num_blocks(_dtensor.local(p).numel())]
        return local

    #: A loaded state dict keeps each group's ``state_bits`` (FusedOptimizer.load_state_dict):
    #: moments are converted to it (a 32-bit checkpoint, mixprec's or torch's, loads into
    #: an 8-bit optimizer and the other way round).
    _KEPT_ON_LOAD = ("state_bits",)

    def _check_loadable(self, state_dict: Dict[str, Any]) -> None:
        """Every 8-bit entry of ``state_dict`` is checked before anything is loaded:
        ValueError naming it otherwise."""
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
                want = (q8.num_blocks(n),)
                if _dtensor.is_dtensor(c) and p is not None and _dtensor.is_dtensor(p):
                    want = (_absmax_layout(p)[2],)  # a sharded optimizer's (absmax_like)
                if not (isinstance(a, Tensor) and a.dtype == torch.float32
                        and tuple(a.shape) == want):
                    raise ValueError(f"{where}[{absname!r}]: expected float32 of shape "
                                     f"{list(want)}, got {getattr(a, 'dtype', a)} "
                                     f"of shape {list(getattr(a, 'shape', []))}")


# -- DTensor (FSDP2) params ---------------------------------------------------------------
#
# The blocks of a DTensor param's 8-bit state run over its local shard (the kernels see
# only the shard), so each rank has its own maxima. To be a DTensor that DCP can save and
# load, the maxima of every rank are padded to the largest shard's count B and laid out as
# one global tensor of S * B elements (S: the ranks a param is sharded over), Shard(0)
# over the param's Shard dimensions and Replicate over the others. A checkpoint of 8-bit
# DTensor state therefore reloads at the same sharding; an unsharded checkpoint (8- or
# 32-bit) loads at any.


def _absmax_layout(p: Tensor) -> Tuple[List[Any], int, int]:
    """(placements, padded blocks per rank B, global length S * B) of the maxima of DTensor
    param ``p`` (Shard(0) params only, as FSDP2 shards them)."""
    from torch.distributed.tensor import Replicate, Shard

    shards = 1
    placements: List[Any] = []
    for dim, pl in enumerate(p.placements):
        if isinstance(pl, Shard):
            if pl.dim != 0:
                raise ValueError(f"mixprec.optim: state_bits=8 takes DTensor params sharded "
                                 f"on dim 0 (FSDP2's default), got {p.placements}")
            shards *= p.device_mesh.size(dim)
            placements.append(Shard(0))
        else:
            placements.append(Replicate())
    rows = p.shape[0] if p.dim() else 1
    per_row = p.numel() // rows if rows else 0
    padded = q8.num_blocks(-(-rows // shards) * per_row)
    return placements, padded, shards * padded


def absmax_like(p: Tensor, local: Tensor) -> Tensor:
    """This rank's block maxima ``local`` of DTensor param ``p`` as the padded global
    DTensor described above."""
    from torch.distributed.tensor import DTensor

    placements, padded, total = _absmax_layout(p)
    buf = torch.zeros(padded, dtype=torch.float32, device=local.device)
    buf[:local.numel()] = local
    return DTensor.from_local(buf, p.device_mesh, placements, run_check=False,
                              shape=torch.Size([total]), stride=(1,))


def zero_state(p: Tensor, table: str) -> Tuple[Tensor, Tensor]:
    """(codes, maxima) of a zero moment of ``p``, as ``quantize_state`` of zeros gives
    them (without its work: traceable by ``torch.compile``)."""
    if _dtensor.is_dtensor(p):
        codes = torch.full_like(p, q8.zero_code(table), dtype=torch.uint8)
        local = torch.zeros(q8.num_blocks(_dtensor.local(p).numel()), device=p.device)
        return codes, absmax_like(p, local)
    return (torch.full(p.shape, q8.zero_code(table), dtype=torch.uint8, device=p.device),
            torch.zeros(q8.num_blocks(p.numel()), dtype=torch.float32, device=p.device))


def quantize_state(x: Tensor, table: str, p: Tensor) -> Tuple[Tensor, Tensor]:
    """(codes, maxima) of float32 state ``x`` of param ``p``: for a DTensor param, of this
    rank's shard, as DTensors laid out as ``p`` and as :func:`absmax_like`."""
    if not _dtensor.is_dtensor(p):
        return q8.quantize(x, table)
    from torch.distributed.tensor import DTensor

    local = _dtensor.local(x) if _dtensor.is_dtensor(x) else _dtensor.local(
        _dtensor.shard_like(x, p, "state"))
    codes, absmax = q8.quantize(local, table)
    return (DTensor.from_local(codes, p.device_mesh, p.placements, run_check=False,
                               shape=p.shape, stride=p.stride()),
            absmax_like(p, absmax))


def read_back(codes: Tensor, absmax: Any, table: str, p: Tensor) -> Tensor:
    """The float32 values of saved codes: a whole tensor for plain codes, this rank's shard
    (as a DTensor laid out as ``p``) for DTensor codes, whose maxima are per shard."""
    if not _dtensor.is_dtensor(codes):
        return q8.dequantize(codes.to(p.device), absmax.to(p.device), table)
    from torch.distributed.tensor import DTensor

    if codes.device_mesh != p.device_mesh or tuple(codes.placements) != tuple(p.placements):
        raise ValueError(f"mixprec.optim: 8-bit DTensor state reloads at the sharding it was "
                         f"saved with ({codes.placements}), not {p.placements}; load it into "
                         "an optimizer sharded the same way")
    local = _dtensor.local(codes)
    a = _dtensor.local(absmax)[:q8.num_blocks(local.numel())]
    values = q8.dequantize(local, a.to(local.device), table)
    return DTensor.from_local(values, p.device_mesh, p.placements, run_check=False,
                              shape=p.shape, stride=p.stride())
