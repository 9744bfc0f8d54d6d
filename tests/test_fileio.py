"""raydistill.fileio's streamed and directory writers publish all or nothing, and every rename that publishes a file
or a directory goes through them (one place where the fsyncs and the clean-up on failure are done right)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from raydistill.fileio import atomic_writer, copy_directory, staged_directory

REPO = Path(__file__).resolve().parents[1]


def test_a_streamed_write_replaces_the_file_only_when_it_completes(tmp_path):
    path = tmp_path / "vectors.npy"
    with atomic_writer(path) as stream:
        np.save(stream, np.arange(3))
    np.testing.assert_array_equal(np.load(path), np.arange(3))

    with pytest.raises(RuntimeError, match="the check after writing"):
        with atomic_writer(path) as stream:
            np.save(stream, np.arange(5))
            raise RuntimeError("the check after writing")
    np.testing.assert_array_equal(np.load(path), np.arange(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vectors.npy"]

    own = tmp_path / ".vectors.npy.host-a.tmp"
    with atomic_writer(path, tmp=own) as stream:
        stream.write(b"x")
    assert path.read_bytes() == b"x" and not own.exists()


def test_a_staged_directory_is_swapped_in_whole_or_not_at_all(tmp_path):
    final = tmp_path / "best"
    final.mkdir()
    (final / "weights").write_text("old")

    with pytest.raises(OSError):
        with staged_directory(final) as staged:
            staged.mkdir()
            (staged / "weights").write_text("half")
            raise OSError("disk full")
    assert (final / "weights").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best"]

    with staged_directory(final) as staged:
        assert staged.parent == tmp_path and not staged.exists()
        staged.mkdir()
        (staged / "weights").write_text("new")
    assert sorted(p.name for p in final.iterdir()) == ["weights"] and (final / "weights").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best"]

    copied = copy_directory(final, tmp_path / "exported" / "model")
    assert (copied / "weights").read_text() == "new" and sorted(p.name for p in copied.parent.iterdir()) == ["model"]


# The one rename that publishes nothing new: a damaged Trans-Encoder state file moved aside for inspection.
RENAMES_OUTSIDE_FILEIO = {"raydistill/runtime/tenc/state.py": 1}


def _renames(path: Path) -> int:
    count = 0
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
        name = node.func.attr
        if owner in ("os", "shutil") and name in ("replace", "rename", "renames", "move"):
            count += 1
        elif name in ("replace", "rename") and len(node.args) == 1 and not node.keywords and owner != "dataclasses":
            count += 1  # Path.replace / Path.rename (str.replace takes two arguments)
    return count


def test_files_and_directories_are_published_only_through_fileio():
    found = {}
    for folder in ("raydistill", "jobs", "scripts", "bench"):
        for path in sorted((REPO / folder).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if relative != "raydistill/fileio.py" and (count := _renames(path)):
                found[relative] = count
    assert found == RENAMES_OUTSIDE_FILEIO, (
        "write to a temporary name and rename through raydistill.fileio (atomic_writer, atomic_write_*, "
        f"staged_directory, copy_directory, replace_directory) instead: {found}")


def test_the_rename_finder_sees_the_ways_to_rename(tmp_path):
    source = tmp_path / "example.py"
    source.write_text("import os, shutil, dataclasses\nos.replace(a, b)\nshutil.move(a, b)\ntmp.replace(path)\n"
                      "text.replace('a', 'b')\ndataclasses.replace(cfg, lr=1)\n")
    assert _renames(source) == 3
