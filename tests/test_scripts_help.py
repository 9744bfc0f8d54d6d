"""Every script in scripts/ and bench/ answers ``--help`` with its usage: a script that no longer runs against today's
code (a renamed import, a call it still makes at import time) fails here instead of when someone next needs it.

Each script runs in this process (``runpy``, as ``python <script> --help`` would run it), so the torch, Ray and
transformers imports are paid once for all of them. A file without a ``__main__`` block that its siblings import
(bench/common.py) is a module, not a script; one that nothing imports is a script, and must answer too.
"""

from __future__ import annotations

import os
import re
import runpy
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _is_module(path: Path) -> bool:
    if 'if __name__ == "__main__"' in path.read_text(encoding="utf-8"):
        return False
    imported = re.compile(rf"^\s*(?:import|from)\s+{re.escape(path.stem)}\b", re.MULTILINE)
    return any(imported.search(other.read_text(encoding="utf-8")) for other in path.parent.glob("*.py")
               if other != path)


SCRIPTS = sorted(path for folder in ("scripts", "bench") for path in (REPO / folder).glob("*.py")
                 if not _is_module(path))


@pytest.fixture
def restored_environment():
    """Put back the variables a script sets at import (bench/common.py's offline and Ray defaults)."""
    before = dict(os.environ)
    yield
    for key in set(os.environ) - set(before):
        del os.environ[key]
    os.environ.update(before)


def test_the_scripts_are_found():
    names = {path.relative_to(REPO).as_posix() for path in SCRIPTS}
    assert {"scripts/reliability_table.py", "bench/train_step.py"} <= names and "bench/common.py" not in names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.relative_to(REPO).as_posix())
def test_the_script_answers_help(script, monkeypatch, capsys, restored_environment):
    # As `python bench/x.py` does: the script's folder first on sys.path (bench/'s scripts import common).
    monkeypatch.syspath_prepend(str(script.parent))
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    assert exited.value.code in (0, None), out
    assert out.startswith("usage: "), out[:500]
