"""Writes ``csrc/common/quant8_tables.h``: the 8-bit code tables of
``python/mixprec/optim/_quant8.py`` as C++ constants, for the CPU and CUDA kernels.

The Python module is the one source of the tables; this script turns it into C++ and
``tests/ops/test_quant8_kernels.py`` checks that the header in the tree is what the script
writes, so the two cannot drift. Run it after changing the tables::

    python tools/gen_quant8_tables.py            # rewrite the header
    python tools/gen_quant8_tables.py --check    # exit 1 when the header is stale

Besides the values, the header holds an **encoding table** per code table, the kernels'
shortcut to the nearest code. ``u``, the float32 bits of ``|y|`` (``y = x / absmax`` in
``[-1, 1]``), raised to at least the bits of ``2**-25``, falls in bucket
``(u - bits(2**-25)) >> 16``: every binade from ``2**-25`` to 1 cut into 128, and 1.0 alone
in the last. All ``u`` of a bucket share their upper 16 bits. For each bucket and sign the
table holds one int32: the code of the bucket's lowest value (for positive ``y``; its most
negative for negative ``y``) in bits 0-7, and in bits 8-23 the low 16 bits of the one
midpoint the bucket may hold (0xFFFF / 0 when it holds none: the comparison below is then
never true). The code of ``y`` is that code, plus one when the low 16 bits of ``u`` lie
above the midpoint's (positive ``y``; below, for negative ``y``, whose order is reversed):
the reference's ``searchsorted`` result exactly, with one table read. The script checks
that no bucket holds two midpoints of a sign, and that clamping tiny ``|y|`` up to
``2**-25`` changes no code. Zero itself is set apart by the kernels (``y == 0``: the zero
code), and the nonzero rule follows.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import struct
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEADER = ROOT / "csrc" / "common" / "quant8_tables.h"

#: buckets: (max(bits(|y|), BASE_BITS) - BASE_BITS) >> SHIFT
BASE_EXP = -25
BASE_BITS = (127 + BASE_EXP) << 23
SHIFT = 16  # 23 - 7 mantissa bits: 128 buckets per binade
BUCKETS = (((127 << 23) - BASE_BITS) >> SHIFT) + 1  # up to and including 1.0


def _load_quant8():
    spec = importlib.util.spec_from_file_location(
        "_quant8", ROOT / "python" / "mixprec" / "optim" / "_quant8.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def _f32_from_bits(u: int) -> float:
    return struct.unpack("<f", struct.pack("<I", u))[0]


def _bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def _bucket_range(b: int) -> tuple[int, int]:
    """(lowest, highest) bits of |y| in bucket ``b``."""
    lo = BASE_BITS + (b << SHIFT)
    return lo, min(lo + (1 << SHIFT) - 1, 127 << 23)


def tables() -> dict:
    q8 = _load_quant8()
    out = {}
    for name in q8.TABLES:
        values, mid = q8._table_cpu(name)
        mids = mid.tolist()

        def code(y: float, mid: torch.Tensor = mid) -> int:
            # the reference's rounding before the nonzero rule: searchsorted, ties low
            return int(torch.searchsorted(mid, torch.tensor([y], dtype=torch.float32)))

        pos, neg = [], []
        for b in range(BUCKETS):
            lo_u, hi_u = _bucket_range(b)
            lo, hi = _f32_from_bits(lo_u), _f32_from_bits(hi_u)
            c_lo, c_hi = code(lo), code(hi)
            n_lo, n_hi = code(-hi), code(-lo)
            if c_hi - c_lo > 1 or n_hi - n_lo > 1:
                raise SystemExit(f"{name}: bucket {b} [{lo}, {hi}] holds more than one "
                                 "midpoint; use more buckets per binade")
            # positive y: +1 when u's low 16 bits lie above the midpoint's
            thr = 0xFFFF
            if c_hi != c_lo:
                m = _bits(mids[c_lo])
                assert lo_u <= m < hi_u
                thr = m - lo_u
            # negative y: +1 when |y| lies below |midpoint|
            nthr = 0
            if n_hi != n_lo:
                m = _bits(-mids[n_lo])
                assert lo_u < m <= hi_u
                nthr = m - lo_u
            pos.append(c_lo | thr << 8)
            neg.append(n_lo | nthr << 8)
        # tiny |y| are clamped up to 2**-25: their codes are those of bucket 0
        for tiny in (2.0**-149, 1e-30, 2.0**-26):
            assert code(tiny) == pos[0] & 0xFF and code(-tiny) == neg[0] & 0xFF, name
        zeros = [i for i, v in enumerate(values.tolist()) if v == 0.0]
        small_pos, small_neg = q8._smallest_codes(name)
        zero_lo, zero_hi = min(zeros), max(zeros)
        out[name] = dict(values=values.tolist(), pos=pos, neg=neg, zero_lo=zero_lo,
                         zero_hi=zero_hi, small_pos=small_pos, small_neg=small_neg,
                         folded=_fold(pos, neg, zero_lo, zero_hi, small_pos, small_neg))
    return out


def _fold(pos: list[int], neg: list[int], zero_lo: int, zero_hi: int, small_pos: int,
          small_neg: int) -> list[int]:
    """The folded entries of one table, positive half then negative half (module doc)."""

    def nonzero(c: int, small: int) -> int:
        return small if zero_lo <= c <= zero_hi else c

    out = []
    for e in pos:
        c, thr = e & 0xFF, e >> 8
        above = nonzero(c + 1, small_pos) if thr < 0xFFFF else nonzero(c, small_pos)
        assert above <= 0xFF
        out.append(min(thr, 0xFFFF) | nonzero(c, small_pos) << 16 | above << 24)
    for e in neg:
        c, thr = e & 0xFF, e >> 8
        if thr == 0:
            out.append(0xFFFF | nonzero(c, small_neg) << 16 | nonzero(c, small_neg) << 24)
        else:
            assert thr <= 0xFFFF
            out.append((thr - 1) | nonzero(c + 1, small_neg) << 16 | nonzero(c, small_neg) << 24)
    return out
    return out


def _floats(xs: list[float]) -> str:
    def lit(x: float) -> str:
        mant, exp = float.hex(x).split("p")
        return mant.rstrip("0").rstrip(".") + "p" + exp + "f"

    lines, row = [], []
    for x in xs:
        row.append(lit(x))
        if len(row) == 4:
            lines.append("    " + ", ".join(row) + ",")
            row = []
    if row:
        lines.append("    " + ", ".join(row) + ",")
    return "\n".join(lines)


def _ints(xs: list[int]) -> str:
    lines = []
    for i in range(0, len(xs), 16):
        lines.append("    " + ", ".join(str(x) for x in xs[i:i + 16]) + ",")
    return "\n".join(lines)


def render() -> str:
    t = tables()
    q8 = _load_quant8()
    names = list(q8.TABLES)
    parts = [
        "// Generated by tools/gen_quant8_tables.py from python/mixprec/optim/_quant8.py;",
        "// do not edit (tests/ops/test_quant8_kernels.py checks it is current).",
        "//",
        "// The 8-bit code tables as the kernels read them (common/quant8_math.h):",
        "// table 0 is " + names[0] + " (first moments), 1 is " + names[1] + ".",
        "// MIXPREC_Q8_ARRAYS(X) expands X(name, type, size, {initializer}) once per",
        "// array, so that the math header can place them in host and in device memory.",
        "// How kQ8Encode rounds: tools/gen_quant8_tables.py.",
        "// clang-format off",
        "#pragma once",
        "",
        "#include <torch/headeronly/macros/Macros.h>",
        "",
        "#include <cstdint>",
        "",
        "namespace mixprec {",
        "namespace q8 {",
        "",
        f"constexpr int kBuckets = {BUCKETS};",
        f"constexpr uint32_t kBucketBaseBits = 0x{BASE_BITS:08x}u;  // 2^{BASE_EXP}",
        f"constexpr int kBucketShift = {SHIFT};",
        "",
        "// Per table: the codes of zero (zero_lo..zero_hi) and the smallest positive",
        "// and negative codes (the nonzero rule).",
    ]
    for key in ("zero_lo", "zero_hi", "small_pos", "small_neg"):
        a, b = (t[n][key] for n in names)
        parts.append(f"C10_HOST_DEVICE constexpr int {key}(int table) {{")
        parts.append(f"  return table == 0 ? {a} : {b};")
        parts.append("}")
    parts += ["", "}  // namespace q8", "}  // namespace mixprec", ""]

    def arr(cname: str, ctype: str, size: int, body: str) -> str:
        return f"  X({cname}, {ctype}, {size}, {{\\\n" + body.replace(
            "\n", " \\\n") + " \\\n  })"

    arrays = []
    arrays.append(arr("kQ8Values", "float", 512, _floats(t[names[0]]["values"] +
                                                         t[names[1]]["values"])))
    arrays.append(arr("kQ8Encode", "int32_t", 4 * BUCKETS,
                      _ints(t[names[0]]["pos"] + t[names[0]]["neg"] + t[names[1]]["pos"]
                            + t[names[1]]["neg"])))
    folded = arr("kQ8EncodeFolded", "uint32_t", 4 * BUCKETS,
                 _ints(t[names[0]]["folded"] + t[names[1]]["folded"]))
    parts.append("// X(name, element type, elements, {initializer}): kQ8Values[table * 256 +")
    parts.append("// code]; kQ8EncodeFolded[(table * 2 + (y < 0)) * kBuckets + bucket]: the")
    parts.append("// arrays the kernels read (host and device copies)")
    parts.append("#define MIXPREC_Q8_ARRAYS(X) \\")
    parts.append(" \\\n".join([arrays[0], folded]))
    parts.append("// kQ8Encode[(table * 2 + (y < 0)) * kBuckets + bucket]: the unfolded table the")
    parts.append("// folded one is proven against (host only)")
    parts.append("#define MIXPREC_Q8_UNFOLDED_ARRAYS(X) \\")
    parts.append(arrays[1])
    parts.append("// clang-format on")
    parts.append("")
    return "\n".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the header is stale")
    args = ap.parse_args()
    text = render()
    if args.check:
        current = HEADER.read_text() if HEADER.exists() else ""
        if current != text:
            print(f"{HEADER} is stale: run python tools/gen_quant8_tables.py", file=sys.stderr)
            return 1
        return 0
    HEADER.write_text(text)
    print(f"wrote {HEADER}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
