"""The install declares what the code imports and nothing it does not: every third-party package imported by
harness/, modules/ or datamodules/ is a dependency in pyproject.toml, every dependency is imported (a
leftover such as psutil fails here), packages only the tests import sit in the dev extra, and torch is a
bounded range that admits the version installed here."""

import ast
import importlib.metadata
import re
import tomllib

from packaging.specifiers import SpecifierSet

from tests.conftest import REPO

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
OPTIONAL_IMPORTS = {
    "rich": "the progress bar's first choice, imported only when installed (harness/run/callbacks.py)",
    "tqdm": "the progress bar's fallback; Lightning itself depends on it",
    "triton": "the Triton kernels of ours (modules/attention/triton_*.py), built only where it is installed, and the GPU "
              "cost page's count of a plugin's bare launches; torch's CUDA builds ship it",
    "adasplash": "AdaSplash's fused α-entmax, imported only on CUDA where installed (the gpu extra; the dev extra "
                 "has it for tests/attention/test_adasplash_interpreted.py)",
}
DECLARED_NOT_IMPORTED = {
    "tokenizers": "transformers' fast tokenizers, declared for its version floor",
    "accelerate": "transformers' Trainer imports it (modules/hf/trainer.py subclasses Trainer, which refuses to run without it)",
}


def _distribution(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _imported_distributions(*folders: str) -> set[str]:
    modules = set()
    for folder in folders:
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    modules |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules.add(node.module.split(".")[0])
    owners = importlib.metadata.packages_distributions()
    return {_distribution(d) for m in modules for d in owners.get(m, [])} - {"attnbench"}


def test_the_code_imports_exactly_the_declared_dependencies():
    declared = {_distribution(r) for r in PROJECT["dependencies"]}
    imported = _imported_distributions("harness", "modules", "datamodules")
    assert imported - declared - set(OPTIONAL_IMPORTS) == set(), "imported but not declared"
    assert declared - imported - set(DECLARED_NOT_IMPORTED) == set(), "declared but never imported"


def test_test_only_packages_are_in_the_dev_extra():
    declared = {_distribution(r) for r in PROJECT["dependencies"]}
    dev = {_distribution(r) for r in PROJECT["optional-dependencies"]["dev"]}
    only_tests = _imported_distributions("tests") - _imported_distributions("harness", "modules", "datamodules") - declared
    assert only_tests - {"packaging"} <= dev  # packaging: pip's and pytest's own dependency
    assert {"scikit-learn", "psycopg"} <= dev and "scikit-learn" not in declared


def test_torch_is_a_bounded_range_that_admits_the_installed_version():
    for name in ("torch", "torchvision"):
        requirement = next(r for r in PROJECT["dependencies"] if _distribution(r) == name)
        specifier = SpecifierSet(requirement[len(name):])
        assert any(s.operator == "<" for s in specifier) and not any(s.operator == "==" for s in specifier), requirement
        assert importlib.metadata.version(name).split("+")[0] in specifier


def test_pot_is_imported_only_by_the_fallback_that_needs_it():
    """POT takes seconds to import; building every variant must not import it (align-ot's exp-domain
    Sinkhorn is written out, POT's log-domain solver is the fallback)."""
    import subprocess
    import sys

    code = ("import sys; from modules.attention import build_attention, list_attentions\n"
            "[build_attention({'name': n}, num_heads=2, head_dim=8) for n in list_attentions()]\n"
            "print('ot' in sys.modules, len(list_attentions()))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    imported, variants = done.stdout.split()
    assert imported == "False" and int(variants) >= 12
