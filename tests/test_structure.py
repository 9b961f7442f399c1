"""The package's shape, checked: no import circles anywhere in the distribution
(the sinks included), and a demo that uses only the public ``rollout_trace``.
Modules are sized by cohesion, not by a line count, and a module may use a
private name of another of the package: privacy is towards users.

Imports are read with ``ast``, not run: every ``import`` statement counts,
those inside functions and under ``if TYPE_CHECKING:`` too, since a circle
through either is still a circle in the design.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import rollout_trace as rt

ROOT = Path(__file__).parents[1]
PACKAGE = "rollout_trace"
DEMO = f"{PACKAGE}._demo"
# What the demo may name on `rollout_trace` besides `__all__`: plain module facts.
DEMO_DUNDERS = frozenset({"__file__", "__version__"})

# Imports left out of the circle check, each another engineer's to remove.
SKIPPED_EDGES: set[tuple[str, str]] = set()


@dataclass
class Module:
    name: str  # dotted, e.g. rollout_trace._reading.reader
    path: Path
    tree: ast.Module
    is_package: bool  # an __init__.py

    @property
    def package(self) -> str:
        """The package that relative imports start from."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


@dataclass
class Use:
    """One name a module takes from another: ``from target import name`` or ``target.name``."""

    module: str
    line: int
    target: str
    name: str | None  # None: the module itself (``import target``)


@dataclass
class Package:
    root: Path
    modules: dict[str, Module] = field(default_factory=dict)

    @classmethod
    def load(cls, root: Path, name: str = PACKAGE) -> Package:
        pkg = cls(root)
        # The whole distribution: the package's own folders, and those it
        # links in (rollout_trace/sinks is the repository's sinks/).
        top = root / name
        paths = [(p, p.relative_to(root)) for p in top.rglob("*.py")]
        for link in (d for d in top.rglob("*") if d.is_symlink() and d.is_dir()):
            paths += [(p, link.relative_to(root) / p.relative_to(link)) for p in link.rglob("*.py")]
        for path, where in sorted(paths):
            parts = list(where.with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            dotted = ".".join(parts)
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            pkg.modules[dotted] = Module(dotted, path, tree, is_package)
        return pkg

    def is_module(self, dotted: str) -> bool:
        return dotted in self.modules

    def owner(self, dotted: str) -> str | None:
        """The longest prefix of ``dotted`` that is one of the package's modules."""
        parts = dotted.split(".")
        for end in range(len(parts), 0, -1):
            prefix = ".".join(parts[:end])
            if prefix in self.modules:
                return prefix
        return None

    def uses(self, module: Module) -> Iterator[Use]:
        """Every name ``module`` takes from a module of the package, as written."""
        aliases: dict[str, str] = {}  # local name -> module it is bound to
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = self.owner(alias.name)
                    if target is None:
                        continue
                    yield Use(module.name, node.lineno, target, None)
                    if alias.asname:
                        aliases[alias.asname] = alias.name
                    else:
                        root = alias.name.partition(".")[0]
                        aliases[root] = root
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, node)
                if self.owner(base) is None:
                    continue
                for alias in node.names:
                    child = f"{base}.{alias.name}"
                    if self.is_module(child):  # `from . import reader`: a module
                        yield Use(module.name, node.lineno, child, None)
                        aliases[alias.asname or alias.name] = child
                    else:
                        yield Use(module.name, node.lineno, base, alias.name)
        # `alias.attr`, `alias.sub.attr`: what is taken from a module by attribute.
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Attribute):
                chain = _dotted(node)
                if chain is None or chain[0] not in aliases:
                    continue
                target = aliases[chain[0]]
                for attr in chain[1:]:
                    if self.is_module(f"{target}.{attr}"):
                        target = f"{target}.{attr}"
                        continue
                    yield Use(module.name, node.lineno, target, attr)
                    break

    def graph(self, skip: Collection[tuple[str, str]] = ()) -> dict[str, set[str]]:
        """Module -> the package's modules it imports (an attribute use is not an import)."""
        edges: dict[str, set[str]] = {name: set() for name in self.modules}
        for module in self.modules.values():
            for node in ast.walk(module.tree):
                if isinstance(node, ast.Import):
                    targets = [self.owner(a.name) for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = _resolve(module, node)
                    targets = [
                        f"{base}.{a.name}" if self.is_module(f"{base}.{a.name}") else base
                        for a in node.names
                    ]
                else:
                    continue
                edges[module.name].update(
                    t
                    for t in targets
                    if t is not None
                    and t in self.modules
                    and t != module.name
                    and (module.name, t) not in skip
                )
        return edges


def _resolve(module: Module, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` names, relative levels resolved."""
    if not node.level:
        return node.module or ""
    parts = module.package.split(".")
    base = ".".join(parts[: len(parts) - (node.level - 1)])
    return f"{base}.{node.module}" if node.module else base


def _dotted(node: ast.Attribute) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; None for anything but names and attributes."""
    chain = [node.attr]
    value = node.value
    while isinstance(value, ast.Attribute):
        chain.append(value.attr)
        value = value.value
    if not isinstance(value, ast.Name):
        return None
    chain.append(value.id)
    return chain[::-1]


def _where(pkg: Package, use: Use) -> str:
    return f"{pkg.modules[use.module].path.relative_to(pkg.root)}:{use.line}"


# --- the rules ----------------------------------------------------------------


def cycles(pkg: Package, skip: Collection[tuple[str, str]] = ()) -> list[list[str]]:
    """The import circles: each strongly connected set of two or more modules."""
    edges = pkg.graph(skip)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def demo_imports(pkg: Package, public: frozenset[str], demo: str = DEMO) -> list[str]:
    """What the demo takes from the package other than its public top level.

    The demo's own modules may import each other: they are the user's code.
    """
    top = demo.partition(".")[0]
    out = []
    for module in pkg.modules.values():
        if module.name != demo and not module.name.startswith(f"{demo}."):
            continue
        for u in pkg.uses(module):
            if u.target == demo or u.target.startswith(f"{demo}."):
                continue
            if u.target == top and (u.name is None or u.name in public):
                continue
            what = u.target if u.name is None else f"{u.target}.{u.name}"
            out.append(f"{_where(pkg, u)}: {module.name} uses {what}")
    return out


# --- the package --------------------------------------------------------------


@pytest.fixture(scope="module")
def package() -> Package:
    return Package.load(ROOT)


def test_no_import_circles(package: Package) -> None:
    assert cycles(package, SKIPPED_EDGES) == []
    # A skipped import that is gone must leave the list.
    edges = package.graph()
    assert [e for e in SKIPPED_EDGES if e[1] not in edges[e[0]]] == []


def test_the_demo_uses_only_the_public_package(package: Package) -> None:
    assert package.owner(DEMO) == DEMO  # the folder is there to be checked
    public = frozenset(rt.__all__) | DEMO_DUNDERS
    assert demo_imports(package, public) == []


def test_every_subpackage_says_what_flows_through_it(package: Package) -> None:
    for module in package.modules.values():
        if module.is_package and module.name != PACKAGE:
            doc = ast.get_docstring(module.tree)
            assert doc and len(doc.split()) >= 20, f"{module.path}: no docstring to speak of"


# --- the rules catch what they are meant to -----------------------------------

_FAKE = {
    "pkg/__init__.py": "from .a import f\n",
    "pkg/a.py": "from .b import g\n\ndef f():\n    return g()\n",
    # A circle through an import inside a function, and privates taken two ways.
    "pkg/b.py": ("from . import c\n\ndef g():\n    from .a import f\n    return c._hidden + f()\n"),
    "pkg/c.py": "_hidden = 1\nvisible = 2\n" + "x = 0\n" * 5,
    "pkg/d.py": "from .c import _hidden\nfrom .sub import _mod\nfrom .sub._mod import ok\n",
    "pkg/sub/__init__.py": "from ._mod import _secret\n",
    "pkg/sub/_mod.py": "_secret = ok = 1\n",
    # A demo that reaches past the public top level.
    "pkg/_demo/__init__.py": "",
    "pkg/_demo/run.py": (
        "import pkg as p\nfrom pkg import f, c\nfrom pkg.c import visible\n"
        "from . import other\nfrom .other import thing\nprint(p.f, p._hidden, p.c.visible)\n"
    ),
    "pkg/_demo/other.py": "thing = 1\n",
}


@pytest.fixture
def fake(tmp_path: Path) -> Package:
    for rel, text in _FAKE.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return Package.load(tmp_path, "pkg")


def test_a_circle_through_an_import_in_a_function_is_found(fake: Package) -> None:
    assert cycles(fake) == [["pkg.a", "pkg.b"]]


def test_a_demo_reaching_past_the_public_package_is_found(fake: Package) -> None:
    found = [f.split(": ", 1)[1] for f in demo_imports(fake, frozenset({"f"}), "pkg._demo")]
    assert sorted(found) == [
        "pkg._demo.run uses pkg._hidden",  # a private name of the top level
        "pkg._demo.run uses pkg.c",  # `from pkg import c` is a submodule
        "pkg._demo.run uses pkg.c.visible",  # `from pkg.c import visible`
        "pkg._demo.run uses pkg.c.visible",  # `p.c.visible`
    ]


def test_no_text_in_the_package_points_at_a_file_users_never_get() -> None:
    # The contract ships in the README (section Reference); docstrings,
    # comments and help texts point there.
    root = Path(rt.__file__).parent
    offenders = [
        f"{path.relative_to(root)}:{n}"
        for path in sorted(root.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "SPEC" in line
    ]
    assert offenders == []


def test_the_sinks_are_part_of_the_package(package: Package) -> None:
    # Installed, they are rollout_trace.sinks: the circle check covers them.
    assert "rollout_trace.sinks" in package.modules
    assert "rollout_trace.sinks.otlp" in package.modules
    assert not any(m == "sinks" or m.startswith("sinks.") for m in package.modules)
