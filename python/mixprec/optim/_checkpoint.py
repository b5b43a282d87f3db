"""A DCP checkpoint checked against the state dict it is about to be loaded into.

``dcp.load``'s errors name only DCP's flattened keys and sizes. :func:`check_checkpoint`
reads the metadata first and says what differs in mixprec's words: a missing entry, another
shape, 8-bit state of the previous layout (with the world size it was saved at and the
fix). ``MixedPrecisionTrainer.load_state`` calls it before a sharded load.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterator, Optional, Tuple

import torch

from . import _quant8 as q8

__all__ = ["check_checkpoint"]


def _flat(obj: Any, prefix: str = "") -> Iterator[Tuple[str, Any]]:
    """(DCP's flattened key, tensor) of a nested dict/list state dict."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, (dict, list, tuple)):
        for k, v in obj.items() if isinstance(obj, dict) else enumerate(obj):
            yield from _flat(v, f"{prefix}.{k}" if prefix else str(k))


def _flat_layout_world(saved: int, codes_shape: Tuple[int, ...]) -> Optional[int]:
    """The world size at which the previous 8-bit layout saves ``saved`` maxima for codes of
    ``codes_shape``, or None."""
    rows = codes_shape[0] if codes_shape else 1
    per_row = math.prod(codes_shape[1:])
    for world in range(1, saved + 1):
        if world * q8.num_blocks(-(-rows // world) * per_row) == saved:
            return world
    return None


def check_checkpoint(state_dict: Dict[str, Any], checkpoint_id: Any) -> None:
    """Check that the DCP checkpoint at ``checkpoint_id`` (a directory, or anything
    ``FileSystemReader`` takes) holds every tensor of ``state_dict`` (the target of
    ``dcp.load``: e.g. ``{"model": msd, "optim": osd}`` from ``get_state_dict``) with its
    global shape. Reads the metadata only (no sync, no collective). Raises ``ValueError``
    naming the entry; nothing is loaded or changed."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    saved = FileSystemReader(checkpoint_id).read_metadata().state_dict_metadata
    targets = dict(_flat(state_dict))
    for key, t in targets.items():
        md = saved.get(key)
        if md is None:
            raise ValueError(f"mixprec: the checkpoint {checkpoint_id} has no {key!r}, which "
                             "the state dict to load holds (another model, or another "
                             "optimizer configuration)")
        if not isinstance(md, TensorStorageMetadata):
            raise ValueError(f"mixprec: the checkpoint {checkpoint_id} holds {key!r} as an "
                             "object, not a tensor")
        if tuple(md.size) == tuple(t.shape):
            continue
        if key.endswith("_absmax") and len(md.size) == 1 and t.dim() == 2:
            codes = targets.get(key[: -len("_absmax")])
            shape = tuple(codes.shape) if codes is not None else (t.shape[0],)
            world = _flat_layout_world(int(md.size[0]), shape)
            at = f"saved at world size {world}" if world else "saved sharded"
            raise ValueError(
                f"mixprec: {key!r} in {checkpoint_id} is 8-bit optimizer state of the "
                f"previous layout ('dynamic8/b256': blocks over each rank's shard), {at}; "
                f"this version lays blocks inside rows ('dynamic8/rows/b256', maxima of "
                f"shape {list(t.shape)}), which reload at any world size. To convert it: "
                f"at world size {world or 'it was saved at'}, with the mixprec that wrote it, "
                "load it and save the optimizer's state unsharded (get_state_dict with "
                "StateDictOptions(full_state_dict=True), then torch.save); this version "
                "loads that file with optimizer.load_state_dict, converted")
        raise ValueError(f"mixprec: {key!r} in {checkpoint_id} has shape {list(md.size)}, "
                         f"the state dict to load {list(t.shape)}")
