"""Static check of the 8-bit CUDA optimizer kernels, without a GPU.

Compiles the ``Optim8Op`` kernels (fused_adam8_ and fused_sgd8_, csrc/cuda/fused_optim8.h)
for sm_90 with setup.py's nvcc flags plus ``-Xptxas -v``, in a translation unit of their
own that instantiates the kernel for the common (param, grad, master) combinations, and
reads ptxas's resource report: registers, stack frame, spill stores and loads. It fails
(exit 1) when any of them has a local-memory frame or spills: the design keeps every
element of a round in registers (an array indexed at run time, or a register cap too low,
puts it in local memory, a round trip per element). With ``cuobjdump`` (triton ships one;
``--cuobjdump`` or on PATH) it also prints each kernel's SASS instruction count, its
vector (128-bit) and 32-bit global loads and its byte loads.

``--plant`` adds one more instantiation whose element update indexes a local array at run
time; the check must then fail (tests/project/test_sass_check.py runs both).

Usage::

    python tools/sass_check.py [--nvcc PATH] [--cuobjdump PATH] [--plant] [--count] [--keep DIR]
                               [--source-root CHECKOUT]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]

#: setup.py's nvcc flags for the CUDA library (the check must see the shipped code)
TORCH_TARGET_VERSION = "0x020b000000000000"
NVCC_FLAGS = ["-O3", "-lineinfo", "--fmad=false", f"-DTORCH_TARGET_VERSION={TORCH_TARGET_VERSION}"]

#: (name, op, P, G, master): the instantiations checked; master is the functors' master
#: type (void: none; float; int16_t / int8_t: a split master's correction)
CASES = [
    ("adam8 fp32", "Adam8Op", "float", "float", "void"),
    ("adam8 fp16+master", "Adam8Op", "H", "H", "float"),
    ("adam8 bf16+master", "Adam8Op", "B", "B", "float"),
    ("adam8 bf16+split16", "Adam8Op", "B", "B", "int16_t"),
    ("adam8 bf16+split8", "Adam8Op", "B", "B", "int8_t"),
    ("adam8 bf16", "Adam8Op", "B", "B", "void"),
    ("sgd8 fp32", "Sgd8Op", "float", "float", "void"),
    ("sgd8 bf16+master", "Sgd8Op", "B", "B", "float"),
    ("sgd8 bf16+split16", "Sgd8Op", "B", "B", "int16_t"),
]

_PLANT = """
// A planted local array: the element update indexes it at run time.
struct PlantedRule : Adam8Rule {
  MIXPREC_HD static void update(float& w, float g, float (&x)[kStates],
                                const Args& a, const Block& blk) {
    float local[16];
    for (int i = 0; i < 16; ++i) {
      local[i] = w * static_cast<float>(i);
    }
    w = local[static_cast<int>(g) & 15];
    Adam8Rule::update(w, g, x, a, blk);
  }
};
template <typename P, typename G, typename M, bool>
using PlantedOp = Optim8Op<P, G, M, PlantedRule>;
"""


def _source(plant: bool) -> str:
    lines = ['#include "cuda/device_exec.cuh"', '#include "cuda/fused_adam.h"',
             '#include "cuda/fused_sgd.h"', "namespace mixprec {", "namespace cuda {",
             "using H = torch::headeronly::Half;", "using B = torch::headeronly::BFloat16;"]
    cases = list(CASES)
    if plant:
        lines.append(_PLANT)
        cases.append(("planted adam8 fp32", "PlantedOp", "float", "float", "void"))
    for _, op, p, g, master in cases:
        args = "AdamKernelArgs" if op != "Sgd8Op" else "SgdKernelArgs"
        depth = "Adam8Slot::kDepth" if op != "Sgd8Op" else "Sgd8Slot::kDepth"
        meta = f"TensorListMeta<{depth}>"
        opt = f"{op}<{p}, {g}, {master}, false>"
        lines.append(f"template __global__ void multi_tensor_kernel<{meta}, {opt}, {args}>"
                     f"({meta}, {opt}, {args});")
    lines += ["}  // namespace cuda", "}  // namespace mixprec", ""]
    return "\n".join(lines)


def _nvcc(given: Optional[str]) -> str:
    if given:
        return given
    home = os.environ.get("CUDA_HOME")
    if home and (Path(home) / "bin" / "nvcc").exists():
        return str(Path(home) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found is None:
        raise SystemExit("sass_check: no nvcc (set CUDA_HOME or --nvcc)")
    return found


def _cuobjdump(given: Optional[str]) -> Optional[str]:
    if given:
        return given
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton  # noqa: F401  (ships a cuobjdump)
    except ImportError:
        return None
    path = Path(sys.modules["triton"].__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(path) if path.exists() else None


def _kernel_case(mangled: str, names: Dict[str, str]) -> Optional[str]:
    for key, case in names.items():
        if key in mangled:
            return case
    return None


def _mangled_keys(plant: bool) -> Dict[str, str]:
    """A substring of each case's mangled kernel name -> the case's name."""
    dt = {"float": "f", "H": "N3c104HalfE", "B": "N3c108BFloat16E"}
    out = {}
    cases = list(CASES) + ([("planted adam8 fp32", "PlantedOp", "float", "float", "void")]
                           if plant else [])
    for name, op, p, g, master in cases:
        rule = {"Adam8Op": "Adam8Rule", "Sgd8Op": "Sgd8Rule", "PlantedOp": "PlantedRule"}[op]
        pm, gm = dt[p], dt[g]
        if p == g and p != "float":
            gm = "S6_"  # the repeated type is a substitution
        elif p == g:
            gm = "f"
        mm = {"void": "v", "float": "f", "int16_t": "s", "int8_t": "a"}[master]
        out[f"8Optim8OpI{pm}{gm}{mm}NS0_{len(rule)}{rule}"] = name
    return out


def parse_ptxas(text: str, keys: Dict[str, str]) -> Dict[str, Dict[str, int]]:
    """Per case: registers, stack frame, spill stores/loads, from ``-Xptxas -v``."""
    out: Dict[str, Dict[str, int]] = {}
    current: Optional[str] = None
    for line in text.splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            current = _kernel_case(m.group(1), keys)
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, "
                      r"(\d+) bytes spill loads", line)
        if m:
            out.setdefault(current, {}).update(
                stack=int(m.group(1)), spill_stores=int(m.group(2)),
                spill_loads=int(m.group(3)))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m:
            out.setdefault(current, {})["registers"] = int(m.group(1))
            current = None
    return out


def sass_counts(cubin: Path, cuobjdump: str, keys: Dict[str, str]) -> Dict[str, Dict[str, int]]:
    """Per case: SASS instructions, 128-bit / 32-bit global loads, byte loads, local ops."""
    text = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    out: Dict[str, Dict[str, int]] = {}
    current: Optional[str] = None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            current = _kernel_case(m.group(1), keys)
            if current is not None:
                out[current] = dict(instructions=0, ldg128=0, ldg64=0, ldg32=0, ldg8=0,
                                    local=0)
            continue
        if current is None:
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if not m:
            continue
        ins = m.group(1)
        c = out[current]
        c["instructions"] += 1
        op = re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0]
        if op.startswith("LDG"):
            if ".128" in op:
                c["ldg128"] += 1
            elif ".64" in op:
                c["ldg64"] += 1
            elif ".U8" in op or ".S8" in op:
                c["ldg8"] += 1
            elif not re.search(r"\.(64|U16|S16)", op):
                c["ldg32"] += 1
        if op.startswith(("LDL", "STL")):
            c["local"] += 1
    return out


def _functions(sass: str, keys: Dict[str, str]) -> Dict[str, List[tuple]]:
    """Per case: its SASS as (address, instruction) pairs."""
    out: Dict[str, List[tuple]] = {}
    current: Optional[str] = None
    for line in sass.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            current = _kernel_case(m.group(1), keys)
            if current is not None:
                out[current] = []
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if current is not None and m:
            out[current].append((int(m.group(1), 16), m.group(2)))
    return out


_BRANCH = re.compile(r"(@!?U?P\w+\s+)?BRA(?:\.\w+)*\s+(?:!?U?P\w+,\s*)?(0x[0-9a-f]+)")


def round_loop_count(code: List[tuple]) -> Optional[Dict[str, int]]:
    """The round loop of a kernel (the widest backward branch's span): its instructions
    (NOPs left out) and the hot path through it, walked from its head to its back-edge:
    an unconditional branch is followed; a conditional forward branch is taken when the
    code it skips is a slow path: a subroutine call (the out-of-line slow path of an IEEE
    division or square root, for operands near the ends of the range) with no conditional
    branch of its own; any other is not taken (so a block that only some steps run, e.g.
    stochastic rounding, is counted: the walk over-counts rather than under-counts)."""
    index = {addr: i for i, (addr, _) in enumerate(code)}
    back = []
    for addr, ins in code:
        m = _BRANCH.match(ins)
        if m and int(m.group(2), 16) < addr:
            back.append((int(m.group(2), 16), addr))
    if not back:
        return None
    lo, hi = max(back, key=lambda b: b[1] - b[0])
    body = [ins for addr, ins in code if lo <= addr <= hi and not ins.startswith("NOP")]
    hot, i, steps = 0, index[lo], 0
    while steps < 100000:
        steps += 1
        addr, ins = code[i]
        if not ins.startswith("NOP"):
            hot += 1
        if addr == hi:
            break
        m = _BRANCH.match(ins)
        if m:
            target = int(m.group(2), 16)
            if m.group(1) is None:
                i = index[target]
                continue
            skipped = [c for _, c in code[i + 1:index[target]]] if target > addr else []
            if any(c.startswith("CALL") for c in skipped) and not any(
                    (b := _BRANCH.match(c)) and b.group(1) for c in skipped):
                i = index[target]
                continue
        i += 1
    return dict(loop=len(body), hot=hot)


def fast_path_counts(nvcc_cmd: List[str], work: Path, cuobjdump: str,
                     keys: Dict[str, str]) -> Dict[str, Dict[str, int]]:
    """The round loop of each kernel built with only its whole-block path
    (-DMIXPREC_SASS_FAST_PATH_ONLY), per round of a lane, which runs 2 x 4 elements:
    hot / 8 estimates the dynamic instructions per element of the fast path,
    loop / 8 bounds them (every instruction of the loop once per round)."""
    cubin = work / "optim8_fast_path.cubin"
    cmd = [a for a in nvcc_cmd if a not in ("-Xptxas", "-v")]
    cmd[cmd.index("-o") + 1] = str(cubin)
    cmd.insert(1, "-DMIXPREC_SASS_FAST_PATH_ONLY")
    subprocess.run(cmd, capture_output=True, text=True, check=True)
    sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    out = {}
    for name, code in _functions(sass, keys).items():
        r = round_loop_count(code)
        if r is not None:
            out[name] = r
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nvcc", help="nvcc to use (default: CUDA_HOME's or PATH's)")
    ap.add_argument("--cuobjdump", help="cuobjdump for the SASS counts (default: PATH's "
                    "or triton's; the counts are skipped without one)")
    ap.add_argument("--plant", action="store_true",
                    help="add a kernel with a local array (the check must fail)")
    ap.add_argument("--count", action="store_true",
                    help="also count the fast path's instructions per element (a second "
                    "build of the kernels with only that path; needs cuobjdump)")
    ap.add_argument("--keep", type=Path, help="write the .cu, .cubin and ptxas log here")
    ap.add_argument("--source-root", type=Path, default=ROOT,
                    help="the checkout whose csrc/ is compiled (default: this one; another "
                    "commit's worktree gives a before/after table)")
    args = ap.parse_args(argv)

    from torch.utils import cpp_extension

    nvcc = _nvcc(args.nvcc)
    work = args.keep or Path(tempfile.mkdtemp(prefix="sass_check_"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / "optim8_kernels.cu"
    cubin = work / "optim8_kernels.cubin"
    src.write_text(_source(args.plant))
    root = args.source_root
    includes = [f"-I{root / 'csrc'}", f"-I{root / 'csrc' / 'include'}"]
    includes += [f"-I{p}" for p in cpp_extension.include_paths()[:2]]
    cmd = [nvcc, "-cubin", "-arch=sm_90", *NVCC_FLAGS, "-include",
           str(root / "csrc" / "compat" / "glibc_compat.h"), *includes, "-Xptxas", "-v",
           "-o", str(cubin), str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    (work / "ptxas.log").write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        print(r.stdout + r.stderr, file=sys.stderr)
        print("sass_check: nvcc failed", file=sys.stderr)
        return 2
    keys = _mangled_keys(args.plant)
    res = parse_ptxas(r.stdout + r.stderr, keys)
    dump = _cuobjdump(args.cuobjdump)
    sass = sass_counts(cubin, dump, keys) if dump else {}
    fast = fast_path_counts(cmd, work, dump, keys) if dump and args.count else {}
    expected = [c[0] for c in CASES] + (["planted adam8 fp32"] if args.plant else [])
    failed = False
    print(f"{'kernel (sm_90)':<22} {'regs':>4} {'stack':>5} {'spill st/ld':>11}"
          + (f" {'SASS':>5} {'LDG128':>6} {'LDG64':>5} {'LDG32':>5} {'LDG8':>4} {'local':>5}"
             if sass else "") + (f" {'hot/elem':>9} {'loop/elem':>9}" if fast else ""))
    for name in expected:
        if name not in res or "stack" not in res[name] or "registers" not in res[name]:
            print(f"sass_check: no ptxas report for {name}", file=sys.stderr)
            failed = True
            continue
        c = res[name]
        bad = c["stack"] > 0 or c["spill_stores"] > 0 or c["spill_loads"] > 0
        failed = failed or bad
        row = (f"{name:<22} {c['registers']:>4} {c['stack']:>5} "
               f"{c['spill_stores']:>5}/{c['spill_loads']:<5}")
        if name in sass:
            s = sass[name]
            row += (f" {s['instructions']:>5} {s['ldg128']:>6} {s['ldg64']:>5} {s['ldg32']:>5} "
                    f"{s['ldg8']:>4} {s['local']:>5}")
        if name in fast:
            f = fast[name]
            row += f" {f['hot'] / 8:>9.1f} {f['loop'] / 8:>9.1f}"
        print(row + ("  <- local memory" if bad else ""))
    if failed:
        print("sass_check: FAILED: an 8-bit kernel has a local-memory frame or spills",
              file=sys.stderr)
        return 1
    print("sass_check: ok (no local-memory frame, no spills)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
