"""The layering: the math (assignments, plans, states, schemes, bounds, the index decoder)
imports and runs without torch, and no import inside a function hides a cycle."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "coded_shuffle"
MATH = [
    "assignment",
    "plan",
    "state",
    "schemes",
    "bounds",
    "bounds_api",
    "rate_memory",
    "decoder",
    "errors",
]


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
        from coded_shuffle.assignment import random_assignment
        from coded_shuffle.bounds_api import lower_bound
        from coded_shuffle.decoder import decode_plan
        from coded_shuffle.plan import plan_load
        from coded_shuffle.schemes import REGISTRY, get_scheme

        rng = np.random.default_rng(0)
        for name in REGISTRY:
            storage = 2.0 if name in ("elmahdy-mohajer", "attia-tandon-excess") else 1.0
            scheme = get_scheme(name, 48)
            state = scheme.initial_state(random_assignment(12, 3, rng), 3, storage)
            for _ in range(2):
                new = random_assignment(12, 3, rng)
                plan = scheme.plan(state, new)
                for part in plan.plans:
                    decode_plan(part)
                assert plan_load(plan) >= lower_bound(state, new)[0] - 1e-9, name
                state = scheme.next_state(state, plan, new)
        assert "torch" not in sys.modules
        print("planned", len(REGISTRY))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=PACKAGE.parent
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "planned 6"


def _function_imports(path: Path) -> list[tuple[int, str]]:
    """Relative imports (within the package) made inside a function of ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and inner.level > 0:
                    found.append((inner.lineno, "." * inner.level + (inner.module or "")))
    return found


def test_no_import_inside_a_function_of_the_math():
    """Each such import hid a cycle; the math modules import at the top only."""
    paths = [PACKAGE / f"{m}.py" for m in MATH if (PACKAGE / f"{m}.py").exists()]
    paths += sorted((PACKAGE / "schemes").glob("*.py"))
    assert len(paths) >= 14
    hidden = {str(p.relative_to(PACKAGE)): _function_imports(p) for p in paths}
    assert not {k: v for k, v in hidden.items() if v}
