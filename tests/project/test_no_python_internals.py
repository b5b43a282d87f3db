"""No C++ source of mixprec reads CPython or torch-binding internals.

The ops are entered through ``torch.ops.mixprec.*`` only, and their Autograd-key kernels are
registered from Python (python/mixprec/ops/_autograd.py). The op libraries are plain shared
libraries loaded with torch.ops.load_library: no source includes Python.h, the Python tensor's
C struct, borrowed list/tuple items, raw object or TensorImpl memory, nor torch's
Python-binding headers. A grep of csrc/.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import List

from _helpers import REPO

CSRC = REPO / "csrc"

# What reads CPython or torch-binding internals: the Python tensor's C struct and its
# unpacking, borrowed list/tuple items, an object's type slot, raw member offsets, raw reads
# of a TensorImpl's memory (a cast of unsafeGetTensorImpl() to bytes, prefetches), and the
# headers of torch's Python bindings and pybind11. (LibTorch idioms -- unsafeGetTensorImpl()
# as a map key, bump_version() -- are fine.)
FORBIDDEN = [
    r"THPVariable_",
    r"PyList_GET_ITEM",
    r"PyTuple_GET_ITEM",
    r"Py_TYPE\(",
    r"\bob_item\b",
    r"\boffsetof\s*\(",
    r"__builtin_prefetch",
    r"reinterpret_cast<\s*(?:const\s+)?(?:char|uint8_t|std::byte|unsigned char)\s*\*\s*>"
    r"\s*\([^;]*unsafeGetTensorImpl",
    r"#include\s*[<\"](?:pybind11/|torch/csrc/(?:Exceptions|autograd/python_|utils/python))",
    r"#include\s*[<\"]Python\.h",
]


def internals(root: Path) -> List[str]:
    """``csrc/<file>:<line>: <match>`` for each use of a FORBIDDEN pattern under ``root``."""
    found = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.suffix not in (".h", ".cpp", ".cu", ".cuh", ".in"):
            continue
        text = path.read_text()
        for pattern in FORBIDDEN:
            for m in re.finditer(pattern, text):
                line = text.count("\n", 0, m.start()) + 1
                found.append(f"csrc/{path.relative_to(root).as_posix()}:{line}: "
                             f"{m.group(0)[:60]}")
    return found


def test_no_source_reads_python_internals() -> None:
    assert internals(CSRC) == []


def test_the_grep_finds_what_it_looks_for(tmp_path: Path) -> None:
    # each pattern, planted in a source file, is found
    planted = tmp_path / "cuda" / "x.h"
    planted.parent.mkdir()
    planted.write_text(
        "PyObject* o = PyList_GET_ITEM(l, 0);\nTHPVariable_Unpack(o);\n"
        "PyTuple_GET_ITEM(t, 1); Py_TYPE(o); ((PyListObject*)l)->ob_item;\n"
        "offsetof(THPVariable, cdata);\n__builtin_prefetch(p);\n"
        "const char* impl =\n    reinterpret_cast<const char*>(ts[i].unsafeGetTensorImpl());\n"
        "#include <torch/csrc/autograd/python_variable.h>\n#include <Python.h>\n"
        "auto& s = state()[p.unsafeGetTensorImpl()];  // a LibTorch idiom: fine\n")
    found = internals(tmp_path)
    assert len(found) == 10, found
    assert not any("state()" in f for f in found)
