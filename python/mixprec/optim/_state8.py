"""8-bit optimizer state (``state_bits=8``), shared by Adam/AdamW and SGD.

A param of two or more dims and at least ``min_8bit_size`` elements keeps each moment of
the class's ``_MOMENTS8`` (name, maxima's name, code table) as uint8 codes of its shape and
float32 block maxima of shape ``(rows, blocks per row)`` (:mod:`mixprec.optim._quant8`),
with ``state["quant"] = QUANT``. Other params (1-D ones: a sharding may cut them anywhere)
keep float32 moments and empty maxima. A step runs the 8-bit op on a bucket's 8-bit params
and the usual op on the rest.

Checkpoints save codes, maxima and ``quant`` as they are; they load as they are where the
loading optimizer keeps the param in 8 bits (bit for bit, at any sharding), else converted
(quantized, or read back to float32). The previous layout (:data:`FLAT_QUANT`) converts
exactly where its blocks are rows' blocks, else is requantized with a warning (read until
mixprec 0.3.0, which retires it). Every 8-bit
entry is checked first (:meth:`_check_loadable`), so a corrupt one changes nothing.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, ClassVar, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from .. import _dtensor
from .._step import StepScalars
from . import _quant8 as q8
from . import _sr
from ._base import Bucket

__all__ = ["QUANT", "FLAT_QUANT", "EightBitState", "split_coded"]

#: a quantized param's state["quant"]: mixprec.optim._quant8's tables, blocks inside rows
QUANT = "dynamic8/rows/b256"
#: the previous layout: blocks over the flattened tensor (a DTensor: over each shard); its
#: loader is kept through the 0.2 releases and retired in mixprec 0.3.0
FLAT_QUANT = "dynamic8/b256"


def split_coded(bucket: Bucket, first: str) -> Tuple[Optional[Bucket], Bucket]:
    """``(the bucket's 8-bit params by moment ``first``'s dtype, the rest)``; ``(None,
    bucket)`` when none is 8-bit."""
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
        """The 8-bit moments of the group's ``state_names`` (none unless ``state_bits=8``)."""
        names = (self.state_names(group)  # type: ignore[attr-defined]
                 if group.get("state_bits", 32) == 8 else ())
        return tuple(m for m in self._MOMENTS8 if m[0] in names)

    def _quantized(self, p: Tensor, group: Dict[str, Any]) -> bool:
        """Whether ``p``'s moments are 8-bit (``state_bits=8``, ``p`` 2-D+ and big enough)."""
        return (bool(self._moments8(group)) and p.dim() >= 2
                and p.numel() >= group.get("min_8bit_size", 4096))

    def _init_state(self, p: Tensor, group: Dict[str, Any]) -> Dict[str, Any]:
        # the 8-bit moments (small params: float32, empty maxima); the rest in the base class
        moments = self._moments8(group)
        state = self.state[p]
        if moments and state.get(moments[0][0]) is None:
            if "step" not in state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            quantized = self._quantized(p, group)
            for name, absname, table in moments:
                state[name], state[absname] = zero_state(p, table) if quantized else (
                    torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format),
                    torch.zeros(0, dtype=torch.float32, device=p.device))
            if quantized:
                state["quant"] = QUANT
        return super()._init_state(p, group)  # type: ignore[misc]

    def _run_split(self, bucket: Bucket, group: Dict[str, Any], scalars: StepScalars,
                   args: Dict[str, Any], op8: Callable[..., None], lists8: Dict[str, str],
                   op: Callable[..., None], lists: Dict[str, str], **only32: Any) -> None:
        """The step of one bucket: ``op8`` on its 8-bit params, ``op`` on the rest.
        ``lists``: the op's state-list arguments -> bucket keys (absent keys: ``[]``);
        ``only32``: keyword arguments of ``op`` only."""
        coded, rest = (split_coded(bucket, self._MOMENTS8[0][0])
                       if group.get("state_bits", 32) == 8 else (None, bucket))
        # the one place the step's scalars become the ops' arguments (``args``: this
        # call's own dict)
        args["grad_scale"] = scalars.grad_scale
        args["found_inf"] = scalars.found_inf
        args["clip_coef"] = scalars.clip_coef
        bases8, bases = _sr.bucket_bases(coded, rest)
        if coded is not None and coded["params"]:
            op8(params=coded["params"], grads=coded["grads"],
                master_params=coded["master_params"], state_steps=coded["state_steps"],
                sr_bases=bases8, **{k: coded.get(v, []) for k, v in lists8.items()}, **args)
        if rest["params"]:
            op(params=rest["params"], grads=rest["grads"], master_params=rest["master_params"],
               state_steps=rest["state_steps"], sr_bases=bases,
               **{k: rest.get(v, []) for k, v in lists.items()}, **only32, **args)

    def _convert_state(self, p: Tensor, group: Dict[str, Any],
                       saved: Dict[str, Any]) -> Dict[str, Any]:
        # codes of this layout that stay 8-bit load as they are; other codes are read back
        # to float32 first, which the base class moves and shards
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
                    warnings.warn(
                        f"mixprec.optim: state {name!r} of shape {list(v.shape)} was saved in "
                        f"the previous 8-bit layout ({FLAT_QUANT!r}: blocks over the flattened "
                        f"tensor), whose blocks are not this version's ({QUANT!r}: blocks "
                        "inside rows); it was requantized from its decoded values (within the "
                        "8-bit error bound, not bit for bit). Save again to keep the new "
                        "layout.", UserWarning, stacklevel=1)
        out = super()._convert_state(p, group, saved)  # type: ignore[misc]
        out.update(kept)
        for name, absname, table in self._moments8(group):
            if name in kept:
                continue
            m = out.get(name)
            m = torch.zeros_like(p, dtype=torch.float32) if m is None else m.float()
            out[name], out[absname] = quantize_state(m, table, p) if quantized else (
                m, torch.zeros(0, dtype=torch.float32, device=p.device))
        if quantized:
            out["quant"] = QUANT
        return out

    _KEPT_ON_LOAD = ("state_bits", "master_correction_bits")

    def _check_loadable(self, state_dict: Dict[str, Any]) -> None:
        """ValueError naming the first bad 8-bit entry of ``state_dict``."""
        index = dict(zip((k for g in state_dict["param_groups"] for k in g["params"]),
                         (p for g in self.param_groups for p in g["params"])))
        for key, st in state_dict["state"].items():
            if not isinstance(st, dict):
                continue
            coded = [m for m in self._MOMENTS8
                     if isinstance(st.get(m[0]), Tensor) and st[m[0]].dtype == torch.uint8]
            if not coded:
                continue
            where = f"mixprec.optim.{type(self).__name__}.load_state_dict: state[{key!r}]"
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
    """Whether :data:`FLAT_QUANT`'s blocks are this layout's for these codes: plain codes
    of one row or rows a multiple of 256 long."""
    return (not _dtensor.is_dtensor(codes)
            and (codes.dim() < 2 or q8.row_length(codes.shape) % q8.BLOCK == 0))


def _check_flat_sharded(where: str, codes: Tensor, p: Optional[Tensor]) -> None:
    """:data:`FLAT_QUANT` codes saved sharded read back only at the same sharding."""
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
    """Saved codes or maxima of this layout placed like ``p`` (a copy; sharded as ``p``)."""
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


def absmax_like(p: Tensor, local: Tensor) -> Tensor:
    """This rank's block maxima ``local`` (its rows' maxima) of DTensor param ``p`` as a
    DTensor laid out like ``p``, of global shape ``absmax_shape(p.shape)``. ValueError
    unless ``p`` is sharded by rows."""
    from torch.distributed.tensor import DTensor, Shard

    if any(isinstance(pl, Shard) and pl.dim != 0 for pl in p.placements):
        raise ValueError(f"mixprec.optim: state_bits=8 takes DTensor params sharded "
                         f"on dim 0 (FSDP2's default), got {p.placements}")
    shape = q8.absmax_shape(p.shape)
    stride = (shape[1], 1) if len(shape) == 2 else (1,)
    return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False,
                              shape=torch.Size(shape), stride=stride)


def zero_state(p: Tensor, table: str) -> Tuple[Tensor, Tensor]:
    """(codes, maxima) of a zero moment of ``p`` (``quantize_state`` of zeros, traceable)."""
    if _dtensor.is_dtensor(p):
        codes = torch.full_like(p, q8.zero_code(table), dtype=torch.uint8)
        local = torch.zeros(q8.absmax_shape(_dtensor.local(p).shape), device=p.device)
        return codes, absmax_like(p, local)
    return (torch.full(p.shape, q8.zero_code(table), dtype=torch.uint8, device=p.device),
            torch.zeros(q8.absmax_shape(p.shape), dtype=torch.float32, device=p.device))


def quantize_state(x: Tensor, table: str, p: Tensor) -> Tuple[Tensor, Tensor]:
    """(codes, maxima) of float32 state ``x`` of param ``p`` (DTensors laid out as ``p``)."""
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
