"""The campaign package has no import circle: each module imports on its own, and the graph of
top-level imports between campaign modules is acyclic (a module that enqueues imports
campaigns.queue, never campaigns.tasks)."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from tests.helpers import REPO

PACKAGE = REPO / "campaigns"
MODULES = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__",))


def _imports(module: str) -> set[str]:
    """Campaign modules `module` imports at its top level (not inside functions)."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "campaigns":
                found |= {alias.name for alias in node.names if alias.name in MODULES}
            elif node.module.startswith("campaigns."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("campaigns.")}
    return found & set(MODULES)


def test_the_campaign_modules_import_each_other_without_a_circle():
    graph = {module: _imports(module) for module in MODULES}
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for other in sorted(graph[module]):
            if state.get(other) == "open":
                raise AssertionError(f"import circle: {' -> '.join([*path, module, other])}")
            if other not in state:
                visit(other, [*path, module])
        state[module] = "done"

    for module in MODULES:
        if module not in state:
            visit(module, [])
    assert "tasks" not in {m for deps in graph.values() for m in deps}, "enqueue through campaigns.queue"


@pytest.mark.parametrize("module", MODULES)
def test_each_campaign_module_imports_on_its_own(module):
    code = f"import django; django.setup(); import campaigns.{module}"
    if module == "verify":
        code = "import campaigns.verify"  # the auditor's verifier needs no Django at all
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                            env={"DJANGO_SETTINGS_MODULE": "gpusweep.settings", "PATH": "/usr/bin:/bin",
                                 "GPUSWEEP_VAR_DIR": str(REPO / "var"), "HOME": "/root"})
    assert result.returncode == 0, result.stderr[-2000:]
