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

#: the master forms: name -> (P, G, master); master is the functors' master type (void:
#: none; float; int16_t / int8_t: a split master's correction)
FORMS = {
    "fp32": ("float", "float", "void"),
    "fp16+master": ("H", "H", "float"),
    "bf16+master": ("B", "B", "float"),
    "bf16+split16": ("B", "B", "int16_t"),
    "bf16+split8": ("B", "B", "int8_t"),
    "bf16": ("B", "B", "void"),
}

#: (kernel, op, its forms); "adam8w" is Adam8Op's common step (AdamW, beta1 >= 0.5:
#: Adam8CommonRule, launch_optim's option flag set)
KERNELS = [
    ("adam8", "Adam8Op", list(FORMS)),
    ("adam8w", "Adam8wOp", ["fp32", "fp16+master", "bf16+master", "bf16+split16"]),
    ("sgd8", "Sgd8Op", ["fp32", "bf16+master", "bf16+split16"]),
]

#: (name, op, P, G, master): the instantiations checked
CASES = [(f"{kernel} {form}", op, *FORMS[form]) for kernel, op, forms in KERNELS
         for form in forms]

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

// Planted code tables in global memory: the cursor points at the generated
// arrays' device copies instead of the block's shared copy.
struct GlobalTablesRule : Adam8Rule {};
template <typename P, typename G, typename M, bool>
struct GlobalTablesOp : Optim8Op<P, G, M, GlobalTablesRule> {
  using Base = Optim8Op<P, G, M, GlobalTablesRule>;
  template <class Meta>
  MIXPREC_HD typename Base::Cursor cursor(const Meta& meta, int block, int first,
                                          int stride, const typename Base::Shared& s,
                                          const typename Base::Args& a) const {
    typename Base::Cursor c = Base::cursor(meta, block, first, stride, s, a);
    c.tables = q8::Tables::global();
    return c;
  }
};
"""

#: the planted cases (--plant): (name, op, P, G, master, the note the check must give)
PLANTED = [
    ("planted adam8 fp32", "PlantedOp", "float", "float", "void", "local memory"),
    ("planted-global adam8 fp32", "GlobalTablesOp", "float", "float", "void",
     "code tables in global memory"),
]


def cases_of(root: Path) -> List[tuple]:
    """CASES that the checkout at ``root`` has (an older one has no common-step rule)."""
    common = "Adam8CommonRule" in (root / "csrc" / "cuda" / "fused_adam.h").read_text()
    return [c for c in CASES if common or c[1] != "Adam8wOp"]


def _source(plant: bool, root: Path) -> str:
    # (the persistent kernel of WarpRounds functors where the checkout has one)
    kernel, blocks_arg = (("warp_rounds_kernel", " int,") if "warp_rounds_kernel" in
                          (root / "csrc" / "cuda" / "device_exec.cuh").read_text()
                          else ("multi_tensor_kernel", ""))
    lines = ['#include "cuda/device_exec.cuh"', '#include "cuda/fused_adam.h"',
             '#include "cuda/fused_sgd.h"', "namespace mixprec {", "namespace cuda {",
             "using H = torch::headeronly::Half;", "using B = torch::headeronly::BFloat16;"]
    cases = cases_of(root)
    if plant:
        lines.append(_PLANT)
        cases += [c[:5] for c in PLANTED]
    for _, op, p, g, master in cases:
        args = "AdamKernelArgs" if op != "Sgd8Op" else "SgdKernelArgs"
        depth = "Adam8Slot::kDepth" if op != "Sgd8Op" else "Sgd8Slot::kDepth"
        meta = f"TensorListMeta<{depth}>"
        opt = (f"Adam8Op<{p}, {g}, {master}, true>" if op == "Adam8wOp"
               else f"{op}<{p}, {g}, {master}, false>")
        lines.append(f"template __global__ void {kernel}<{meta}, {opt}, {args}>"
                     f"({meta},{blocks_arg} {opt}, {args});")
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


def _mangled_keys(plant: bool, root: Path = ROOT) -> Dict[str, str]:
    """A substring of each case's mangled kernel name -> the case's name."""
    dt = {"float": "f", "H": "N3c104HalfE", "B": "N3c108BFloat16E"}
    out = {}
    cases = cases_of(root) + ([c[:5] for c in PLANTED] if plant else [])
    for name, op, p, g, master in cases:
        rule = {"Adam8Op": "Adam8Rule", "Adam8wOp": "Adam8CommonRule", "Sgd8Op": "Sgd8Rule",
                "PlantedOp": "PlantedRule", "GlobalTablesOp": "GlobalTablesRule"}[op]
        pm, gm = dt[p], dt[g]
        if p == g and p != "float":
            gm = "S6_"  # the repeated type is a substitution
        elif p == g:
            gm = "f"
        mm = {"void": "v", "float": "f", "int16_t": "s", "int8_t": "a"}[master]
        if op == "GlobalTablesOp":  # (a class of its own, not an alias of Optim8Op)
            out[f"{len(op)}{op}I{pm}{gm}{mm}"] = name
        else:
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


def round_loop(code: List[tuple]) -> Optional[tuple]:
    """The (head, back-edge) addresses of a kernel's round loop: the narrowest conditional
    backward branch whose span holds the warp maximum's shuffles (a persistent kernel's
    loop over its plan blocks holds the round loop; the unconditional jump back from the
    out-of-line copy of the shuffles for a diverged warp is no loop)."""
    back = []
    for addr, ins in code:
        m = _BRANCH.match(ins)
        if m and m.group(1) and int(m.group(2), 16) < addr:
            lo = int(m.group(2), 16)
            if any(lo <= a <= addr and i.startswith("SHFL") for a, i in code):
                back.append((lo, addr))
    return min(back, key=lambda b: b[1] - b[0]) if back else None


def _op(ins: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0]


def round_loop_count(code: List[tuple]) -> Optional[Dict[str, int]]:
    """The round loop of a kernel (round_loop): its instructions (NOPs left out), its
    shared-memory loads (LDS) and read-only global loads (LDG.E.CONSTANT: what gathers from
    the code tables in global memory compile to), and the hot path through it, walked from
    its head to its back-edge:
    an unconditional branch is followed; a conditional forward branch is taken when the
    code it skips is a slow path: a subroutine call (the out-of-line slow path of an IEEE
    division or square root, for operands near the ends of the range) with no conditional
    branch of its own; any other is not taken (so a block that only some steps run, e.g.
    stochastic rounding, is counted: the walk over-counts rather than under-counts)."""
    index = {addr: i for i, (addr, _) in enumerate(code)}
    loop = round_loop(code)
    if loop is None:
        return None
    lo, hi = loop
    body = [ins for addr, ins in code if lo <= addr <= hi and not ins.startswith("NOP")]
    hot, hot_lds, hot_const, i, steps = 0, 0, 0, index[lo], 0
    while steps < 100000:
        steps += 1
        addr, ins = code[i]
        if not ins.startswith("NOP"):
            hot += 1
            hot_lds += _op(ins).startswith("LDS")
            hot_const += _op(ins).startswith("LDG") and ".CONSTANT" in _op(ins)
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
    return dict(loop=len(body), hot=hot, hot_lds=hot_lds, hot_const=hot_const,
                lds=sum(_op(c).startswith("LDS") for c in body),
                const=sum(_op(c).startswith("LDG") and ".CONSTANT" in _op(c) for c in body))


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
    root = args.source_root
    src.write_text(_source(args.plant, root))
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
    keys = _mangled_keys(args.plant, root)
    res = parse_ptxas(r.stdout + r.stderr, keys)
    dump = _cuobjdump(args.cuobjdump)
    sass = sass_counts(cubin, dump, keys) if dump else {}
    loops: Dict[str, Dict[str, int]] = {}
    if dump:
        text = subprocess.run([dump, "-sass", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
        for name, code in _functions(text, keys).items():
            counted = round_loop_count(code)
            if counted is not None:
                loops[name] = counted
    fast = fast_path_counts(cmd, work, dump, keys) if dump and args.count else {}
    expected = [c[0] for c in cases_of(root)] + ([c[0] for c in PLANTED] if args.plant
                                                 else [])
    failed = []
    print(f"{'kernel (sm_90)':<26} {'regs':>4} {'stack':>5} {'spill st/ld':>11}"
          + (f" {'SASS':>5} {'LDG128':>6} {'LDG64':>5} {'LDG32':>5} {'LDG8':>4} {'local':>5}"
             f" {'LDS':>4} {'LDGC':>4}" if sass else "")
          + (f" {'hot/elem':>9} {'loop/elem':>9} {'hotLDS':>6} {'hotLDGC':>7}" if fast else ""))
    for name in expected:
        if name not in res or "stack" not in res[name] or "registers" not in res[name]:
            print(f"sass_check: no ptxas report for {name}", file=sys.stderr)
            failed.append("a ptxas report is missing")
            continue
        c = res[name]
        notes = []
        if c["stack"] > 0 or c["spill_stores"] > 0 or c["spill_loads"] > 0:
            notes.append("local memory")
        row = (f"{name:<26} {c['registers']:>4} {c['stack']:>5} "
               f"{c['spill_stores']:>5}/{c['spill_loads']:<5}")
        if name in sass:
            s = sass[name]
            loop = loops.get(name)
            if loop is None:
                notes.append("no round loop found")
                loop = dict(lds=0, const=0)
            elif loop["lds"] == 0 or loop["const"] > 0:
                notes.append("code tables in global memory")
            row += (f" {s['instructions']:>5} {s['ldg128']:>6} {s['ldg64']:>5} {s['ldg32']:>5} "
                    f"{s['ldg8']:>4} {s['local']:>5} {loop['lds']:>4} {loop['const']:>4}")
        if name in fast:
            f = fast[name]
            row += (f" {f['hot'] / 8:>9.1f} {f['loop'] / 8:>9.1f} {f['hot_lds']:>6}"
                    f" {f['hot_const']:>7}")
        failed += notes
        print(row + "".join(f"  <- {n}" for n in notes))
    if failed:
        print("sass_check: FAILED: " + "; ".join(sorted(set(failed))), file=sys.stderr)
        return 1
    print("sass_check: ok (no local-memory frame, no spills"
          + (", the code tables read from shared memory in the round loop)" if sass else
             "; no cuobjdump: where the tables are read not checked)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
