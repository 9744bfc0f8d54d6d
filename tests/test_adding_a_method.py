"""docs/adding-a-method.md is true: its three files are the shipped ones, and the example method trains end to end."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from raydistill.config.job import JobConfig
from tests.ray_fixtures import ray_session  # noqa: F401 - the session-wide Ray fixture

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "adding-a-method.md"
EXAMPLE_FILES = ("raydistill/objectives/cosine.py", "raydistill/methods/cosine.py", "raydistill/configs/cosine.yaml",
                 "raydistill/methods/augsbert.py", "raydistill/configs/augsbert.yaml")


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


def test_a_method_with_a_teacher_of_its_own_is_registered_by_its_file_alone():
    from raydistill.methods import METHODS, job_methods
    from raydistill.methods.augsbert import SPEC

    assert "augsbert" in job_methods() and METHODS["augsbert"] is SPEC
    assert SPEC.build_rows is not None and SPEC.own_teachers is not None


def test_its_teacher_is_checked_before_ray_starts(no_ray_start, tmp_path):
    """A teacher that names no model is refused by preflight with the field that names it, as a student is."""
    from raydistill.config.job import ConfigError
    from raydistill.runtime.engine.preflight import preflight

    cfg = JobConfig.from_yaml(ROOT / "raydistill/configs/augsbert.yaml", [
        "extra.cross_encoder=minilm-l66", f"run_dir={tmp_path / 'run'}", "tracking.enabled=false"])
    with pytest.raises(ConfigError, match=r"extra\.cross_encoder.*minilm-l66.*did you mean.*minilm-l6"):
        preflight(cfg)


@pytest.mark.ray
def test_the_example_with_a_teacher_of_its_own_trains_end_to_end(ray_session, one_thread, tiny_models, tiny_bert,
                                                                 tmp_path, capsys):
    """The shipped AugSBERT config with tiny models: the teacher is an engine stage (its progress lines, its
    checkpoint in <run_dir>/teacher), its labels reach the student's rows, the result names the teacher."""
    from raydistill.evaluation import validate_result_file
    from raydistill.runtime.jobs.distill import run_distillation

    cfg = JobConfig.from_yaml(ROOT / "raydistill/configs/augsbert.yaml", [
        f"student={tiny_bert}", f"extra.cross_encoder={tiny_models['mpnet']}", f"run_dir={tmp_path / 'run'}",
        "data.max_sentences=24", "train.batch_size=8", "train.eval_every=100", "extra.teacher_batch_size=8",
        "extra.teacher_lr=1e-3", "tracking.enabled=false", "resources.learner.threads=1",
    ])
    record = run_distillation(cfg, result_path=tmp_path / "augsbert.json",
                              command="pytest tests/test_adding_a_method.py")
    validate_result_file(str(tmp_path / "augsbert.json"))
    out = capsys.readouterr().out
    assert "[augsbert teacher] step 6/6" in out  # 24 gold pairs x 2 orders / batch 8: the engine's own lines
    assert (tmp_path / "run" / "teacher" / "best").is_dir()
    built = record["training"]["built_rows"]
    assert built["gold_pairs"] == 24 and built["silver_pairs"] > 0
    assert record["training"]["sentences"] == built["gold_pairs"] + built["silver_pairs"]
    assert record["teacher"] == Path(str(tiny_models["mpnet"])).name

    # Built again (a rerun after a stop in the student's stage): the finished teacher is not trained again, and it
    # labels the same rows.
    from raydistill.methods.augsbert import SPEC
    from raydistill.runtime.jobs.stage_data import ENGINE_SERVICES

    first, second = (SPEC.build_rows(cfg, ENGINE_SERVICES) for _ in range(2))
    assert "[augsbert teacher] step" not in capsys.readouterr().out
    assert first.num_rows == record["training"]["sentences"]
    every_row = np.arange(first.num_rows)
    np.testing.assert_array_equal(first.rows(every_row)["score"], second.rows(every_row)["score"])
