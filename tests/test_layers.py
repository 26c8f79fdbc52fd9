"""The layering: the math (assignments, plans, states, schemes, bounds, the index decoder)
and the cost model (``costs``) import and run without torch, and no import inside a function
hides a cycle."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "coded_shuffle"
MATH = [
    *sorted(
        "math." + ".".join(p.relative_to(PACKAGE / "math").with_suffix("").parts)
        for p in (PACKAGE / "math").rglob("*.py")
        if p.name != "__init__.py"
    ),
    "math",
    "math.schemes",
    "errors",
    *sorted(f"costs.{p.stem}" for p in (PACKAGE / "costs").glob("*.py") if p.stem != "__init__"),
    "costs",
]
# what each layer may import from the library (besides itself and coded_shuffle.errors)
LAYERS = {
    "math": set(),
    "costs": {"math"},
    "codec": {"math"},
    "distributed": {"math", "costs", "codec"},
    "elastic": {"math", "codec"},
    "tools": {"math", "costs", "codec", "distributed", "elastic"},
}


def test_the_math_imports_and_plans_without_torch():
    """In a fresh interpreter where ``import torch`` fails: every scheme plans, proves and
    bounds a few reshuffles."""
    script = textwrap.dedent(
        f"""
        import sys

        class NoTorch:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError("torch is unavailable in this test")

        sys.meta_path.insert(0, NoTorch())
        import numpy as np
        for m in {MATH!r}:
            __import__("coded_shuffle." + m)
        from coded_shuffle.math.assignment import random_assignment
        from coded_shuffle.math.transition_bounds import lower_bound
        from coded_shuffle.math.index_decoder import decode_plan
        from coded_shuffle.math.plan import plan_load
        from coded_shuffle.math.schemes import REGISTRY, get_scheme

        rng = np.random.default_rng(0)
        for name in REGISTRY:
            excess = ("elmahdy-mohajer", "attia-tandon-excess", "decentralized")
            storage = 2.0 if name in excess else 1.0
            scheme = get_scheme(name, 48)
            state = scheme.initial_state(random_assignment(12, 3, rng), 3, storage)
            for _ in range(2):
                new = random_assignment(12, 3, rng)
                plan = scheme.plan(state, new)
                for part in plan.plans:
                    decode_plan(part)
                assert plan_load(plan) >= lower_bound(state, new)[0] - 1e-9, name
                state = scheme.next_state(state, plan, new)
        from coded_shuffle.costs.model import Network

        assert Network("shared", 1e9, 1e9).datagrams(1e6) > 1e6
        assert "torch" not in sys.modules
        print("planned", len(REGISTRY))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=PACKAGE.parent
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "planned 7"


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def library_imports(path: Path, in_functions: bool = False) -> list[tuple[int, str]]:
    """The library modules ``path`` imports (``from coded_shuffle.x import y`` counts as
    ``coded_shuffle.x.y`` when that is a module), outside functions (``if TYPE_CHECKING:``
    blocks included) or inside them."""
    tree = ast.parse(path.read_text())
    functions = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]
    inside = [n for f in functions for n in ast.walk(f)]
    if in_functions:
        nodes = inside
    else:
        skip = {id(n) for n in inside}
        nodes = [n for n in ast.walk(tree) if id(n) not in skip]
    found = []
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.level:
            found.append((node.lineno, "." * node.level + (node.module or "")))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("coded_shuffle"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                where = PACKAGE.parent / Path(*sub.split("."))
                is_module = where.with_suffix(".py").exists() or (where / "__init__.py").exists()
                found.append((node.lineno, sub if is_module else node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("coded_")]
    return found


def library_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_import_inside_a_function_of_the_math():
    """Each such import hid a cycle; the math modules import at the top only."""
    paths = sorted((PACKAGE / "math").rglob("*.py"))
    assert len(paths) >= 16
    hidden = {str(p.relative_to(PACKAGE)): library_imports(p, True) for p in paths}
    assert not {k: v for k, v in hidden.items() if v}


def test_the_library_uses_absolute_imports_only():
    for path in library_modules():
        for line, name in library_imports(path) + library_imports(path, True):
            assert not name.startswith("."), f"{path}:{line}: relative import {name}"


def test_each_layer_imports_only_the_layers_below_it():
    for path in library_modules():
        name = module_name(path)
        layer = name.split(".")[1] if name.count(".") else ""
        if layer not in LAYERS:
            continue
        allowed = LAYERS[layer] | {layer, "errors", "version"}
        for line, imported in library_imports(path) + library_imports(path, True):
            other = imported.split(".")[1] if imported.count(".") else ""
            assert other in allowed, f"{name}:{line} ({layer}) imports {imported}"


def test_no_import_circles():
    """The graph of imports between library modules (at the top or inside a function) has no
    cycle (a package's ``__init__`` importing its own modules is not one)."""
    graph = {
        module_name(p): {m for _, m in library_imports(p) + library_imports(p, True)}
        for p in library_modules()
    }
    for name, deps in graph.items():
        deps.discard(name)
        graph[name] = {d for d in deps if d in graph and not name.startswith(d + ".")}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import circle: " + " -> ".join([*path, node, nxt]))
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


def test_the_paths_before_the_layers_are_gone():
    """No alias of an old module path (the project has no release to stay compatible with)."""
    import importlib

    import pytest

    for old in ("coded_shuffle.transports.chain", "coded_shuffle.schemes", "coded_shuffle.rates"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)


def test_both_registries_refuse_a_name_twice():
    import pytest

    from coded_shuffle.distributed.transports import REGISTRY as TRANSPORTS
    from coded_shuffle.distributed.transports import register as register_transport
    from coded_shuffle.math.schemes import REGISTRY as SCHEMES
    from coded_shuffle.math.schemes import register as register_scheme

    before = (dict(SCHEMES), dict(TRANSPORTS))
    with pytest.raises(ValueError, match="scheme 'cycles' is registered already"):
        register_scheme(type("Again", (SCHEMES["cycles"],), {}))
    with pytest.raises(ValueError, match="transport 'chain' is registered already"):
        register_transport(type("Again", (TRANSPORTS["chain"],), {}))
    assert (dict(SCHEMES), dict(TRANSPORTS)) == before


def test_the_jobs_import_each_other_without_circles():
    """``coded_shuffle_train/``'s modules (relative imports, at the top or in a function): no circle
    (the
    launcher and the per-rank entry share :mod:`coded_shuffle_train.compose`)."""
    root = PACKAGE.parent / "coded_shuffle_train"
    graph: dict[str, set[str]] = {}
    for path in sorted(root.glob("*.py")):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    deps.add(node.module.split(".")[0])
                else:
                    deps |= {a.name for a in node.names}
        graph[path.stem] = deps - {path.stem}
    assert {"entry", "launch", "compose"} <= set(graph)
    done: set[str] = set()

    def visit(node: str, path: tuple[str, ...]) -> None:
        if node in path:
            raise AssertionError("import circle: " + " -> ".join([*path, node]))
        if node in done or node not in graph:
            return
        for nxt in sorted(graph[node]):
            visit(nxt, (*path, node))
        done.add(node)

    for node in sorted(graph):
        visit(node, ())


FUNCTION_LINES_MAX = 80


def test_no_function_over_80_lines():
    """Functions that do one thing, in the library and the jobs (modules have no limit: they
    split where they hold two concerns)."""
    long_functions = []
    for path in [
        *library_modules(),
        *sorted((PACKAGE.parent / "coded_shuffle_train").rglob("*.py")),
    ]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if node.end_lineno - first + 1 > FUNCTION_LINES_MAX:
                    long_functions.append(f"{path.name}:{node.name}")
    assert not long_functions, long_functions


def test_the_formatter_alone_lays_out_the_code():
    """``ruff format`` alone lays out the library, the jobs, the scripts, the examples and
    the tests: no line opts out of it (``# fmt: skip``, ``# fmt: off``)."""
    root = PACKAGE.parent
    opted = re.compile(r"#\s*fmt:\s*(skip|off)\s*$")
    found = [
        f"{path.relative_to(root)}:{number}"
        for folder in ("coded_shuffle", "coded_shuffle_train", "scripts", "examples", "tests")
        for path in sorted((root / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if opted.search(line)
    ]
    assert not found, found


def test_the_jobs_read_typed_configs():
    """No job takes an untyped config, nor repeats a default with ``.get(key, default)``: the
    defaults live in coded_shuffle_train/config.py."""
    for path in sorted((PACKAGE.parent / "coded_shuffle_train").rglob("*.py")):
        text = path.read_text()
        assert "cfg: Any" not in text, path
        assert not re.search(r"cfg[\w.]*\.get\(", text), path
