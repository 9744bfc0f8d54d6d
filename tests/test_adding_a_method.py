"""docs/adding-a-method.md is true: its three files are the shipped ones, and the example method trains end to end."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from raydistill.config.job import JobConfig
from tests.ray_fixtures import ray_session  # noqa: F401 - the session-wide Ray fixture

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "adding-a-method.md"
EXAMPLE_FILES = ("raydistill/objectives/cosine.py", "raydistill/methods/cosine.py", "raydistill/configs/cosine.yaml")


def _documented_files() -> dict[str, str]:
    """``path -> code`` for every fenced block the page introduces with a line holding just `` `path`: ``."""
    text = DOC.read_text()
    blocks = re.findall(r"^`([^`\n]+)`:\n\n```[a-z]*\n(.*?)^```", text, flags=re.M | re.S)
    return dict(blocks)


def test_the_page_shows_the_shipped_example_files_word_for_word():
    documented = _documented_files()
    assert sorted(documented) == sorted(EXAMPLE_FILES)
    for path, code in documented.items():
        assert code == (ROOT / path).read_text(), f"docs/adding-a-method.md shows another {path} than the shipped one"


def test_the_example_method_is_registered_by_its_file_alone():
    from raydistill.methods import METHODS, job_methods
    from raydistill.methods.cosine import SPEC
    from raydistill.objectives.cosine import CosineDistillLoss

    assert "cosine" in job_methods() and METHODS["cosine"] is SPEC
    assert SPEC.loss_class is CosineDistillLoss


@pytest.mark.ray
def test_the_example_method_trains_end_to_end(ray_session, one_thread, tiny_bert, tiny_teacher, tmp_path):
    """The shipped config with tiny models: the teacher pass, a learner, checkpoints, the result file."""
    from raydistill.evaluation import validate_result_file
    from raydistill.runtime.jobs.distill import run_distillation

    cfg = JobConfig.from_yaml(ROOT / "raydistill/configs/cosine.yaml", [
        f"student={tiny_bert}", f"teacher={tiny_teacher}", f"run_dir={tmp_path / 'run'}",
        f"cache_dir={tmp_path / 'cache'}", "data.max_sentences=96", "train.batch_size=16", "train.epochs=2",
        "train.lr=1e-3", "train.eval_every=6", "train.checkpoint_every=6", "tracking.enabled=false",
        "resources.learner.threads=1", "resources.teacher.threads=1", "resources.teacher.batch_size=32",
    ])
    cosines: list[float] = []

    def progress(event, info, step):
        if event == "step":
            cosines.append(info["loss_cosine"])

    record = run_distillation(cfg, result_path=tmp_path / "cosine.json", command="pytest tests/test_adding_a_method.py",
                              progress=progress)
    validate_result_file(str(tmp_path / "cosine.json"))
    assert record["method"] == "cosine" and record["training"]["steps"] == len(cosines) == 12
    assert sum(cosines[-3:]) > sum(cosines[:3])  # the student turns towards the teacher
    assert (tmp_path / "run" / "best" / "modules.json").is_file()
