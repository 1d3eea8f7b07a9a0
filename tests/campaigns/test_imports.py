"""The campaign package has no import circle: each module imports on its own, and the graph of
top-level imports between campaign modules is acyclic (a module that enqueues imports
campaigns.queue, never campaigns.tasks)."""

from __future__ import annotations

import ast
import json
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


# One interpreter sets Django up once, then forks a child per module that imports it: each child starts
# from exactly the state a fresh `python -c "import django; django.setup(); import campaigns.X"` reaches
# before its import (setup is deterministic and starts no thread), without paying for a new interpreter
# and django.setup() 22 times (~1.2 s of CPU each). The verifier needs no Django: its child forks before
# the setup. Each child's exit status and error text come back per module.
FORKED_IMPORTS = """
import json, os, sys, traceback

def wait(pid, errors):
    os.close(errors[1])
    with os.fdopen(errors[0]) as text:
        error = text.read()
    return os.waitpid(pid, 0)[1] == 0, error

def run(module):
    errors = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(errors[0])
        os.dup2(errors[1], 2)
        try:
            __import__(f"campaigns.{module}")
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        sys.stderr.flush()
        os._exit(0)
    return wait(pid, errors)

modules = sys.argv[1:]
results = {}
if "verify" in modules:  # before Django is set up: the auditor's verifier imports on its own
    results["verify"] = run("verify")
import django
django.setup()
for module in modules:
    if module != "verify":
        results[module] = run(module)
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def imported_alone() -> dict[str, tuple[bool, str]]:
    result = subprocess.run(
        [sys.executable, "-c", FORKED_IMPORTS, *MODULES],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            "DJANGO_SETTINGS_MODULE": "gpusweep.settings",
            "PATH": "/usr/bin:/bin",
            "GPUSWEEP_VAR_DIR": str(REPO / "var"),
            "HOME": "/root",
        },
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return {module: (ok, error) for module, (ok, error) in json.loads(result.stdout.splitlines()[-1]).items()}


@pytest.mark.parametrize("module", MODULES)
def test_each_campaign_module_imports_on_its_own(module, imported_alone):
    ok, error = imported_alone[module]
    assert ok, error[-2000:]
