"""Checks that a C++ compiler links shared objects against the shared libstdc++.

A compiler (or a wrapper script around one) that links libstdc++ statically
into shared objects (``-static-libstdc++``, or ``libstdc++.a`` on the link
line) produces an extension that carries a private copy of libstdc++ next to
the shared one that torch and Python already use. The two copies do not share
their iostream/locale state, so formatting an integer into a stream inside the
extension -- what every ``TORCH_CHECK`` message with a shape or a count does --
misbehaves: with g++ 13 it segfaults in ``std::ostream::_M_insert<long>``,
with g++ 12 the number silently comes out empty.

This module has no third-party imports (setup.py loads it by path before
torch's build machinery runs) and reads ELF files itself, so neither ``nm`` nor
``readelf`` is needed:

* :func:`probe_compiler` links a tiny shared object with a compiler command and
  inspects it;
* :func:`inspect_shared_object` inspects an existing shared object (the built
  mixprec's op libraries, or libmixprec);
* :func:`refusal_message` is the error text the build prints.

Set ``MIXPREC_ALLOW_STATIC_LIBSTDCXX=1`` to build anyway (:data:`OVERRIDE_ENV`).
"""

from __future__ import annotations

import os
import shlex
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

__all__ = ["OVERRIDE_ENV", "ElfDynamicInfo", "read_elf_dynamic", "inspect_shared_object",
           "probe_compiler", "refusal_message", "compiler_description"]

#: Environment variable that turns the refusal into a warning (for experts who
#: know their static libstdc++ is safe, e.g. every symbol hidden and no C++
#: object crossing the boundary).
OVERRIDE_ENV = "MIXPREC_ALLOW_STATIC_LIBSTDCXX"

# Functions that live only in libstdc++ itself (not templates a program may
# instantiate on its own): a shared object that defines one carries libstdc++
# code. std::locale::classic(), std::ios_base::Init::Init(),
# std::ostream::operator<<(long), std::ostream::_M_insert<long>(long) (g++ >= 13
# calls the latter from inline code; libstdc++ provides it as an explicit
# instantiation).
LIBSTDCXX_OWN_SYMBOLS = (
    "_ZNSt6locale7classicEv",
    "_ZNSt8ios_base4InitC1Ev",
    "_ZNSolsEl",
    "_ZNSo9_M_insertIlEERSoT_",
)

_PROBE_SOURCE = """\
#include <sstream>
#include <string>
// What TORCH_CHECK does with a shape: stream integers into an ostringstream.
extern "C" __attribute__((visibility("default"))) int mixprec_probe(long v, char* out,
                                                                   int size) {
  std::ostringstream s;
  s << "shape [" << v << "]";
  const std::string text = s.str();
  int n = 0;
  for (; n + 1 < size && n < static_cast<int>(text.size()); ++n) out[n] = text[n];
  if (size > 0) out[n] = 0;
  return n;
}
"""

_SHT_DYNAMIC = 6
_SHT_DYNSYM = 11
_DT_NEEDED = 1
_SHN_UNDEF = 0


class ElfDynamicInfo(NamedTuple):
    """The dynamic section of an ELF shared object, as far as these checks need it."""

    needed: list[str]  # DT_NEEDED entries, in order
    defined: set[str]  # names of the defined dynamic symbols


def read_elf_dynamic(path: str | os.PathLike[str]) -> ElfDynamicInfo:
    """Read the DT_NEEDED entries and the defined dynamic symbols of an ELF file.

    Raises ValueError when the file is not an ELF file with section headers.
    """
    with open(path, "rb") as f:
        ident = f.read(16)
        if len(ident) < 16 or ident[:4] != b"\x7fELF":
            raise ValueError(f"{path}: not an ELF file")
        is64 = ident[4] == 2
        order = "<" if ident[5] == 1 else ">"
        if is64:
            f.seek(0x28)
            (shoff,) = struct.unpack(order + "Q", f.read(8))
            f.seek(0x3A)
            shentsize, shnum, _shstrndx = struct.unpack(order + "HHH", f.read(6))
            sh_fmt = order + "IIQQQQIIQQ"
        else:
            f.seek(0x20)
            (shoff,) = struct.unpack(order + "I", f.read(4))
            f.seek(0x2E)
            shentsize, shnum, _shstrndx = struct.unpack(order + "HHH", f.read(6))
            sh_fmt = order + "IIIIIIIIII"
        if shoff == 0 or shnum == 0:
            raise ValueError(f"{path}: no section headers")
        # (type, offset, size, link, entsize) of every section
        sections = []
        for i in range(shnum):
            f.seek(shoff + i * shentsize)
            fields = struct.unpack(sh_fmt, f.read(struct.calcsize(sh_fmt)))
            sections.append((fields[1], fields[4], fields[5], fields[6], fields[9]))

        def read(offset: int, size: int) -> bytes:
            f.seek(offset)
            return f.read(size)

        def c_string(table: bytes, start: int) -> str:
            end = table.find(b"\0", start)
            return table[start:end if end >= 0 else len(table)].decode("utf-8", "replace")

        info = ElfDynamicInfo([], set())
        for sh_type, offset, size, link, entsize in sections:
            if sh_type not in (_SHT_DYNAMIC, _SHT_DYNSYM) or link >= len(sections):
                continue
            strtab = read(sections[link][1], sections[link][2])
            data = read(offset, size)
            if sh_type == _SHT_DYNAMIC:
                fmt = order + ("qQ" if is64 else "iI")
                step = entsize or struct.calcsize(fmt)
                for pos in range(0, len(data) - step + 1, step):
                    tag, value = struct.unpack_from(fmt, data, pos)
                    if tag == 0:  # DT_NULL
                        break
                    if tag == _DT_NEEDED:
                        info.needed.append(c_string(strtab, value))
            else:
                # st_name and st_shndx; Elf64_Sym: name, info, other, shndx, value, size;
                # Elf32_Sym: name, value, size, info, other, shndx
                fmt = order + ("IBBHQQ" if is64 else "IIIBBH")
                step = entsize or struct.calcsize(fmt)
                for pos in range(step, len(data) - step + 1, step):  # entry 0 is null
                    sym = struct.unpack_from(fmt, data, pos)
                    shndx = sym[3] if is64 else sym[5]
                    if shndx != _SHN_UNDEF and sym[0]:
                        info.defined.add(c_string(strtab, sym[0]))
        return info


def inspect_shared_object(path: str | os.PathLike[str]) -> str | None:
    """Why a C++ shared object carries its own libstdc++, or None when it does not.

    The object must use the C++ standard library (the probe and mixprec's
    extension do). It is reported when it has no ``DT_NEEDED`` entry for
    libstdc++ (or libc++) -- libstdc++ was linked statically -- or when it
    defines functions that only libstdc++ defines.
    """
    info = read_elf_dynamic(path)
    own = sorted(s for s in LIBSTDCXX_OWN_SYMBOLS if s in info.defined)
    shared = [n for n in info.needed if n.startswith(("libstdc++.so", "libc++.so"))]
    problems = []
    if not shared:
        problems.append("it does not load the shared libstdc++ (no DT_NEEDED libstdc++.so.6; "
                        f"NEEDED: {', '.join(info.needed) or 'nothing'})")
    if own:
        problems.append("it defines libstdc++'s own functions itself (" + ", ".join(own) + ")")
    if not problems:
        return None
    return f"{path}: " + "; ".join(problems)


def probe_compiler(cxx: str | Sequence[str], work_dir: str | os.PathLike[str] | None = None,
                   extra_flags: Sequence[str] = ()) -> str | None:
    """Link a small C++ shared object with ``cxx`` and inspect it.

    ``cxx`` is a compiler command (a string is split like a shell word list, so
    ``"ccache g++"`` works). The object is built as
    ``<cxx> -shared -fPIC <extra_flags> probe.cpp -o probe.so`` -- the flags
    every extension link uses. Returns a description of the problem when the
    object carries its own libstdc++ (see :func:`inspect_shared_object`), None
    when it is fine. Raises RuntimeError when the compiler cannot build the
    probe at all.
    """
    cmd = shlex.split(cxx) if isinstance(cxx, str) else list(cxx)
    with tempfile.TemporaryDirectory(prefix="mixprec-cxx-probe-", dir=work_dir) as tmp:
        src = Path(tmp) / "probe.cpp"
        out = Path(tmp) / "probe.so"
        src.write_text(_PROBE_SOURCE)
        full = cmd + ["-shared", "-fPIC", "-O2", *extra_flags, str(src), "-o", str(out)]
        try:
            proc = subprocess.run(full, capture_output=True, text=True, timeout=300)
        except OSError as e:
            raise RuntimeError(f"cannot run the C++ compiler {shlex.join(cmd)}: {e}") from e
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"the C++ compiler cannot link a shared object: {shlex.join(full)}"
                               f"\n{proc.stdout}{proc.stderr}".rstrip())
        problem = inspect_shared_object(out)
        return problem.replace(str(out), "a test shared object") if problem else None


def compiler_description(cxx: str | Sequence[str]) -> tuple[str, str]:
    """(path, first line of ``--version``) of a compiler command; "" where unknown."""
    cmd = shlex.split(cxx) if isinstance(cxx, str) else list(cxx)
    if not cmd:
        return "", ""
    path = shutil.which(cmd[0]) or cmd[0]
    shown = shlex.join([path, *cmd[1:]])
    try:
        proc = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return shown, ""
    lines = (proc.stdout or proc.stderr).strip().splitlines()
    return shown, (lines[0].strip() if proc.returncode == 0 and lines else "")


def refusal_message(cxx: str, problem: str, built: bool = False) -> str:
    """The build's error text for a compiler that links libstdc++ statically.

    ``built``: the problem was found in the built extension (the compiler passed
    the probe, so the link flags -- LDFLAGS, LDCXXSHARED -- are suspect too).
    """
    env = os.environ.get("CXX")
    via = f" (CXX={env})" if env and env != cxx else ""
    subject = (f"the extension linked by the C++ compiler `{cxx}`{via} and its link flags "
               "(LDFLAGS, LDCXXSHARED) carries its own libstdc++" if built else
               f"the C++ compiler `{cxx}`{via} links libstdc++ statically into shared objects")
    return (
        f"mixprec: {subject}:\n  {problem}\n"
        "An extension built this way carries a second copy of libstdc++ next to the one torch "
        "uses, and every error message that formats a number (TORCH_CHECK with a shape or a "
        "count) crashes the process (g++ 13: segfault in std::ostream::_M_insert<long>) or "
        "loses the number (g++ 12). A wrapper script that adds -static-libstdc++ (or "
        "libstdc++.a) to every link is the usual cause.\n"
        "Fix: build with a compiler that links the shared libstdc++, e.g.\n"
        "  CXX=/usr/bin/g++ CC=/usr/bin/gcc pip install --no-build-isolation ...\n"
        f"To build anyway (at your own risk), set {OVERRIDE_ENV}=1."
    )
