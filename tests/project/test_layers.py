"""The Python package's layers: no import cycle under python/mixprec (imports made only for
type checking count too), the scaler layer (``amp``) never imports the optimizer layer
(``optim``) nor the reverse; both stand on ``ops`` and ``_step``; no module reads a private
attribute (``obj._name``) that another mixprec module defines; the path of a scaler iteration
never calls back into a file it came through (a helper that takes its owner and calls it
back does); and following ``scaler.step(optimizer)`` opens each file once (the op layer
once per op).

``python tests/project/test_layers.py`` prints the module graph, one module per line with what it
imports, lowest layer first; ``python tests/project/test_layers.py path`` the files that
``scaler.step(optimizer)`` opens, in order, for each kind of optimizer.
"""

from __future__ import annotations

import ast
import inspect
import os
import sys
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import pytest
import torch

# parents[2], not _helpers.REPO: ``python tests/project/test_layers.py`` runs it as a script
PKG = Path(__file__).resolve().parents[2] / "python" / "mixprec"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def import_graph() -> Dict[str, Set[str]]:
    """module -> the mixprec modules it imports (a package is its ``__init__``; ``from .
    import x`` of a submodule ``x`` imports that submodule, not the package)."""
    modules = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph: Dict[str, Set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: List[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    origin = ".".join(base + ([node.module] if node.module else []))
                else:
                    origin = node.module or ""
                subs = [f"{origin}.{a.name}" for a in node.names
                        if f"{origin}.{a.name}" in modules]
                # the package itself only where a name is not one of its submodules
                targets = subs if len(subs) == len(node.names) else [origin] + subs
            for t in targets:
                if t in modules and t != mod:
                    graph[mod].add(t)
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The cycles of ``graph`` (each as a list of modules, the first repeated last)."""
    sub = graph
    found: List[List[str]] = []
    state: Dict[str, int] = {}
    stack: List[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(sub[m]):
            if state.get(t) == 1:
                found.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(sub):
        if m not in state:
            visit(m)
    return found


def test_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_the_scaler_layer_does_not_import_the_optimizers() -> None:
    graph = import_graph()
    bad = sorted((m, t) for m in graph if m.startswith("mixprec.amp")
                 for t in graph[m] if t.startswith("mixprec.optim"))
    assert bad == []


def test_the_optimizer_layer_does_not_import_the_scaler() -> None:
    """As torch's optimizers take the scaler's tensors without importing the scaler, the
    optimizers take ``StepScalars`` (and raise ``IneffectiveSettingWarning``) from
    ``mixprec._step``, below both layers."""
    graph = import_graph()
    bad = sorted((m, t) for m in graph if m.startswith("mixprec.optim")
                 for t in graph[m] if t.startswith("mixprec.amp"))
    assert bad == []
    assert {"mixprec._step"} <= graph["mixprec.optim._base"]
    assert {"mixprec._step"} <= graph["mixprec.amp.protocol"]


#: Private attributes of torch's objects that mixprec reads, with the reason. They are
#: torch's (a DTensor's local shard and spec, a sparse grad's values, a module's
#: parameter/buffer dicts, the LR scheduler's step-order markers, an op's schema, the
#: methods GradScaler extends through ``super()``), not another mixprec module's.
TORCH_PRIVATES = {
    "_local_tensor", "_spec", "_values", "_parameters", "_buffers", "_opt_called",
    "_wrapped_by_lr_sched", "_schema", "_lazy_init_scale_growth_tracker",
    "_init_state", "_convert_state", "_Loss", "_InstanceNorm", "_BatchNorm",
    "_step_supports_amp_scaling", "_op_dispatcher", "_custom_op_handlers", "_fields",
}

#: Private attributes one mixprec module declares on objects that another reads by design:
#: an optimizer's declarations to the scaler (what it takes, whether it keeps masters) and
#: the policy tag module_policy puts on a model.
DECLARED_PRIVATES = {"_step_takes_scalars", "_mixprec_master_weights", "_mixprec_policy"}


def _defined_privates(tree: ast.AST) -> Set[str]:
    """The private names a module defines: functions, classes, assigned attributes and
    globals starting with one underscore."""
    out: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and ast.unparse(node.value) in ("self", "cls")):
            out.add(node.attr)  # (a store into another object's private is not a definition)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
    return {n for n in out if n.startswith("_") and not n.startswith("__")}


def _private_access(node: ast.AST) -> Optional[Tuple[ast.AST, str]]:
    """``(object, name)`` when ``node`` reads or writes a private attribute: ``obj._name``,
    or ``getattr``/``setattr``/``hasattr`` of ``obj`` with the name as a string."""
    if isinstance(node, ast.Attribute):
        obj, name = node.value, node.attr
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
          and node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) >= 2
          and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        obj, name = node.args[0], node.args[1].value
    else:
        return None
    return (obj, name) if name.startswith("_") and not name.startswith("__") else None


def foreign_private_reads(sources: Dict[str, str]) -> List[str]:
    """``module:line: expr._name`` for every read or write of a private attribute (also by
    ``getattr``/``setattr`` with the name as a string) of something other than
    ``self``/``cls``/a torch name, that the reading module does not define on its own
    objects and that is not one of :data:`TORCH_PRIVATES`."""
    trees = {m: ast.parse(src) for m, src in sources.items()}
    out: List[str] = []
    for mod, tree in trees.items():
        own = _defined_privates(tree)
        for node in ast.walk(tree):
            access = _private_access(node)
            if access is None:
                continue
            base = ast.unparse(access[0])
            attr = access[1]
            if (base in ("self", "cls") or base.split(".")[0] == "torch"
                    or attr in own or attr in TORCH_PRIVATES or attr in DECLARED_PRIVATES):
                continue
            out.append(f"{mod}:{node.lineno}: {base}.{attr}")
    return out


def _sources() -> Dict[str, str]:
    return {_module_name(p): p.read_text() for p in PKG.rglob("*.py")}


def test_no_module_reads_another_modules_privates() -> None:
    assert foreign_private_reads(_sources()) == []


def test_a_foreign_private_read_is_found() -> None:
    """The check itself: a planted read of the optimizer's private hook is reported."""
    sources = _sources()
    sources["mixprec.amp.protocol"] += "\n\ndef _x(optimizer):\n    return optimizer._run\n"
    assert foreign_private_reads(sources) == [
        f"mixprec.amp.protocol:{sources['mixprec.amp.protocol'].count(chr(10)) - 0}: "
        "optimizer._run"]
    sources = _sources()
    sources["mixprec.capture"] += ("\n\ndef _y(scaler):\n    scaler._mp_last = None\n"
                                   "    return getattr(scaler, '_scale', None)\n")
    n = sources["mixprec.capture"].count(chr(10))
    assert foreign_private_reads(sources) == [f"mixprec.capture:{n - 1}: scaler._mp_last",
                                              f"mixprec.capture:{n}: scaler._scale"]


def _imported_root() -> str:
    """Where the running ``mixprec`` is (a build may run a copy of ``python/mixprec``)."""
    import mixprec

    return os.path.dirname(os.path.abspath(mixprec.__file__)) + "/"


def _trace(fn: Callable[[], Any], on_call: Callable[[str, List[str], str], None]) -> None:
    """Run ``fn`` under a profile hook that calls ``on_call(file, below, function)`` for
    every call into a mixprec file (relative to the imported package), ``below`` the mixprec
    files on the stack under it, innermost last. A generator resumed where it is consumed
    (data passed lazily, e.g. to ``any``) is not a call."""
    root = _imported_root()
    stack: List[Optional[str]] = []

    def prof(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            name = frame.f_code.co_filename
            lazy = frame.f_code.co_flags & inspect.CO_GENERATOR
            f = name[len(root):] if name.startswith(root) and not lazy else None
            if f is not None:
                on_call(f, [x for x in stack if x is not None], frame.f_code.co_name)
            stack.append(f)
        elif event == "return" and stack:
            stack.pop()

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)


def callbacks(fn: Callable[[], Any], seen: Optional[List[int]] = None) -> List[str]:
    """Run ``fn`` and list every call into a mixprec file that is already on the stack
    below another mixprec file (``a.py -> b.py -> a.py``): a call back up the layers.
    Calls within one file, calls through torch, and a generator resumed where it is
    consumed (data passed lazily, e.g. to ``any``) are not callbacks. ``seen``, when given,
    gets the number of mixprec calls traced appended (so that a check cannot pass by
    seeing none)."""
    found: List[str] = []
    calls = [0]

    def on_call(f: str, below: List[str], name: str) -> None:
        calls[0] += 1
        path = [x for i, x in enumerate(below) if i == 0 or below[i - 1] != x]
        if f in path and path[-1] != f:
            found.append(" -> ".join(path + [f]) + f" ({name})")

    _trace(fn, on_call)
    if seen is not None:
        seen.append(calls[0])
    return found


def scaler_iteration(kind: str) -> Tuple[Any, torch.optim.Optimizer, Callable[[], None]]:
    """A CPU ``mixprec.GradScaler``, an optimizer of ``kind`` (mixprec's AdamW ``"fp32"``,
    ``"bf16 8-bit"``; ``"sgd"`` with momentum; ``"torch fused"`` AdamW,
    ``"torch sgd"``) over a two-layer model, and its backward pass; two iterations run, so
    the state and plans exist: the path of every later step."""
    import mixprec

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 4))
    if kind == "bf16 8-bit":
        model = model.to(torch.bfloat16)
        opt: torch.optim.Optimizer = mixprec.optim.AdamW(model.parameters(), state_bits=8,
                                                         min_8bit_size=16)
    elif kind == "sgd":
        opt = mixprec.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    elif kind == "torch fused":
        opt = torch.optim.AdamW(model.parameters(), fused=True)
    elif kind == "torch sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    else:
        opt = mixprec.optim.AdamW(model.parameters())
    scaler = mixprec.GradScaler("cpu")

    def backward() -> None:
        opt.zero_grad(set_to_none=False)
        x = torch.randn(2, 64, dtype=next(model.parameters()).dtype)
        scaler.scale(model(x).float().sum()).backward()

    for _ in range(2):
        backward()
        scaler.step(opt)
        scaler.update()
    return scaler, opt, backward


@pytest.mark.parametrize("kind", ["fp32", "bf16 8-bit"])
def test_a_scaler_iteration_never_calls_back_up(kind: str) -> None:
    """``scaler.step`` (with and without ``clip_grad_norm_``), ``unscale_`` and ``update``
    over mixprec's AdamW, 32- and 8-bit: each file is entered from above only."""
    scaler, opt, backward = scaler_iteration(kind)
    paths: Dict[str, Callable[[], Any]] = {
        "step": lambda: scaler.step(opt),
        "update": scaler.update,
        "clip + step": lambda: (scaler.clip_grad_norm_(opt, 1.0), scaler.step(opt)),
        "unfused clip + step": lambda: (scaler.clip_grad_norm_(opt, 1.0, fold_into_step=False),
                                        scaler.step(opt)),
        "unscale_ + step": lambda: (scaler.unscale_(opt), scaler.step(opt)),
    }
    for name, run in paths.items():
        backward()
        if name == "update":
            scaler.step(opt)
        seen: List[int] = []
        assert callbacks(run, seen) == [], name
        assert seen[0] > 3, (name, seen)  # the mixprec calls were traced
        if name != "update":
            scaler.update()


def file_entries(fn: Callable[[], Any]) -> List[str]:
    """Run ``fn`` and list, in order, each call that enters a mixprec file from another
    file (or from outside mixprec) as ``"file (function)"``: the files a reader following
    the calls opens. Returning to a caller is not an entry; nor is a call within a file, a
    generator resumed where it is consumed, or the ``__enter__``/``__exit__`` of a context
    manager (read with the call that made it: ``with torch.no_grad():`` is one
    visit), nor what the op layer (``ops/__init__.py``) calls on an op's behalf (it is
    entered once per op: each op's route asks ``_dtensor.py`` for the DTensor class, and
    the dispatcher calls the op's Autograd-key kernel in ``ops/_autograd.py``)."""
    entries: List[str] = []

    def on_call(f: str, below: List[str], name: str) -> None:
        if (not below or below[-1] != f) and name not in ("__enter__", "__exit__") \
                and "ops/__init__.py" not in below:
            entries.append(f"{f} ({name})")

    _trace(fn, on_call)
    return entries


def twice_entered(entries: List[str]) -> List[str]:
    """The files of ``entries`` entered more than once, except the op layer
    (``ops/__init__.py``), which is entered once per op, each a different one."""
    files = [e.split(" ", 1)[0] for e in entries]
    ops = [e for e in entries if e.startswith("ops/__init__.py ")]
    return sorted({f for f in files if files.count(f) > 1 and f != "ops/__init__.py"}
                  | ({"ops/__init__.py"} if len(set(ops)) != len(ops) else set()))


STEP_KINDS = ["fp32", "bf16 8-bit", "sgd", "torch fused", "torch sgd"]


def scaler_step_entries(kind: str) -> List[str]:
    """:func:`file_entries` of ``scaler.step(optimizer)`` on a step whose state and plans
    exist (every step but the first), for an optimizer of ``kind``."""
    scaler, opt, backward = scaler_iteration(kind)
    backward()
    return file_entries(lambda: scaler.step(opt))


@pytest.mark.parametrize("kind", STEP_KINDS)
def test_scaler_step_enters_each_file_once(kind: str) -> None:
    """Following ``scaler.step(optimizer)`` through the code opens each file once: the
    scaler asks the capability, runs the inf check, hands the step over, and the optimizer
    runs its kernel; nothing returns to a file for a second piece of work. The op layer is
    entered once per op (the inf check, the step's kernel, a second kernel for the 32-bit
    params of an 8-bit group)."""
    entries = scaler_step_entries(kind)
    assert entries[0] == "amp/grad_scaler.py (step)", entries
    assert any(e.startswith("ops/__init__.py ") for e in entries), entries  # the inf check
    assert twice_entered(entries) == [], entries


def test_a_second_entry_is_found() -> None:
    """The check itself: a file entered twice is reported, the op layer only for an op
    run twice."""
    assert twice_entered(["a.py (f)", "b.py (g)", "a.py (h)"]) == ["a.py"]
    assert twice_entered(["ops/__init__.py (x_)", "ops/__init__.py (y_)"]) == []
    assert twice_entered(["ops/__init__.py (x_)", "ops/__init__.py (x_)"]) == [
        "ops/__init__.py"]


def test_a_callback_is_found() -> None:
    """The check itself: a helper calling its owner back is reported."""
    from mixprec.amp import grad_scaler, grads

    scaler = grad_scaler.GradScaler("cpu")
    original = grads.fp16_grads_allowed
    planted: Dict[str, Any] = {"scaler": scaler}
    # a helper in amp/grads.py that asks its owner (a property of amp/grad_scaler.py)
    exec(compile("def allowed(setting, opt):\n    return scaler.policy == 'torch'\n",
                 _imported_root() + "amp/grads.py", "exec"), planted)
    try:
        grads.fp16_grads_allowed = planted["allowed"]
        opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
        assert len(callbacks(
            lambda: scaler._unscale_grads_(opt, torch.ones(()), torch.zeros(()), False))) == 1
    finally:
        grads.fp16_grads_allowed = original


def test_a_cycle_is_found() -> None:
    """The check itself: a planted cycle is reported."""
    graph = import_graph()
    graph["mixprec.ops._dtensor_rules"].add("mixprec.amp.grad_scaler")
    assert cycles(graph)


if __name__ == "__main__":
    if sys.argv[1:] == ["path"]:  # the files scaler.step(optimizer) opens, in order
        for kind in STEP_KINDS:
            entries = scaler_step_entries(kind)
            print(f"{kind}: {len(entries)} entries, {len({e.split()[0] for e in entries})} "
                  f"files, twice: {twice_entered(entries) or '-'}")
            print("  " + "\n  ".join(entries))
        sys.exit(0)
    g = import_graph()
    for m in sorted(g, key=lambda m: (len(g[m]), m)):
        print(f"{m}: {', '.join(sorted(g[m])) or '-'}")
