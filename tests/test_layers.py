"""The layers as contracts (issue 13): ``lint-imports`` keeps every contract of ``pyproject.toml``
(``[tool.importlinter]``), and each contract breaks on the violation it exists to catch.

The negative cases run ``lint-imports`` on a copy of the package with one import added, so a
contract that stopped catching its violation (a typo in a module name, a wildcard that matches
nothing, a layer moved) fails here instead of passing silently. Function-local imports count:
import-linter parses every import statement, which is how the old cycles hid.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint(root: Path) -> subprocess.CompletedProcess:
    """Run ``lint-imports`` on the package under ``root`` with ``root/pyproject.toml``."""
    assert LINT_IMPORTS.is_file(), f"{LINT_IMPORTS} missing: pip install -e '.[test]'"
    env = dict(os.environ, PYTHONPATH=str(root), NO_COLOR="1", COLUMNS="200")
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def test_lint_imports_keeps_every_contract():
    p = _lint(ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "0 broken" in p.stdout and " kept, " in p.stdout


#: (case, file under onnx_cinm/ to append to or create, text, contract name that must break,
#: the import the report must name)
VIOLATIONS = [
    ("a pass imports a device package (function-local)", "passes/placement.py",
     "\n\ndef _probe():\n    from ..devices import memristor\n",
     "No other layer names a device package (only the registry and devices.base)", "onnx_cinm.passes.placement -> onnx_cinm.devices.memristor"),
    ("the runtime names the UPMEM kernel adapter", "runtime/session.py",
     "\nfrom ..devices.upmem.kernel import UpmemKernel\n",
     "No other layer names a device package (only the registry and devices.base)", "onnx_cinm.runtime.session -> onnx_cinm.devices.upmem.kernel"),
    ("report names a device package", "report.py",
     "\nfrom .devices.memristor import presets\n",
     "No other layer names a device package (only the registry and devices.base)", "onnx_cinm.report -> onnx_cinm.devices.memristor.presets"),
    ("the crossbar simulator imports the memristor device again (the old cycle)",
     "sim/crossbar/simulator.py",
     "\n\ndef _probe():\n    from ...devices.memristor.nonideal import compose\n",
     "Layers from cli down to errors", "onnx_cinm.sim.crossbar.simulator -> onnx_cinm.devices.memristor.nonideal"),
    ("the UPMEM emulator imports the runtime profile", "sim/upmem_emu/__init__.py",
     "\nfrom ...runtime import profile\n",
     "Layers from cli down to errors", "onnx_cinm.sim.upmem_emu -> onnx_cinm.runtime.profile"),
    ("a simulator imports a bottom module other than errors", "sim/blas.py",
     "\nfrom ..text import si\n", "Layers from cli down to errors", "onnx_cinm.sim.blas -> onnx_cinm.text"),
    ("the dialect names a device", "dialects/cinm.py",
     "\n\ndef _probe():\n    from ..devices import get_device\n",
     "Layers from cli down to errors", "onnx_cinm.dialects.cinm -> onnx_cinm.devices"),
    ("the Device contract imports a device package", "devices/base.py",
     "\n\ndef _probe():\n    from .upmem import mapping\n",
     "Device packages are independent of each other", "onnx_cinm.devices.base -> onnx_cinm.devices.upmem.mapping"),
    ("one device package imports another", "devices/memristor/kernel.py",
     "\nfrom ..upmem import cost\n",
     "Device packages are independent of each other", "onnx_cinm.devices.memristor.kernel -> onnx_cinm.devices.upmem.cost"),
    ("a new device package imports another", "devices/newchip/__init__.py",
     "from ..memristor import presets\n",
     "Device packages are independent of each other", "onnx_cinm.devices.newchip -> onnx_cinm.devices.memristor.presets"),
    ("a new device package imports a pass", "devices/newchip/__init__.py",
     "from ...passes import placement\n",
     "Devices import no pass and nothing above", "onnx_cinm.devices.newchip -> onnx_cinm.passes.placement"),
    ("paradigm code goes through the registry", "paradigms/cim/newrule.py",
     "from ...devices import get_device\n",
     "Paradigms use devices.base, never the registry", "onnx_cinm.paradigms.cim.newrule -> onnx_cinm.devices"),
    ("paradigm code imports a device package", "paradigms/cim/newrule.py",
     "from ...devices.memristor import presets\n",
     "No other layer names a device package (only the registry and devices.base)", "onnx_cinm.paradigms.cim.newrule -> onnx_cinm.devices.memristor.presets"),
    ("a module outside every layer", "newmodule.py", "X = 1\n",
     "Layers from cli down to errors", "onnx_cinm.newmodule"),
    ("cost placement and the placement pass import each other again",
     "passes/placement_rules.py", "\n\ndef _probe():\n    from .placement import STRATEGIES\n",
     "No import cycle between sibling modules", "onnx_cinm.passes"),
]


@pytest.fixture(scope="module")
def clean_copy(tmp_path_factory) -> Path:
    """The package's Python sources and pyproject.toml, copied once."""
    root = tmp_path_factory.mktemp("layers") / "clean"
    shutil.copytree(ROOT / "onnx_cinm", root / "onnx_cinm",
                    ignore=shutil.ignore_patterns("__pycache__", "*.onnx", "templates", "*.c",
                                                  "*.h"))
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


@pytest.mark.parametrize("case,path,text,contract,line", VIOLATIONS, ids=[v[0] for v in VIOLATIONS])
def test_each_contract_catches_its_violation(clean_copy, tmp_path, case, path, text, contract, line):
    root = tmp_path / "pkg"
    shutil.copytree(clean_copy, root)
    f = root / "onnx_cinm" / path
    f.parent.mkdir(parents=True, exist_ok=True)
    if not (f.parent / "__init__.py").exists():
        (f.parent / "__init__.py").write_text("")
    with f.open("a") as fh:
        fh.write(text)
    p = _lint(root)
    out = " ".join((p.stdout + p.stderr).split())  # contract names may wrap
    assert p.returncode == 1, out
    assert f"{contract} BROKEN" in out, out
    assert line in out, out
