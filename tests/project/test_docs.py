"""Docs that stay true: every repository path and every backticked mixprec name in the
Markdown files exists, and the README's code blocks marked runnable run.

What is checked, in backticked spans outside code blocks of README.md, ARCHITECTURE.md,
CONTRIBUTING.md, CHANGELOG.md, benchmarks/README.md and docs/*.md:

* a path under a tracked top-level folder (``csrc/cpu/``, ``tests/project/test_docs.py``,
  ``csrc/common/*_math.h``): some tracked file matches it;
* a header as C++ includes it (``mixprec/ops.h``): it is in ``csrc/include``;
* a bare file name with a source extension (``op_table.h``): a tracked file has that name;
* a Python name (``mixprec.optim.AdamW8bit``, ``torch.ops.mixprec.fused_adam_``): it
  resolves, attribute by attribute, importing submodules on the way;
* a C++ name (``mixprec::optim::AdamWOptions``): its last part is declared in a public
  header.

A code block of README.md or of a guide in docs/ marked ``<!-- runnable -->`` on the line
before its fence runs, in order, in one namespace per file. Also checked: the paths named in
the build files (setup.py, requirements*.txt, the Makefile, CMakeLists.txt, *.sh) and the
launch capacity a doc quotes (the constants of csrc/cuda/launch_plan.h).
"""

from __future__ import annotations

import fnmatch
import importlib
import re
import subprocess
from typing import Dict, List

import pytest
import torch

from _helpers import REPO, runnable_blocks

ROOT = REPO
DOCS = ["README.md", "ARCHITECTURE.md", "CONTRIBUTING.md", "CHANGELOG.md", "benchmarks/README.md",
        *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
SOURCE_EXT = (".py", ".md", ".h", ".cuh", ".cu", ".cpp", ".toml", ".cmake", ".in")
_FENCE = re.compile(r"^(```|~~~)")
_SPAN = re.compile(r"`([^`\n]+)`")
_PY_NAME = re.compile(r"^(torch\.ops\.)?mixprec(\.[A-Za-z_]\w*)+")
_CPP_NAME = re.compile(r"^mixprec(::[A-Za-z_]\w*)+")
#: files the build generates, and the tracked template each comes from
GENERATED = {"mixprec_build_config.h": "csrc/build_config.h.in"}


def _tracked() -> List[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return out.stdout.split()


def prose_spans(text: str) -> List[str]:
    """The backticked spans of ``text`` outside fenced code blocks."""
    spans, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            spans += _SPAN.findall(line)
    return spans


def problems(text: str, tracked: List[str]) -> List[str]:
    """What ``text`` names that does not exist (one line each)."""
    tops = {f.split("/")[0] for f in tracked if "/" in f}
    names = {f.rsplit("/", 1)[-1] for f in tracked}
    headers = {f[len("csrc/include/"):] for f in tracked if f.startswith("csrc/include/")}
    header_text = "\n".join((ROOT / f).read_text() for f in tracked
                            if f.startswith("csrc/include/mixprec/"))
    bad: List[str] = []
    for span in prose_spans(text):
        token = span.strip().strip("<>")
        if re.fullmatch(r"[\w.\-/*]+", token) and "/" in token:
            first = token.split("/")[0]
            if first in tops:
                pattern = token.rstrip("/")
                if not any(fnmatch.fnmatch(f, pattern) or f.startswith(pattern + "/")
                           for f in tracked):
                    bad.append(f"path `{span}`: no tracked file")
            elif first == "mixprec" and token.endswith(".h") and token not in headers:
                bad.append(f"header `{span}`: not in csrc/include")
            continue
        if re.fullmatch(r"\w[\w.\-]*", token) and token.endswith(SOURCE_EXT) and \
                not token.startswith("mixprec."):
            if token not in names and GENERATED.get(token) not in tracked:
                bad.append(f"file `{span}`: no tracked file of that name")
            continue
        m = _PY_NAME.match(token)
        if m and not re.match(r"[<*]", token[m.end():m.end() + 1]):
            why = _unresolved(m.group(0))
            if why:
                bad.append(f"name `{span}`: {why}")
            continue
        c = _CPP_NAME.match(token)
        if c:
            last = c.group(0).rsplit("::", 1)[-1]
            if not re.search(rf"\b{re.escape(last)}\b", header_text):
                bad.append(f"C++ name `{span}`: `{last}` is in no public header")
    return bad


def _unresolved(dotted: str) -> str:
    """Why ``dotted`` (``mixprec.x.y`` or ``torch.ops.mixprec.x``) does not resolve, or ''."""
    if dotted.startswith("torch.ops.mixprec."):
        import mixprec  # noqa: F401  (registers the ops)

        op = dotted.split(".")[3]
        return "" if hasattr(torch.ops.mixprec, op) else f"no op {op}"
    parts = dotted.split(".")
    obj = importlib.import_module("mixprec")
    for k in range(1, len(parts)):
        if hasattr(obj, parts[k]):
            obj = getattr(obj, parts[k])
            continue
        try:
            obj = importlib.import_module(".".join(parts[:k + 1]))
        except ImportError:
            return f"{'.'.join(parts[:k])} has no {parts[k]}"
    return ""


@pytest.mark.parametrize("doc", DOCS)
def test_named_paths_and_names_exist(doc: str) -> None:
    path = ROOT / doc
    if not path.exists():
        pytest.fail(f"{doc} is missing")
    assert problems(path.read_text(), _tracked()) == []


def test_the_check_catches_what_is_gone() -> None:
    """A removed path, file, name or header makes the test above fail."""
    tracked = _tracked()
    text = ("`python/mixprec/optim/_gone.py`, `csrc/cpu/no_such_*.cpp`, `gone_file.py`, "
            "`mixprec.optim.NoSuchOptimizer`, `torch.ops.mixprec.no_such_op_`, "
            "`mixprec/no_such.h`, `mixprec::optim::NoSuchOptions`\n"
            "```\n`python/ignored/in/a/code/block.py`\n```\n")
    found = problems(text, tracked)
    assert len(found) == 7, found
    # the same names, present
    ok = ("`python/mixprec/optim/_base.py`, `csrc/cpu/span_kernels_*.cpp`, `op_table.h`, "
          "`mixprec.optim.AdamW8bit`, `torch.ops.mixprec.fused_adam_`, `mixprec/ops.h`, "
          "`mixprec::optim::AdamWOptions`, `mixprec._extension.EXT`")
    assert problems(ok, tracked) == []


def test_readme_runnable_blocks_run(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = runnable_blocks((ROOT / "README.md").read_text())
    assert len(blocks) >= 4  # setup, scaler, optimizers, trainer
    namespace: Dict[str, object] = {"__name__": "readme"}
    for k, code in enumerate(blocks):
        exec(compile(code, f"README.md runnable block {k}", "exec"), namespace)  # noqa: S102
    assert namespace["scaler"].stats().steps > 0  # type: ignore[attr-defined]
    assert namespace["trainer"].stats()["total_steps"] > 0  # type: ignore[attr-defined]


RUNNABLE_DOCS = [d for d in DOCS if d.startswith("docs/")
                 and runnable_blocks((ROOT / d).read_text())]


@pytest.mark.parametrize("doc", RUNNABLE_DOCS)
def test_guide_runnable_blocks_run(doc: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The blocks of a guide marked ``<!-- runnable -->`` run, in order, in one namespace."""
    namespace: Dict[str, object] = {"__name__": doc}
    for k, code in enumerate(runnable_blocks((ROOT / doc).read_text())):
        exec(compile(code, f"{doc} runnable block {k}", "exec"), namespace)  # noqa: S102


def test_the_guides_with_runnable_blocks() -> None:
    assert {"docs/optimizers.md", "docs/troubleshooting.md"} <= set(RUNNABLE_DOCS)


def ops_table_rows(text: str) -> List[str]:
    """The ops that have a row in a Markdown ops table: the name at the start of a row's
    first cell (``| `x_(...)` | ...``)."""
    return re.findall(r"^\|\s*`(\w+)\(", text, flags=re.MULTILINE)


def test_every_op_has_a_row_in_the_ops_guide() -> None:
    """docs/ops.md has one row per op of the table (csrc/op_table.h), in its order."""
    from mixprec._extension import EXT

    assert ops_table_rows((ROOT / "docs" / "ops.md").read_text()) == list(EXT.op_names)


def test_a_missing_ops_row_is_found() -> None:
    """The check itself: a table without an op's row lists one op fewer."""
    text = (ROOT / "docs" / "ops.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `check_finite_("))
    assert "check_finite_" not in ops_table_rows(text.replace(row + "\n", ""))


def header_table_rows(text: str) -> List[str]:
    """The headers that have a row in a Markdown header table (``| `<mixprec/x.h>` | ...``)."""
    return re.findall(r"^\|\s*`<mixprec/([\w.]+)>`", text, flags=re.MULTILINE)


def test_every_public_header_has_a_row_in_the_cpp_guide() -> None:
    """docs/cpp.md's header table names each public header (csrc/include/mixprec, but the
    export macros), and only those."""
    headers = {p.name for p in (ROOT / "csrc" / "include" / "mixprec").glob("*.h")}
    rows = header_table_rows((ROOT / "docs" / "cpp.md").read_text())
    assert sorted(rows) == sorted(headers - {"export.h"})


def test_a_missing_header_row_is_found() -> None:
    """The check itself: a table without a header's row lists one header fewer."""
    text = (ROOT / "docs" / "cpp.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `<mixprec/capture.h>`"))
    assert "capture.h" not in header_table_rows(text.replace(row + "\n", ""))


# ---------------------------------------------------------------------------------------------
# Repository paths named in code comments and docstrings

#: where code comments are read, and the tracked top-level folders a named path may start with
CODE_DIRS = ("python", "csrc", "tests", "benchmarks", "tools", "examples", "cmake")
_CODE_PATH = re.compile(r"(?<![\w./-])((?:python|csrc|tests|benchmarks|tools|docs|examples|cmake)"
                        r"/[\w.*-]+(?:/[\w.*-]+)*)")
_CPP_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def code_comments(path: str, text: str) -> List[str]:
    """The comments and docstrings of a source file: ``#`` comments and triple-quoted strings
    of Python, ``//`` and ``/* */`` comments of C++/CUDA/CMake-free sources, ``#`` comments of
    CMake files."""
    if path.endswith(".py"):
        import io
        import tokenize

        out: List[str] = []
        try:
            for tok in tokenize.generate_tokens(io.StringIO(text).readline):
                if tok.type == tokenize.COMMENT or (
                        tok.type == tokenize.STRING and tok.string.lstrip("rbuRBU")[:3]
                        in ('"""', "'''")):
                    out.append(tok.string)
        except (tokenize.TokenError, IndentationError):
            return [text]
        return out
    if path.endswith((".h", ".cuh", ".cu", ".cpp", ".in")):
        return _CPP_COMMENT.findall(text)
    if path.endswith((".cmake", "CMakeLists.txt")):
        return re.findall(r"#[^\n]*", text)
    return []


def comment_path_problems(files: Dict[str, str], tracked: List[str]) -> List[str]:
    """The repository paths named in the comments of ``files`` (path -> text) that match no
    tracked file (one line each: ``file: `path```)."""
    bad: List[str] = []
    for name, text in files.items():
        for comment in code_comments(name, text):
            for m in _CODE_PATH.finditer(comment):
                token = m.group(1).rstrip("/.,:;")
                # a placeholder continues the name (tests/data/trainer_<case>.pt): a prefix
                pattern = token + ("*" if comment[m.end():m.end() + 1] in "<{" else "")
                if "::" in pattern:
                    pattern = pattern.split("::", 1)[0]
                if not any(fnmatch.fnmatch(f, pattern) or f.startswith(pattern + "/")
                           for f in tracked):
                    bad.append(f"{name}: `{token}`")
    return bad


def test_paths_named_in_code_comments_exist() -> None:
    """Every repository path a comment or docstring names (``csrc/cuda/launch_plan.h``,
    ``tests/data/*.pt``) matches a tracked file: a move or removal updates its mentions."""
    tracked = _tracked()
    files = {f: (ROOT / f).read_text(errors="replace") for f in tracked
             if f.startswith(CODE_DIRS) and (ROOT / f).is_file()
             and f.endswith((".py", ".h", ".cuh", ".cu", ".cpp", ".in", ".cmake",
                             "CMakeLists.txt"))}
    assert comment_path_problems(files, tracked) == []


def test_a_stale_path_in_a_comment_is_found() -> None:
    """The check itself: a comment naming a gone file is reported; code and existing paths
    are not."""
    tracked = _tracked()
    files = {
        "x.py": '"""See csrc/cuda/no_such_plan.h."""\n# and tests/project/test_docs.py\n'
                's = "tests/gone_in_a_string.py"\n',
        "y.cpp": "// csrc/cpu/gone_*.cpp\n/* python/mixprec/ops/__init__.py */ int x;\n"
                 "// tests/data/trainer_<case>.pt\n",
    }
    assert comment_path_problems(files, tracked) == [
        "x.py: `csrc/cuda/no_such_plan.h`", "y.cpp: `csrc/cpu/gone_*.cpp`"]


# ---------------------------------------------------------------------------------------------
# Paths named in the build and CI files, and paths pointing outside the repository

#: the build, dependency and CI files whose every repository path must exist
BUILD_FILES = ("setup.py", "pyproject.toml", "Makefile", "CMakeLists.txt", ".ci/run")
_BUILD_GLOBS = ("requirements*.txt", "cmake/*.mk", "*.sh", "*/*.sh", "*/*/*.sh",
                "*/CMakeLists.txt", "*/*/CMakeLists.txt")
_UP_PATH = re.compile(r"(?<![\w}$)/.-])((?:\.\./)+[\w.*-]+(?:/[\w.*-]+)*)")


def build_path_problems(files: Dict[str, str], tracked: List[str]) -> List[str]:
    """The repository paths named in ``files`` (path -> text; all of the text, comments
    and code) that match no tracked file and are not git-ignored build outputs, and the
    ``../`` paths that leave the repository (``$ORIGIN/..`` rpaths and ``${VAR}/..`` are
    not paths in the tree)."""
    bad: List[str] = []
    for name, text in files.items():
        for m in _CODE_PATH.finditer(text):
            token = m.group(1).rstrip("/.,:;)'\"")
            pattern = token + ("*" if text[m.end():m.end() + 1] in "<{$" else "")
            if any(fnmatch.fnmatch(f, pattern) or f.startswith(pattern + "/") for f in tracked):
                continue
            ignored = any(subprocess.run(["git", "check-ignore", "-q", "--no-index", path],
                                         cwd=ROOT).returncode == 0 for path in (token, token + "/"))
            if not ignored:
                bad.append(f"{name}: `{token}`")
        for m in _UP_PATH.finditer(text):
            target = (ROOT / name).parent / m.group(1)
            if ROOT.resolve() not in target.resolve().parents and \
                    target.resolve() != ROOT.resolve():
                bad.append(f"{name}: `{m.group(1)}` is outside the repository")
    return bad


def _build_files(tracked: List[str]) -> Dict[str, str]:
    names = [f for f in tracked if f in BUILD_FILES
             or any(fnmatch.fnmatch(f, g) for g in _BUILD_GLOBS)]
    return {f: (ROOT / f).read_text(errors="replace") for f in names if (ROOT / f).is_file()}


def test_paths_named_in_build_files_exist() -> None:
    """setup.py, requirements*.txt, the Makefile, CMakeLists.txt, cmake/*.mk, .ci/run and
    every *.sh name only paths that exist (or are git-ignored build outputs)."""
    tracked = _tracked()
    files = _build_files(tracked)
    assert {"setup.py", "Makefile", "CMakeLists.txt", "requirements-dev.txt"} <= set(files)
    assert build_path_problems(files, tracked) == []


def test_a_stale_path_in_a_build_file_is_found() -> None:
    tracked = _tracked()
    files = {"setup.py": "# for tests/test_gone.py\nx = 'benchmarks/bench_gone.py'\n"
                         "y = 'python/mixprec/_C*.so'  # a build output, ignored\n",
             "CMakeLists.txt": "# see ../shared/DESIGN.md\nset(R \"$ORIGIN/../../torch/lib\")\n"
                               "# tests/cpp/CMakeLists.txt\n"}
    assert build_path_problems(files, tracked) == [
        "setup.py: `tests/test_gone.py`", "setup.py: `benchmarks/bench_gone.py`",
        "CMakeLists.txt: `../shared/DESIGN.md` is outside the repository"]


# ---------------------------------------------------------------------------------------------
# The launch capacity a doc quotes is the constant's


def launch_capacity() -> Dict[str, int]:
    """From csrc/cuda/launch_plan.h (the CUDA >= 12.1 branch): chunks (blocks) per launch and
    tensors per launch of a one-list op (``TensorListTable<1, kParamBytes, kMaxBlocks>``)."""
    src = (ROOT / "csrc" / "cuda" / "launch_plan.h").read_text()
    modern = src.split("#else", 1)[1].split("#endif", 1)[0]
    consts = {k: int(v) for k, v in re.findall(r"constexpr int (k\w+) = (\d+);", modern)}
    expr = re.search(r"kMaxTensors =\s*([^;]+);", src).group(1)  # type: ignore[union-attr]
    tensors = eval(expr, {}, {"Bytes": consts["kParamBytes"],  # noqa: S307
                              "Blocks": consts["kMaxBlocks"], "Depth": 1})
    return {"chunks": consts["kMaxBlocks"], "tensors": int(tensors)}


#: "<N> tensors and <M> chunks ... one launch" (or "/"): the numbers a doc quotes
_CAPACITY = re.compile(r"([\d,]+) tensors(?: and | / )([\d,]+) chunks[^.]*?\bone launch")


def capacity_problems(text: str, capacity: Dict[str, int]) -> List[str]:
    bad = []
    for tensors, chunks in _CAPACITY.findall(" ".join(text.split())):
        got = {"tensors": int(tensors.replace(",", "")), "chunks": int(chunks.replace(",", ""))}
        for k in got:
            if got[k] != capacity[k]:
                bad.append(f"{got[k]} {k} per launch; the code gives {capacity[k]}")
    return bad


def test_docs_quote_the_launch_capacity_of_the_code() -> None:
    capacity = launch_capacity()
    quoted = {doc: (ROOT / doc).read_text() for doc in DOCS}
    assert any(_CAPACITY.search(" ".join(t.split())) for t in quoted.values())  # docs/ops.md
    assert {doc: capacity_problems(t, capacity) for doc, t in quoted.items()
            if capacity_problems(t, capacity)} == {}


def test_a_wrong_capacity_is_found() -> None:
    capacity = {"tensors": 1036, "chunks": 2560}
    assert capacity_problems("packs up to ~1,500 tensors / 1,280 chunks of 64K\nelements "
                             "into one launch", capacity) == [
        "1500 tensors per launch; the code gives 1036",
        "1280 chunks per launch; the code gives 2560"]
    assert capacity_problems("up to 1,036 tensors and 2,560 chunks into one launch",
                             capacity) == []
