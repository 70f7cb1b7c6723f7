"""The code's layers, as docs/architecture.md draws them, checked on the source (ast, no import).

- The faces of the core (the command line, the daemon, the MCP server) use its public modules
  only: ``supervisor`` itself, ``supervisor.syntax``, ``supervisor.lowlevel``, ``cgroupfs``,
  and each other; never a private ``_module`` of the core.
- Dependencies point down: ``cgroupfs`` never imports ``supervisor``; the core never imports
  its faces.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
FACES = ("cli", "serve", "mcp", "client.py")  # (the daemon's client shares serve's protocol)


def imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, absolute module) of each import in ``path``, relative ones resolved."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    return imports_of(path.read_text(), package)


def imports_of(text: str, package: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] \
                if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.append((node.lineno, module))
            # "from .. import _x" names a module too
            found += [(node.lineno, f"{module}.{a.name}") for a in node.names
                      if a.name.startswith("_") and node.module is None]
    return found


def private_core_module(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "supervisor" and len(parts) > 1 and parts[1].startswith("_")


def test_the_faces_use_the_cores_public_modules_only() -> None:
    wrong = []
    for face in FACES:
        where = ROOT / "supervisor" / face
        for path in sorted(where.rglob("*.py") if where.is_dir() else [where]):
            wrong += [f"{path.relative_to(ROOT)}:{line}: {module}"
                      for line, module in imports(path) if private_core_module(module)]
    assert not wrong, "a face of the core imports its private modules:\n" + "\n".join(wrong)


def test_dependencies_point_down() -> None:
    wrong = []
    for path in sorted((ROOT / "cgroupfs").rglob("*.py")):
        wrong += [f"{path.relative_to(ROOT)}:{line}: {module}"
                  for line, module in imports(path) if module.split(".")[0] == "supervisor"]
    core = [p for p in (ROOT / "supervisor").rglob("*.py")
            if p.relative_to(ROOT / "supervisor").parts[0] not in FACES]
    for path in sorted(core):
        wrong += [f"{path.relative_to(ROOT)}:{line}: {module}"
                  for line, module in imports(path)
                  if module.split(".")[:2] in ([["supervisor", f] for f in FACES])
                  and path.name != "__main__.py"]
    assert not wrong, "an import points up a layer:\n" + "\n".join(wrong)


def test_a_private_import_of_a_face_is_caught() -> None:
    text = ("from .._spec import TaskSpec\nfrom .. import TaskHandle, _task\n"
            "import supervisor._life\nfrom ..syntax import parse_size\n")
    found = [m for _, m in imports_of(text, "supervisor.cli") if private_core_module(m)]
    assert found == ["supervisor._spec", "supervisor._task", "supervisor._life"]
