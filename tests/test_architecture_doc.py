"""docs/architecture.md names only files and functions that exist.

Every file or directory the document names (in a code span, in its prose, in the layer listing
under "## Layers", in the "Where to look" table) is in the repository, and every
``file:function`` (or ``file:Class.method``) it names is defined in that file: for Python, a
``def`` or ``class`` at any level (found with ast); for C, a function definition (a regex).
A file named without its directories (``_guard.py``, ``cli/``) must be the only one of that
name.  Pure reads of the source tree: no root, no cgroups, no trio.
"""

from __future__ import annotations

import ast
import functools
import os
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"

# Not part of the source tree: environments, build output, caches.
_SKIP_DIRS = {".git", ".venv", "venv", "build", "dist", "__pycache__", ".mypy_cache",
              ".ruff_cache", ".pytest_cache", "node_modules"}
_FILE_EXT = r"(?:py|c|h|md|json|toml|service|socket)"
# ``path:name`` or ``path:Class.method`` in a code span
_FUNC_REF = re.compile(r"^([\w./+-]+\.(?:py|c|h)):([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)$")
# a whole code span that names a file or a directory of ours
_PATH_REF = re.compile(rf"^(?:[\w.+-]+/)*[\w.+-]+(?:\.{_FILE_EXT}|/)$")
# a file named in the prose, outside code spans
_PROSE_FILE = re.compile(rf"(?<![\w/.<-])((?:[\w+-]+/)*[\w+-][\w.+-]*\.{_FILE_EXT})(?![\w/])")
_SPAN = re.compile(r"`([^`\n]+)`")
_FENCE = re.compile(r"^```.*?^```[ \t]*$", re.M | re.S)
_LISTING_NAME_COLUMN = 16  # in the layer listing, a line indented this far continues the last


@functools.lru_cache(maxsize=1)
def repo_paths() -> tuple[frozenset[str], frozenset[str]]:
    """(files, directories) of the repository, as paths relative to its root."""
    files, dirs = set(), set()
    for here, subdirs, names in os.walk(ROOT):
        subdirs[:] = [d for d in subdirs if d not in _SKIP_DIRS and not d.endswith(".egg-info")]
        rel = os.path.relpath(here, ROOT)
        prefix = "" if rel == "." else rel + "/"
        dirs.update(prefix + d for d in subdirs)
        files.update(prefix + n for n in names)
    return frozenset(files), frozenset(dirs)


def resolve(ref: str) -> tuple[str | None, str]:
    """The repository path ``ref`` names (None: none, or more than one), and why not."""
    files, dirs = repo_paths()
    want_dir = ref.endswith("/")
    name = ref.rstrip("/")
    pool = dirs if want_dir else files | dirs
    if name in pool:
        return name, ""
    found = sorted(p for p in pool if p.endswith("/" + name))
    if len(found) == 1:
        return found[0], ""
    if not found:
        return None, "no such file or directory in the repository"
    return None, f"ambiguous: it could be any of {', '.join(found)}; write the full path"


def python_names(path: pathlib.Path) -> set[str]:
    """Every def and class of a Python file, by its dotted nesting (``Class.method``), and
    every name a module-level assignment makes (a table like ``PUBLIC_STATE``)."""
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                qualified = prefix + child.name
                names.add(qualified)
                visit(child, qualified + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return names


def python_defines(path: pathlib.Path, name: str) -> bool:
    """Whether ``name`` (``f`` or ``Class.method``) is defined in ``path``, at any level."""
    return any(q == name or q.endswith("." + name) for q in python_names(path))


def c_defines(path: pathlib.Path, name: str) -> bool:
    """Whether ``path`` defines the C function ``name`` (a body, not only a prototype)."""
    head = r"^(?:(?:[A-Za-z_][\w]*|__attribute__\(\([^()]*\)\))[ \t\*]+)+\**"
    pattern = rf"{head}{re.escape(name)}\s*\([^;{{}}]*\)\s*\{{"
    return re.search(pattern, path.read_text(), re.M) is not None


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def without_fences(text: str) -> str:
    """``text`` with its fenced blocks blanked (line numbers kept)."""
    return _FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def layer_listing(text: str) -> list[tuple[int, str]]:
    """(line, path) of each entry in the first fenced block under "## Layers": a name
    indented by two spaces per directory level, the description after it; a line indented
    past the names continues the description above it."""
    start = text.index("## Layers")
    block = text.index("```", start)
    body_start = text.index("\n", block) + 1
    body = text[body_start:text.index("```", body_start)]
    first_line = line_of(text, body_start)
    entries, parents = [], []  # parents: (indent, directory path)
    for i, line in enumerate(body.splitlines()):
        m = re.match(r"^( *)(\S+)", line)
        if m is None or len(m.group(1)) >= _LISTING_NAME_COLUMN:
            continue
        indent, name = len(m.group(1)), m.group(2)
        while parents and parents[-1][0] >= indent:
            parents.pop()
        path = (parents[-1][1] if parents else "") + name
        entries.append((first_line + i, path))
        if name.endswith("/"):
            parents.append((indent, path))
    return entries


def where_to_look_rows(text: str) -> list[tuple[int, str]]:
    """(line, "where" cell) of each row of the "Where to look" table."""
    section = text.index("## Where to look")
    end = text.index("\n## ", section + 1)
    rows = []
    for m in re.finditer(r"^\|(.*)\|(.*)\|[ \t]*$", text[section:end], re.M):
        question, where = m.group(1).strip(), m.group(2).strip()
        if question in ("question", "") or set(question) <= set("-: "):
            continue
        rows.append((line_of(text, section + m.start()), where))
    return rows


def check_function(ref_file: str, name: str) -> str | None:
    """Why ``ref_file:name`` is stale (None: it is not)."""
    path, why = resolve(ref_file)
    if path is None:
        return f"the file: {why}"
    full = ROOT / path
    defined = c_defines(full, name) if path.endswith((".c", ".h")) else \
        python_defines(full, name)
    return None if defined else f"{path} defines no {name}"


def stale_references(text: str) -> list[str]:
    problems = []
    prose = without_fences(text)
    for m in _SPAN.finditer(prose):
        span, line = m.group(1).strip(), line_of(text, m.start())
        func = _FUNC_REF.match(span)
        if func is not None:
            why = check_function(func.group(1), func.group(2))
            if why is not None:
                problems.append(f"line {line}: `{span}`: {why}")
        elif _PATH_REF.match(span):
            path, why = resolve(span)
            if path is None:
                problems.append(f"line {line}: `{span}`: {why}")
    for m in _PROSE_FILE.finditer(_SPAN.sub(lambda s: " " * len(s.group(0)), prose)):
        path, why = resolve(m.group(1))
        if path is None:
            problems.append(f"line {line_of(text, m.start())}: {m.group(1)}: {why}")
    files, dirs = repo_paths()
    for line, path in layer_listing(text):
        if path.rstrip("/") not in (dirs if path.endswith("/") else files):
            problems.append(f"line {line}: {path} (layer listing): no such "
                            f"{'directory' if path.endswith('/') else 'file'}")
    return problems


def test_every_file_and_function_the_architecture_names_exists() -> None:
    problems = stale_references(DOC.read_text())
    assert not problems, ("docs/architecture.md names what the code no longer has (fix the "
                          "document, or the name):\n  " + "\n  ".join(problems))


def test_the_where_to_look_table_points_at_functions() -> None:
    text = DOC.read_text()
    rows = where_to_look_rows(text)
    assert len(rows) >= 20, f"the \"Where to look\" table has {len(rows)} rows, expected 20+"
    pointless = [f"line {line}: {where}" for line, where in rows
                 if not any(_FUNC_REF.match(s.strip()) for s in _SPAN.findall(where))]
    assert not pointless, ("rows of \"Where to look\" without a `file:function`:\n  "
                           + "\n  ".join(pointless))


def test_the_layer_listing_is_read_as_paths() -> None:
    paths = dict((p, line) for line, p in layer_listing(DOC.read_text()))
    for expected in ("native/corral_native.c", "cgroupfs/_cgroup.py", "supervisor/_life.py",
                     "supervisor/serve/dispatch.py", "supervisor/cli/run.py"):
        assert expected in paths, f"the layer listing no longer reads as paths: {expected}"


def test_the_architecture_stands_alone() -> None:
    text = DOC.read_text()
    assert "DESIGN.md" not in text, "docs/architecture.md cites DESIGN.md, which is not in " \
                                    "the repository: state the design here instead"


def test_a_stale_reference_is_named() -> None:
    doc = ("## Where to look\n\n| question | where |\n| --- | --- |\n"
           "| a | `supervisor/_life.py:no_such_function` |\n\n## Layers\n\n```\n"
           "supervisor/\n  _gone.py          a module that was renamed\n```\n"
           "See `supervisor/serve/life.py` and `native/corral_native.c:corral_spawn`.\n")
    problems = "\n".join(stale_references(doc))
    assert "supervisor/_life.py defines no no_such_function" in problems
    assert "supervisor/_gone.py (layer listing)" in problems
    assert "`supervisor/serve/life.py`: no such file" in problems
    assert "corral_spawn" not in problems
