"""The same bits at any world size: an FSDP2 run of every optimizer configuration
(32-bit moments with masters, float32 or split into a 16- or 8-bit correction, 8-bit moments
with and without masters, bf16 with stochastic rounding, 8-bit SGD momentum) is saved with
DCP on 1, 2, 3 and 4 ranks and loaded on each other count (tests/distributed/_reshard_cases.py;
gloo on CPU, one thread per process).

- After the load, the whole optimizer state (codes, maxima, decoded moments, masters, step)
  equals the state at the save, bit for bit, at every pair of world sizes, FSDP2, DDP and
  HSDP (2 x 2) alike.
- Where averaging equal gradients is exact (1, 2 and 4 ranks fed the same batch), the run
  resumed on another world size ends bit for bit where the uninterrupted unsharded run
  ends, and so does the uninterrupted sharded run.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Dict

import pytest
import torch

import _reshard_cases as cases
from _fsdp2_cases import needs_fsdp2
from _helpers import assert_bitwise_equal

pytestmark = needs_fsdp2
EXACT = (1, 2, 4)  # world sizes whose gradient average of equal values is exact


@pytest.fixture(scope="module")
def runs() -> Dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        for entry in ("save", "load"):
            for world in cases.WORLDS:
                cases.spawn(world, entry, tmp, os.path.join(tmp, f"init-{entry}-{world}"))
        out = {f"{name}-w{w}": torch.load(os.path.join(tmp, f"{name}-w{w}.pt"),
                                          weights_only=False)
               for name in ("save", "load") for w in cases.WORLDS}
        saved = {w: out[f"save-w{w}"] for w in cases.WORLDS}
        # the unsharded run: world size 1's, a plain model (in a worker: one thread, as
        # every rank; a GEMM may sum in another order on more threads)
        return {"saved": saved, "loaded": {w: out[f"load-w{w}"] for w in cases.WORLDS},
                "plain": {c: saved[1][(c, "plain")] for c in cases.CONFIGS}}


def _assert_state_equal(got: Any, want: Any, what: str) -> None:
    assert len(got) == len(want), what
    for i, (a, b) in enumerate(zip(got, want)):
        assert sorted(a) == sorted(b), f"{what}: param {i} keys {sorted(a)} != {sorted(b)}"
        for k in b:
            if isinstance(b[k], torch.Tensor):
                assert_bitwise_equal(a[k], b[k], f"{what}: param {i} {k!r}")
            else:
                assert a[k] == b[k], f"{what}: param {i} {k!r}"


def _pairs(exact_only: bool) -> list:
    """(saved world, saved layout, loaded world, loaded layout) of every load the workers
    ran (_reshard_cases.load)."""
    out = []
    for lw in cases.WORLDS:
        for ll in cases.LAYOUTS[lw]:
            for sw in cases.WORLDS:
                for sl in cases.LAYOUTS[sw]:
                    if sw == lw or ("fsdp" not in (ll, sl) and "plain" not in (ll, sl)):
                        continue
                    if not exact_only or (sw in EXACT and lw in EXACT):
                        out.append((sw, sl, lw, ll))
    return out


@pytest.mark.parametrize("config", sorted(cases.CONFIGS))
@pytest.mark.parametrize("sw,sl,lw,ll", _pairs(False))
def test_state_after_loading_on_another_world_size_is_the_saved_state(runs, config, sw, sl,
                                                                      lw, ll):
    _assert_state_equal(runs["loaded"][lw][(config, ll, sl, sw)]["state"],
                        runs["saved"][sw][(config, sl)]["state"],
                        f"{config}: saved by {sl} on {sw}, loaded by {ll} on {lw}")


@pytest.mark.parametrize("config", sorted(cases.CONFIGS))
@pytest.mark.parametrize("world,layout", [(w, ly) for w in EXACT if w > 1
                                          for ly in cases.LAYOUTS[w]])
def test_sharded_run_equals_the_unsharded_run(runs, config, world, layout):
    plain = runs["plain"][config]
    got = runs["saved"][world][(config, layout)]
    _assert_state_equal(got["state"], plain["state"],
                        f"{config} state at the save, {layout} on {world} vs unsharded")
    assert len(got["final"]) == len(plain["final"]) > 0
    for i, (a, b) in enumerate(zip(got["final"], plain["final"])):
        assert_bitwise_equal(a, b, f"{config} {layout} on {world}: param {i}")


@pytest.mark.parametrize("config", sorted(cases.CONFIGS))
@pytest.mark.parametrize("sw,sl,lw,ll", _pairs(True))
def test_resumed_on_another_world_size_equals_the_uninterrupted_run(runs, config, sw, sl,
                                                                   lw, ll):
    plain = runs["plain"][config]["final"]
    got = runs["loaded"][lw][(config, ll, sl, sw)]["final"]
    assert len(got) == len(plain) > 0
    for i, (a, b) in enumerate(zip(got, plain)):
        assert_bitwise_equal(a, b, f"{config}: saved by {sl} on {sw}, resumed by {ll} on "
                                   f"{lw}: param {i}")


def test_the_cases_cover_what_a_layout_tied_to_shards_gets_wrong():
    """8-bit state is kept for every 2-D param, rows end inside a block, no world size
    divides some row counts, and 4 ranks leave one shard empty."""
    m = cases.model(torch.float32)
    shapes = [tuple(p.shape) for p in m.parameters() if p.dim() == 2]
    assert any(s[1] % 256 for s in shapes)
    assert any(all(s[0] % w for w in (2, 3, 4)) for s in shapes)
    assert any(len(torch.chunk(torch.empty(s[0]), 4)) < 4 for s in shapes)  # an empty shard
    o = cases.CONFIGS["masters8"][1](m.parameters())
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    o.step()
    assert all((o.state[p]["exp_avg"].dtype == torch.uint8) == (p.dim() == 2)
               for p in m.parameters())


def test_sharded_state_of_the_previous_layout_loads_only_where_it_was_saved():
    with tempfile.TemporaryDirectory() as tmp:
        cases.spawn(2, "old_layout", tmp, os.path.join(tmp, "init"))
        r = torch.load(os.path.join(tmp, "old-layout.pt"), weights_only=False)
    assert r["same_sharding_loads"] and all(r["same_sharding_loads"])
    assert r["error"] is not None
    for words in ("previous layout ('dynamic8/b256'", "saved sharded as [Replicate()] over 2 "
                  "ranks", "a param sharded as [Shard(dim=0)] over 2 ranks",
                  "Load it where it was saved"):
        assert words in r["error"], (words, r["error"])
    assert r["unchanged"]
    # through DCP: check_checkpoint names the layout and the world size it was saved at
    for words in ("previous layout ('dynamic8/b256'", "saved at world size 2",
                  "full_state_dict=True"):
        assert words in r["dcp_error"], (words, r["dcp_error"])
