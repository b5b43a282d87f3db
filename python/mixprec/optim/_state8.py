"""8-bit optimizer state (``state_bits=8``), shared by Adam/AdamW and SGD.

A param with two or more dims and at least ``min_8bit_size`` elements keeps each of its
moments (the class's ``_MOMENTS8``: name, name of the maxima, code table) as uint8 codes of
the param's shape plus float32 block maxima of shape ``(rows, blocks per row)``
(:mod:`mixprec.optim._quant8`: the blocks lie inside rows), and ``state["quant"] = QUANT``
names the layout. Any other param keeps float32 moments and empty maxima (so that every
param of a bucket has an entry in every list): a 1-D param (a bias, a norm's weight)
because a sharding may cut it anywhere. The step runs the class's 8-bit op on the 8-bit
params of a bucket (:func:`split_coded`) and its usual op on the rest.

Checkpoints: the codes, the maxima and ``quant`` are saved as they are, and load as they
are when the loading optimizer keeps that param in 8 bits (bit for bit, at any sharding:
DCP reshards the rows); otherwise loading converts to the loading optimizer's layout (a
float32 moment is quantized, codes are read back to float32). A checkpoint of the previous
layout (:data:`FLAT_QUANT`: blocks over the flattened tensor) is converted: exactly where
its blocks are the rows' blocks, else requantized from the decoded values with a warning.
Every 8-bit entry is checked first (:meth:`_check_loadable`), so a corrupted one changes
nothing.
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from .. import _dtensor
from . import _quant8 as q8
from ._base import Bucket, float32_copy

__all__ = ["QUANT", "FLAT_QUANT", "EightBitState", "check_state_bits",
           "split_coded"]

#: what a quantized param's state records under "quant": the code tables of
#: mixprec.optim._quant8, blocks of 256 inside rows
QUANT = "dynamic8/rows/b256"
#: the previous layout (before the row layout): blocks of 256 over the flattened tensor,
#: and for a DTensor param over each rank's shard
FLAT_QUANT = "dynamic8/b256"


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
        ``p`` of two or more dims and big enough)."""
        return (group.get("state_bits", 32) == 8 and bool(self._moments8(group))
                and p.dim() >= 2 and p.numel() >= group.get("min_8bit_size", 4096))

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
        # Codes of this layout that stay 8-bit load as they are (laid out like p); any
        # other 8-bit moment is read back to float32 first (whole, or this rank's part of
        # a DTensor), and the base class moves and shards the floats as usual
        saved = dict(saved)
        layout = saved.pop("quant", None)
        quantized = self._quantized(p, group)
        kept: Dict[str, Tensor] = {}
        for name, absname, table in self._MOMENTS8:
            v = saved.get(name)
            a = saved.pop(absname, None)
            if not (isinstance(v, Tensor) and v.dtype == torch.uint8):
                continue
            if quantized and layout == QUANT:
                del saved[name]
                kept[name], kept[absname] = _rows_like(v, p), _rows_like(a, p)
            elif quantized and layout == FLAT_QUANT and _flat_blocks_are_rows(v):
                del saved[name]  # the old blocks are this layout's: the same codes
                kept[name] = _rows_like(v, p)
                kept[absname] = _rows_like(a.reshape(q8.absmax_shape(v.shape)), p)
            else:
                saved[name] = read_back(v, a, table, p, layout)
                if quantized and layout == FLAT_QUANT:
                    _warn_requantized(name, tuple(v.shape))
        out = super()._convert_state(p, group, saved)  # type: ignore[misc]
        out.update(kept)
        moments8 = self._moments8(group) if group.get("state_bits", 32) == 8 else ()
        if not moments8:  # 32-bit state
            return out
        for name, absname, table in moments8:
            if name in kept:
                continue
            m = out.get(name)
            if m is None:
                m = torch.zeros_like(p, dtype=torch.float32)
            if quantized:
                out[name], out[absname] = quantize_state(m.float(), table, p)
            else:
                out[name] = m.float()
                out[absname] = torch.zeros(0, dtype=torch.float32, device=p.device)
        if quantized:
            out["quant"] = QUANT
        return out

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
            layout = st.get("quant")
            if layout not in (QUANT, FLAT_QUANT):
                raise ValueError(f"{where}: unknown 8-bit layout {layout!r} "
                                 f"(this version reads {QUANT!r} and {FLAT_QUANT!r})")
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
                if layout == QUANT:
                    want: Tuple[int, ...] = q8.absmax_shape(c.shape)
                elif _dtensor.is_dtensor(c):
                    _check_flat_sharded(where, c, p)
                    want = tuple(a.shape) if isinstance(a, Tensor) and a.dim() == 1 else (-1,)
                else:
                    want = (q8.num_blocks(n),)
                if not (isinstance(a, Tensor) and a.dtype == torch.float32
                        and tuple(a.shape) == want):
                    raise ValueError(f"{where}[{absname!r}]: expected float32 of shape "
                                     f"{list(want)} ({layout!r} layout), got "
                                     f"{getattr(a, 'dtype', a)} of shape "
                                     f"{list(getattr(a, 'shape', []))}")


def _flat_blocks_are_rows(codes: Tensor) -> bool:
    """Whether the previous layout's blocks (256 over the flattened tensor) are this
    layout's (256 inside rows) for codes of this shape: rows a multiple of 256 long, or
    one row. Never for DTensor codes (their blocks ran over each rank's shard)."""
    return (not _dtensor.is_dtensor(codes)
            and (codes.dim() < 2 or q8.row_length(codes.shape) % q8.BLOCK == 0))


def _warn_requantized(name: str, shape: Tuple[int, ...]) -> None:
    warnings.warn(f"mixprec.optim: state {name!r} of shape {list(shape)} was saved in the "
                  f"previous 8-bit layout ({FLAT_QUANT!r}: blocks over the flattened "
                  f"tensor), whose blocks are not this version's ({QUANT!r}: blocks inside "
                  "rows); it was requantized from its decoded values (within the 8-bit "
                  "error bound, not bit for bit). Save again to keep the new layout.",
                  UserWarning, stacklevel=2)


def _check_flat_sharded(where: str, codes: Tensor, p: Optional[Tensor]) -> None:
    """Codes of the previous layout saved from a sharded optimizer: their blocks ran over
    each rank's shard, so they read back only at the sharding they were saved with."""
    if p is not None and _dtensor.is_dtensor(p) and codes.device_mesh == p.device_mesh \
            and tuple(codes.placements) == tuple(p.placements):
        return
    saved = f"{list(codes.placements)} over {codes.device_mesh.size()} ranks"
    now = (f"{list(p.placements)} over {p.device_mesh.size()} ranks"
           if p is not None and _dtensor.is_dtensor(p) else "unsharded")
    raise ValueError(
        f"{where}: 8-bit state of the previous layout ({FLAT_QUANT!r}, blocks over each "
        f"rank's shard), saved sharded as {saved}, cannot be read into a param sharded as "
        f"{now}: its blocks depend on the sharding. Load it where it was saved (the same "
        f"world size and mesh), then save again: this version writes {QUANT!r}, which "
        "reloads at any world size")


def _rows_like(t: Tensor, p: Tensor) -> Tensor:
    """Saved codes or maxima of this layout (rows as ``p``'s) placed like ``p``: a copy on
    its device, and for a DTensor param sharded by rows as ``p`` is."""
    if not _dtensor.is_dtensor(p):
        whole = t.full_tensor() if _dtensor.is_dtensor(t) else t
        return whole.detach().to(p.device, copy=True)
    if _dtensor.is_dtensor(t):
        if t.device_mesh == p.device_mesh and tuple(t.placements) == tuple(p.placements):
            return t.detach().clone()  # (the optimizer's own, as the base class copies)
        return t.redistribute(p.device_mesh, p.placements)
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(t.detach().to(p.device), p.device_mesh, p.placements,
                             src_data_rank=None)


# -- DTensor (FSDP2) params ---------------------------------------------------------------
#
# The blocks lie inside rows (mixprec.optim._quant8), and FSDP2 shards a param by rows
# (Shard(0)), so a rank's codes and maxima are exactly the rows of the whole tensor's. Both
# are DTensors laid out like the param (the maxima have shape (rows, blocks per row)), and
# DCP reshards them as it reshards the param: an 8-bit checkpoint reloads at any world size.


def _check_rows_sharded(p: Tensor) -> None:
    """8-bit state of a DTensor param needs the param sharded by rows (FSDP2's default)."""
    from torch.distributed.tensor import Shard

    for pl in p.placements:
        if isinstance(pl, Shard) and pl.dim != 0:
            raise ValueError(f"mixprec.optim: state_bits=8 takes DTensor params sharded "
                             f"on dim 0 (FSDP2's default), got {p.placements}")


def absmax_like(p: Tensor, local: Tensor) -> Tensor:
    """This rank's block maxima ``local`` (its rows' maxima) of DTensor param ``p`` as a
    DTensor laid out like ``p``, of global shape ``absmax_shape(p.shape)``."""
    from torch.distributed.tensor import DTensor

    _check_rows_sharded(p)
    shape = q8.absmax_shape(p.shape)
    stride = (shape[1], 1) if len(shape) == 2 else (1,)
    return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False,
                              shape=torch.Size(shape), stride=stride)


def zero_state(p: Tensor, table: str) -> Tuple[Tensor, Tensor]:
    """(codes, maxima) of a zero moment of ``p``, as ``quantize_state`` of zeros gives
    them (without its work: traceable by ``torch.compile``)."""
    if _dtensor.is_dtensor(p):
        codes = torch.full_like(p, q8.zero_code(table), dtype=torch.uint8)
        local = torch.zeros(q8.absmax_shape(_dtensor.local(p).shape), device=p.device)
        return codes, absmax_like(p, local)
    return (torch.full(p.shape, q8.zero_code(table), dtype=torch.uint8, device=p.device),
            torch.zeros(q8.absmax_shape(p.shape), dtype=torch.float32, device=p.device))


def quantize_state(x: Tensor, table: str, p: Tensor) -> Tuple[Tensor, Tensor]:
    """(codes, maxima) of float32 state ``x`` of param ``p``: for a DTensor param, of this
    rank's rows, as DTensors laid out as ``p`` and as :func:`absmax_like`."""
    if not _dtensor.is_dtensor(p):
        return q8.quantize(x, table)
    from torch.distributed.tensor import DTensor

    local = _dtensor.local(x) if _dtensor.is_dtensor(x) else _dtensor.local(
        _dtensor.shard_like(x, p, "state"))
    codes, absmax = q8.quantize(local, table)
    return (DTensor.from_local(codes, p.device_mesh, p.placements, run_check=False,
                               shape=p.shape, stride=p.stride()),
            absmax_like(p, absmax))


def read_back(codes: Tensor, absmax: Any, table: str, p: Tensor,
              layout: Optional[str] = QUANT) -> Tensor:
    """The float32 values of saved codes: a whole tensor for plain codes, this rank's part
    (a DTensor laid out as the codes) for DTensor codes. ``layout``: the saved ``quant``
    (:data:`QUANT`, or :data:`FLAT_QUANT`, whose DTensor maxima are per shard, padded)."""
    flat = layout == FLAT_QUANT
    if not _dtensor.is_dtensor(codes):
        codes, absmax = codes.to(p.device), absmax.to(p.device)
        return _dequantize_flat(codes, absmax, table) if flat else q8.dequantize(
            codes, absmax, table)
    from torch.distributed.tensor import DTensor

    local = _dtensor.local(codes)
    a = _dtensor.local(absmax).to(local.device)
    values = (_dequantize_flat(local, a[:q8.num_blocks(local.numel())], table) if flat
              else q8.dequantize(local, a, table))
    return DTensor.from_local(values, codes.device_mesh, codes.placements, run_check=False,
                              shape=codes.shape, stride=codes.stride())


def _dequantize_flat(codes: Tensor, absmax: Tensor, table: str) -> Tensor:
    """:data:`FLAT_QUANT`'s read-back: the blocks run over the flattened tensor."""
    return q8.dequantize(codes.reshape(-1), absmax, table).view(codes.shape)
