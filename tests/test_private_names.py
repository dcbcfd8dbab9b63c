"""No module of dsconvert imports another module's private (underscore) names: what one module
needs from another is public there, with a docstring."""

import ast
import pathlib

import dsconvert

ROOT = pathlib.Path(dsconvert.__file__).parent
# left to the branch that moves reader and conversion code (readers/, convert.py): remove each
# entry when its module stops importing the name
KNOWN = {
    "dsconvert/readers/sampler.py: _torch_data from base",
}


def _private_imports(path: pathlib.Path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("dsconvert")):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    yield f"{path.relative_to(ROOT.parent)}: {alias.name} from {node.module}"


def test_no_module_imports_a_private_name_of_another():
    found = [hit for path in sorted(ROOT.rglob("*.py")) for hit in _private_imports(path)]
    assert sorted(set(found) - KNOWN) == [], "\n".join(found)
