"""Every Triton launch of the packages states whether the compiler may contract a * b + c into one
FMA (``enable_fp_fusion``).

Contraction changes results in their last bits, so a kernel's bits (and some contracts: exact
against a reference, invariant across launch shapes) depend on it. Triton 3.9 warns that its
default (fusion on) flips to off in 3.10; a launch that left it to the default would then change
its bits, and its speed, with the installed Triton. Launches that need plain roundings pass False;
the rest pass True, the default they were written and measured with."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "packages").glob("*/src/**/*.py"))


def _jit_names(tree: ast.Module) -> set[str]:
    """Names of the functions decorated with ``triton.jit`` (or ``@jit``) in a module."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                if ast.unparse(target) in ("triton.jit", "jit"):
                    names.add(node.name)
    return names


def _launches(tree: ast.Module, kernels: set[str]):
    """``kernel[grid](...)`` calls of a known kernel, by name or as ``module.kernel``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
            target = node.func.value
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            if name in kernels:
                yield name, node


def test_every_launch_states_fp_fusion():
    trees = {path: ast.parse(path.read_text()) for path in SOURCES}
    kernels = set().union(*(_jit_names(tree) for tree in trees.values()))
    assert {"gqa_tile_kernel", "_few_rows_kernel", "_count_kernel"} <= kernels, sorted(kernels)
    found, missing = 0, []
    for path, tree in trees.items():
        for name, call in _launches(tree, kernels):
            found += 1
            if not any(kw.arg == "enable_fp_fusion" for kw in call.keywords):
                missing.append(f"{path.relative_to(ROOT)}:{call.lineno} {name}")
    assert found >= 25, found  # the walk sees the launches (a test that cannot fail is none)
    assert not missing, "launches without enable_fp_fusion:\n" + "\n".join(missing)
