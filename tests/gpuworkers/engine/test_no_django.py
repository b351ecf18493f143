"""The engine is a library: no module under gpuworkers/engine imports django."""

import ast
from pathlib import Path

import gpuworkers.engine

ENGINE_DIR = Path(gpuworkers.engine.__file__).parent


def test_no_engine_module_imports_django():
    offenders = []
    for path in ENGINE_DIR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "django"]
    assert offenders == []
    assert len(list(ENGINE_DIR.rglob("*.py"))) > 10, "the walk found the engine's files"
