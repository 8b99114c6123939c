"""The package's typing: the stubs of the extension module name exactly what it has, and the
public modules export what their __all__ says (so editors complete the real API)."""

import ast
import importlib.resources

import troupe
from troupe import _core, recipe, sim


def stub_names(tree):
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        elif isinstance(node, ast.FunctionDef):
            out[node.name] = None
        elif isinstance(node, ast.AnnAssign):
            out[node.target.id] = None
    return out


def test_the_core_stub_matches_the_extension_module():
    files = importlib.resources.files("troupe")
    assert (files / "py.typed").is_file()
    stub = stub_names(ast.parse((files / "_core.pyi").read_text()))
    public = {n for n in dir(_core) if not n.startswith("_")} | {"__version__"}
    assert set(stub) == public
    for name, members in stub.items():
        if members is None:
            continue
        real = {m for m in dir(getattr(_core, name)) if not m.startswith("_")}
        assert members - {"__init__"} == real, name


def test_public_modules_export_what_all_names():
    for module in (recipe, sim):
        assert all(hasattr(module, n) for n in module.__all__)
    assert troupe.__version__ == _core.__version__
    assert recipe.Tokenizer.encode.__doc__ and sim.run.__doc__
