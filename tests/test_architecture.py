"""The shape of the house, checked: layers, no import cycles, short functions, a small
top floor, one policy contract.

Read over ``ast`` (nothing is imported), so a violation names the file and line. Every
hogkit import counts, a function-level one included: an import inside a function still
runs, and a lazy import that points upward is still an arrow pointing the wrong way.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hogkit"
KERNELS = ROOT / "kernels"

#: layers, lowest first: a module may import its own layer and those below, nothing above.
#: The first pattern that matches a module name decides its layer.
LAYERS = [
    ("kernels", ("hogkit.kernels",)),
    ("base", ("hogkit.errors", "hogkit.validation", "hogkit.procfs", "hogkit.report",
              "hogkit.rules.grads")),
    ("state", ("hogkit.state", "hogkit.p3.propagation", "hogkit.p3.profiles",
               "hogkit.p3.comm")),
    ("knobs", ("hogkit.policy", "hogkit.rules", "hogkit.engine.delays",
               "hogkit.engine.run", "hogkit.engine.mainguard")),
    ("parse", ("hogkit.parse", "hogkit.workloads")),
    ("engine", ("hogkit.engine",)),
    ("doors", ("hogkit.cluster", "hogkit.spawning", "hogkit.optim", "hogkit.races",
               "hogkit.explore", "hogkit.stress",
               "hogkit.calibrate", "hogkit.p3")),
    ("tools", ("hogkit.testing", "hogkit.sweeps", "hogkit.doctor", "hogkit.cli")),
    ("face", ("hogkit",)),
]


def _module_name(path: pathlib.Path) -> str:
    if path.is_relative_to(KERNELS):
        rel = ("kernels",) + path.relative_to(KERNELS).with_suffix("").parts[0:]
        parts = ["hogkit"] + list(rel)
    else:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources():
    for base in (PACKAGE, KERNELS):
        for path in sorted(base.rglob("*.py")):
            yield path, _module_name(path)


def _layer(module: str) -> int:
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if module == p or module.startswith(p + "."):
                return i
    raise AssertionError(f"{module} is in no layer of tests/test_architecture.py LAYERS")


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _known(name: str, modules: set) -> str | None:
    """The longest known module that ``name`` is or lies in."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph():
    """``{module: [(imported module, line)]}`` over hogkit/ and kernels/."""
    sources = list(_sources())
    modules = {m for _, m in sources}
    graph = {}
    for path, module in sources:
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        edges = []
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                src = _resolve(module, node, is_package)
                # `from hogkit.engine import entry`: the submodule is the target
                targets = [f"{src}.{a.name}" if f"{src}.{a.name}" in modules else src
                           for a in node.names]
            for t in targets:
                k = _known(t, modules)
                if k is not None and k != module:
                    edges.append((k, node.lineno))
        graph[module] = edges
    return graph


def _cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w, _ in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    cycles = _cycles(import_graph())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_no_upward_import():
    bad = []
    for module, edges in import_graph().items():
        for target, line in edges:
            if module == "hogkit":
                continue                # the face re-exports everything
            if _layer(target) > _layer(module):
                bad.append(f"{module}:{line} imports {target} "
                           f"({LAYERS[_layer(module)][0]} -> {LAYERS[_layer(target)][0]})")
    assert not bad, "imports pointing upward:\n" + "\n".join(bad)


def test_kernels_import_nothing_of_hogkit():
    for path, module in _sources():
        if not module.startswith("hogkit.kernels"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            assert not any(n == "hogkit" or n.startswith("hogkit.") for n in names), (
                f"{path.name}:{node.lineno}: kernels import nothing of hogkit")


def test_called_kernels_state_their_fast_math_flags():
    """A numba kernel that states no ``fastmath`` takes its first caller's flags and
    caches that build: a rule kernel compiled first by a direct call ran without the
    engines' reassociation in every later process on that cache, and simulated
    DC-ASGD / Gap-Aware cells missed their stored losses. Every called (not inlined)
    kernel therefore names its flags."""
    bad = []
    for path in sorted(KERNELS.glob("*.py")):
        name = path.name
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            for dec in node.decorator_list:
                if not (isinstance(dec, ast.Call) and getattr(dec.func, "id", "") == "njit"):
                    continue
                kw = {k.arg: k.value for k in dec.keywords}
                inline = kw.get("inline")
                if isinstance(inline, ast.Constant) and inline.value == "always":
                    continue            # inlined: compiled under its caller's flags
                if "fastmath" not in kw:
                    bad.append(f"{name}:{node.lineno} {node.name}")
    assert not bad, "called kernels without their own fastmath flags:\n" + "\n".join(bad)


MAX_LINES = 80


def test_functions_are_short():
    long = []
    for path, module in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_LINES:
                    long.append(f"{module}.{node.name} ({path.relative_to(ROOT)}:"
                                f"{node.lineno}): {n} lines")
    assert not long, f"functions over {MAX_LINES} lines:\n" + "\n".join(long)


def test_top_floor_is_small():
    flat = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(flat) <= 16, f"{len(flat)} modules directly in hogkit/: {flat}"


_POLICY_CLASSES = {"SSP", "BSP", "Async", "DSSP", "LocalSGD", "BoundedDelay"}


def test_policy_capabilities_are_declared_by_the_policy():
    """Engines read a policy's encoding; asking ``isinstance`` of every policy class is
    what this room exists to remove (at most 2 places where a capability truly differs)."""
    found = []
    for path, module in _sources():
        if module.startswith("hogkit.policy"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "isinstance" and len(node.args) == 2):
                cls = node.args[1]
                names = [e.id for e in (cls.elts if isinstance(cls, ast.Tuple) else [cls])
                         if isinstance(e, ast.Name)]
                if _POLICY_CLASSES & set(names):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert len(found) <= 2, "policy isinstance checks outside hogkit/policy: " + ", ".join(found)


def test_moved_modules_still_import_with_a_warning():
    """Every module that moved into a wing imports at its old path as the same module
    object, warning with the new path (CHANGELOG.md lists them)."""
    import importlib
    import sys

    import hogkit
    for old, new in sorted(hogkit._MOVED.items()):
        if old == "hogkit.p3live":
            continue                # imports torch: checked by name only below
        sys.modules.pop(old, None)
        with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
            module = importlib.import_module(old)
        assert module is importlib.import_module(new)
        assert (PACKAGE / (new.replace("hogkit.", "", 1).replace(".", "/") + ".py")).exists()
    assert hogkit._MOVED["hogkit.p3live"] == "hogkit.p3.live"
