"""The import structure of mojo_train: no import circles, and no numpy or torch at import.

Contract under test (issue 11, point 5): the modules of the package import one another in
layers (_errors, _dtypes -> _probe -> _array -> device -> _buffer -> _ops -> the families), so
the graph of their module-level imports, read from the source with ``ast``, has no cycle; nor
does it gain one when the imports inside functions are added, so a late import never hides a
circle (the late imports left only defer a cost: ctypes for DLPack, the optimizers' schedule).
And ``import mojo_train`` loads neither numpy nor torch (they are never dependencies), nor the
torch adapter ``mojo_train.torch``, which no module of the package imports; the adapter's own
modules import one another without a circle too.
"""
import ast
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "mojo_train")
MODULES = sorted(name[:-3] for name in os.listdir(PACKAGE) if name.endswith(".py"))


def _targets(node):
    """The package modules an import statement names ("__init__" for the package itself or an
    attribute of it, e.g. ``from . import __version__``)."""
    if isinstance(node, ast.ImportFrom):
        module = node.module or ""
        if node.level == 0:
            if module.split(".")[0] != "mojo_train":
                return []
            module = module[len("mojo_train"):].lstrip(".")
        if module:
            return [module.split(".")[0]]
        return [a.name if a.name in MODULES else "__init__" for a in node.names]
    parts = [a.name.split(".") for a in node.names]
    return [p[1] if len(p) > 1 else "__init__" for p in parts if p[0] == "mojo_train"]


def _imports(tree, late):
    """Package modules imported at module level (``late=False``: what runs on import, class
    bodies and ``if`` blocks included) or inside functions (``late=True``)."""
    found = set()

    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)) and inner == late:
                found.update(_targets(child))
            walk(child, inner)

    walk(tree, False)
    return found


def import_graph(late=False):
    """{module: modules it imports}; with ``late=True`` the imports inside functions are added."""
    graph = {}
    for name in MODULES:
        with open(os.path.join(PACKAGE, name + ".py"), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        edges = _imports(tree, False) | (_imports(tree, True) if late else set())
        graph[name] = {m for m in edges if m != name}
    return graph


def find_cycle(graph):
    """One import circle as a path ``[a, b, ..., a]``, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_cycle_finder_reports_a_circle_and_passes_a_layered_graph():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_graph_reads_relative_absolute_and_attribute_imports():
    tree = ast.parse("from . import _buffer, __version__\nfrom ._ops import f\nimport mojo_train\n"
                     "from mojo_train import _npz\nimport mojo_train._probe\nimport os\n"
                     "def g():\n    from .device import DeviceArray\n")
    assert _imports(tree, False) == {"_buffer", "__init__", "_ops", "_npz", "_probe"}
    assert _imports(tree, True) == {"device"}


def test_every_module_of_the_package_is_in_the_graph_with_its_imports():
    graph = import_graph()
    assert set(graph) == set(MODULES)
    assert "_probe" in graph["_array"] and "_array" in graph["_buffer"]


@pytest.mark.parametrize("late", [False, True], ids=["module_level", "with_function_level"])
def test_the_import_graph_of_mojo_train_has_no_cycle(late):
    cycle = find_cycle(import_graph(late))
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_import_mojo_train_imports_neither_numpy_nor_torch():
    code = ("import sys, mojo_train\n"
            "print(sorted(m for m in ('numpy', 'torch', 'mojo_train.torch') if m in sys.modules))")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("module", ["mojo_train.torch", "mojo_train.distributed"])
def test_the_torch_modules_without_torch_say_what_to_install(module):
    # torch made unimportable (sys.modules['torch'] = None): the ImportError names the fix, not
    # just "No module named 'torch'"; import mojo_train itself still works.
    code = ("import sys; sys.modules['torch'] = None\nimport mojo_train\n"
            "try:\n    import %s\nexcept ImportError as e:\n    print(e)" % module)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("%s needs PyTorch, which mojo_train itself does not depend on: pip install torch "
                                   "(or pip install 'mojo_train[torch]')" % module)


ADAPTER = os.path.join(PACKAGE, "torch")


def _adapter_modules():
    return sorted(name[:-3] for name in os.listdir(ADAPTER) if name.endswith(".py"))


def _imports_the_adapter(node):
    """True when an import statement of a top-level module names mojo_train.torch."""
    if isinstance(node, ast.ImportFrom):
        module = node.module or ""
        if node.level == 1:
            return module.split(".")[0] == "torch" or (not module and any(a.name == "torch" for a in node.names))
        return node.level == 0 and (module == "mojo_train.torch" or module.startswith("mojo_train.torch.")
                                    or (module == "mojo_train" and any(a.name == "torch" for a in node.names)))
    return isinstance(node, ast.Import) and any(a.name.startswith("mojo_train.torch") for a in node.names)


def test_no_module_of_mojo_train_imports_the_torch_adapter():
    offenders = []
    for name in MODULES:
        with open(os.path.join(PACKAGE, name + ".py"), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        offenders += [name for node in ast.walk(tree) if _imports_the_adapter(node)]
    assert offenders == []


def test_the_torch_adapter_imports_its_own_modules_without_a_circle():
    graph = {}
    for name in _adapter_modules():
        with open(os.path.join(ADAPTER, name + ".py"), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                edges.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
        graph[name] = {m for m in edges if m != name and m in _adapter_modules()}
    assert {"__init__", "_functions", "functional", "modules", "nn"} <= set(graph)
    assert "_functions" in graph["functional"] and "functional" in graph["modules"]
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)
