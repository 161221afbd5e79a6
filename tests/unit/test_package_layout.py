"""The layout's rules: public packages re-export their names from private modules, each public
name in exactly one public package (and maybe also in ``gpufeed`` itself), no module that only
re-exports another, and user-facing docs that import only public paths."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import gpufeed

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gpufeed"


def _public_modules() -> list[str]:
    """Every importable module of gpufeed whose dotted path has no part starting with '_', the
    command line aside (its interface is the ``gpufeed`` command, not its modules)."""
    names = ["gpufeed"]
    for info in pkgutil.walk_packages(gpufeed.__path__, "gpufeed."):
        parts = info.name.split(".")[1:]
        if parts[0] != "cli" and not any(part.startswith("_") for part in parts):
            names.append(info.name)
    return sorted(names)


PUBLIC = _public_modules()


def test_the_public_packages_are_the_ones_the_layout_names():
    packages = {m for m in PUBLIC if (PACKAGE / Path(*m.split(".")[1:]) / "__init__.py").exists()}
    assert {"gpufeed.image", "gpufeed.image.augment", "gpufeed.sources", "gpufeed.cuda", "gpufeed.doctor",
            "gpufeed.tune", "gpufeed.metrics", "gpufeed.serve", "gpufeed.compare", "gpufeed.decoders",
            "gpufeed.cache"} <= packages


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_module_lists_its_names_sorted_and_resolvable(name):
    module = importlib.import_module(name)
    if not hasattr(module, "__all__"):
        # a module with no __all__ is a plain public module (loader, config, ...): its names are
        # the ones it defines without a leading underscore
        return
    assert module.__all__ == sorted(module.__all__, key=str), name
    for attr in module.__all__:
        assert hasattr(module, attr), f"{name}.__all__ names {attr!r}, which it does not have"


def test_each_public_name_is_exported_by_one_public_package_besides_gpufeed():
    homes: dict[int, list[str]] = {}
    for name in PUBLIC:
        if name == "gpufeed":
            continue
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", ()):
            obj = getattr(module, attr)
            if isinstance(obj, (int, float, str, tuple, frozenset, dict)):
                continue  # constants compare by value; their names are checked by the test above
            homes.setdefault(id(obj), []).append(f"{name}.{attr}")
    shared = {k: v for k, v in homes.items() if len(v) > 1}
    assert not shared, f"exported by more than one public package: {sorted(shared.values())}"


def test_what_gpufeed_re_exports_has_a_public_home():
    homes = set()
    for name in PUBLIC:
        if name != "gpufeed":
            module = importlib.import_module(name)
            homes |= {id(getattr(module, a)) for a in getattr(module, "__all__", ())}
            homes |= {id(v) for k, v in vars(module).items() if not k.startswith("_")}
    missing = [a for a in gpufeed.__all__ if id(getattr(gpufeed, a)) not in homes]
    assert not missing, f"re-exported by gpufeed with no public package of their own: {missing}"


def _only_reexports(tree: ast.Module) -> bool:
    """A body of a docstring, imports from gpufeed and an ``__all__``: nothing of its own."""
    for i, node in enumerate(tree.body):
        if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpufeed"):
            continue
        if isinstance(node, ast.Import | ast.ImportFrom) and getattr(node, "module", "") == "__future__":
            continue
        if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == ["__all__"]:
            continue
        return False
    return True


def test_no_module_only_re_exports_another():
    found = [str(p.relative_to(ROOT)) for p in sorted(PACKAGE.rglob("*.py"))
             if p.name != "__init__.py" and _only_reexports(ast.parse(p.read_text(encoding="utf-8")))]
    assert not found, f"modules that only re-export: {found} (re-export from the package's __init__)"


# User-facing text: the README, the guides, the examples. The design notes and the API pages
# about internals may name private modules; a user's import may not.
_PRIVATE_IMPORT = re.compile(r"(?:from|import)\s+(gpufeed(?:\.\w+)*\._\w+)")


def test_user_facing_code_imports_only_public_paths():
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").glob("*.py"))]
    found = [f"{p.relative_to(ROOT)}: {m.group(1)}" for p in texts
             for m in _PRIVATE_IMPORT.finditer(p.read_text(encoding="utf-8"))]
    assert not found, f"user-facing imports of private modules: {found}"
