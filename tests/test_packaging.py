"""The package works outside its checkout: the wheel carries every file the code finds through importlib.resources
(job configs, tune search spaces, bundled data, the result schema), and the declared dependencies are exactly the
third-party packages raydistill imports."""

from __future__ import annotations

import ast
import email
import importlib.metadata
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "raydistill"


def _imported_top_level_modules() -> set[str]:
    """Every absolute import in raydistill/, at any depth (optional imports inside functions count too)."""
    modules: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    return {m for m in modules if m not in sys.stdlib_module_names and m != "raydistill"}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return {_normalise(re.split(r"[\[<>=!~ ;]", spec, maxsplit=1)[0]) for spec in project["dependencies"]}


# Imported only when the user asked for them, each with an install hint where it is imported.
OPTIONAL_IMPORTS = {"optuna", "sklearn"}  # sklearn: the st_mse baseline (sentence-transformers' train extra)


def test_dependencies_are_what_the_package_imports():
    distributions = importlib.metadata.packages_distributions()
    declared = _declared()
    imported: set[str] = set()
    for module in _imported_top_level_modules() - OPTIONAL_IMPORTS:
        names = [_normalise(n) for n in distributions.get(module) or []]
        assert names, f"raydistill imports {module!r}, which no installed distribution provides"
        # a module several distributions install (mlflow: mlflow, mlflow-skinny) counts as the declared one
        imported.add(next((n for n in names if n in declared), names[0]))
    assert declared - imported == set(), f"declared but never imported: {sorted(declared - imported)}"
    assert imported - declared == set(), f"imported but not declared: {sorted(imported - declared)}"


def _build_wheel(out: Path) -> Path:
    pytest.importorskip("setuptools", minversion="77")  # the SPDX license string needs it
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(ROOT)], check=True, capture_output=True, text=True)
    wheels = list(out.glob("raydistill-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return _build_wheel(tmp_path_factory.mktemp("wheel"))


def test_wheel_ships_configs_tune_spaces_data_and_schema(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for directory, pattern in (("configs", "*.yaml"), ("tune_spaces", "*.yaml"), ("data/bundled", "**/*.gz"),
                               ("schemas", "*.json")):
        expected = {f"raydistill/{p.relative_to(PACKAGE).as_posix()}" for p in (PACKAGE / directory).glob(pattern)}
        assert expected, f"nothing to ship under raydistill/{directory}"
        missing = expected - names
        assert not missing, f"the wheel lacks {sorted(missing)}"
    assert "raydistill/configs/mutual_tenc.yaml" in names  # the main job's default
    assert "raydistill/tune_spaces/default.yaml" in names  # tune's fallback space


def test_wheel_metadata_license_and_entry_point(wheel):
    archive = zipfile.ZipFile(wheel)
    info = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = email.message_from_string(archive.read(info).decode())
    assert metadata["License-Expression"] == "Apache-2.0"
    requires = {_normalise(re.split(r"[\[<>=!~ ;(]", r, maxsplit=1)[0]) for r in metadata.get_all("Requires-Dist")
                if "extra ==" not in r}
    assert requires == _declared()
    entry_points = archive.read(info.replace("METADATA", "entry_points.txt")).decode()
    assert "raydistill = raydistill.cli:main" in entry_points


def test_default_configs_resolve_from_the_package_not_the_checkout():
    from raydistill.runtime.tune import spaces_dir
    from raydistill.shipped import configs_dir, resolve_config, shipped_config

    assert configs_dir() == PACKAGE / "configs"
    assert spaces_dir() == (PACKAGE / "tune_spaces").resolve()
    assert resolve_config("congen-gpu") == shipped_config("congen-gpu")
    assert resolve_config("congen-gpu.yaml") == shipped_config("congen-gpu")
    assert resolve_config("no-such-config") == Path("no-such-config")  # left for the loader's "not found" message
    assert not (ROOT / "configs").exists()
    # The search spaces sit at the top of the checkout, where a user looks for them; the package links to them.
    assert (PACKAGE / "tune_spaces").is_symlink() and spaces_dir() == (ROOT / "tune_spaces").resolve()
