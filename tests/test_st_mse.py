"""The st_mse job: sentence-transformers' own distillation recipe (MSELoss to the teacher's vectors) as a baseline.

Tiny random models (a 32-wide BERT student, a 48-wide MPNet teacher) on a corpus file of 160 captions: the job
trains through sentence-transformers' trainer and MSELoss, takes the teacher's vectors from raydistill's cache,
reduces them by PCA (or widens the student), evaluates on 7-STS and writes a result file that validates.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from raydistill.config.job import ConfigError, JobConfig
from tests.conftest import TEACHER_DIM  # the width of conftest's tiny_teacher

pytest.importorskip("sentence_transformers")
pytest.importorskip("accelerate", reason="sentence-transformers' trainer needs accelerate: pip install '.[test]'")

ROWS, BATCH, EPOCHS = 160, 16, 2
STUDENT_DIM = 32


@pytest.fixture(autouse=True)
def one_thread(one_thread):
    # tiny models on a busy 2-core box are several times slower with 2 threads
    yield


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, real_sentences):
    root = tmp_path_factory.mktemp("st_mse")
    corpus = root / "captions.txt"
    corpus.write_text("\n".join(real_sentences[:ROWS]) + "\n", encoding="utf-8")  # Flickr captions come first
    return {"root": root, "corpus": f"file:{corpus}", "cache": root / "embeddings",
            "mlflow": f"sqlite:///{root / 'mlflow.db'}"}


def job_config(student, teacher, workspace, run_name: str, **loss) -> JobConfig:
    return JobConfig.from_dict({
        "method": "st-mse", "student": str(student), "teacher": str(teacher) if teacher else None,
        "run_dir": str(workspace["root"] / run_name), "cache_dir": str(workspace["cache"]),
        "data": {"corpus": workspace["corpus"], "max_sentences": None, "max_length": 32, "teacher_max_length": 32},
        "train": {"batch_size": BATCH, "lr": 1e-3, "epochs": EPOCHS, "warmup_ratio": 0.1},
        "loss": loss,
        "runtime": {"log_every": 1},
        "resources": {"teacher": {"threads": 1, "batch_size": 64}, "learner": {"threads": 1}},
        "tracking": {"tracking_uri": workspace["mlflow"], "experiment": "test-st-mse", "run_name": run_name},
    })


# ----------------------------------------------------------------------------------------------------------------
# Refused before anything loads


@pytest.mark.parametrize("bad, field", [({"loss": {"reduction": "svd"}}, "loss.reduction"),
                                        ({"teacher": None}, "teacher"),
                                        ({"loss": {"pca_sentence": 10}}, "loss.pca_sentence")],
                         ids=["unknown reduction", "missing teacher", "misspelt loss key"])
def test_a_bad_config_is_refused_naming_the_field_before_any_model_loads(bad, field, tiny_bert, tiny_teacher,
                                                                        workspace, monkeypatch):
    from raydistill.runtime.jobs import st_mse

    def must_not_run(*args, **kwargs):
        raise AssertionError("a model or the teacher pass started before the config was refused")

    monkeypatch.setattr(st_mse, "build_student", must_not_run)
    monkeypatch.setattr("raydistill.runtime.teachers.embedding_cache.ensure_teacher_embeddings", must_not_run)
    monkeypatch.setattr("raydistill.runtime.teachers.teacher.TeacherEncoder.__init__", must_not_run)
    plain = job_config(tiny_bert, tiny_teacher, workspace, "refused").to_dict()
    for key, value in bad.items():
        plain[key] = value
    with pytest.raises(ConfigError, match=f"field '{field}'"):  # while the config loads, or in the job's checks
        st_mse.run_st_mse(JobConfig.from_dict(plain), results_dir=workspace["root"] / "results",
                          teacher_in_process=True)
    assert not (workspace["root"] / "refused").exists()


def test_the_command_line_refuses_an_unknown_reduction_with_the_field(capsys):
    from raydistill.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["run", "st_mse", "--set", "loss.reduction=svd"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "config error" in err and "field 'loss.reduction'" in err and "pca, dense" in err


def test_a_distillation_job_asked_to_train_st_mse_points_to_its_own_job(capsys):
    from raydistill.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["run", "congen", "--config", "st_mse"])  # the st-mse config, given to a distillation job
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "field 'method'" in err and "not trained by this job" in err and "raydistill run st_mse" in err


def test_raydistill_run_st_mse_help_lists_its_settings(capsys):
    from raydistill.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["run", "st_mse", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: raydistill run st_mse")
    assert "loss.reduction = pca" in text and "method = st-mse" in text


# ----------------------------------------------------------------------------------------------------------------
# Targets


def test_pca_gives_targets_of_the_students_width_from_the_teacher_vectors():
    from sklearn.decomposition import PCA

    from raydistill.runtime.jobs.st_mse_recipe import teacher_targets

    rng = np.random.default_rng(0)
    vectors = (rng.normal(size=(200, 8)) @ rng.normal(size=(8, TEACHER_DIM))
               + 0.05 * rng.normal(size=(200, TEACHER_DIM))).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    fit_rows = 120

    targets, info = teacher_targets(vectors, STUDENT_DIM, "pca", fit_rows)

    assert targets.shape == (200, STUDENT_DIM) and targets.dtype == np.float32
    components = PCA(n_components=STUDENT_DIM).fit(vectors[:fit_rows]).components_  # [d_s, d_t]
    # the example's Dense(d_t -> d_s) without bias: the uncentred projection on the teacher's principal axes
    np.testing.assert_allclose(targets, vectors @ components.T, atol=1e-5)
    assert info["reduction"] == "pca" and info["target_dim"] == STUDENT_DIM and info["teacher_dim"] == TEACHER_DIM
    assert info["pca_fit_sentences"] == fit_rows
    assert 0.99 < info["pca_explained_variance"] <= 1.0  # rank-8 structure: 32 components keep nearly everything
    # only the fitted rows decide the components: other rows beyond them change nothing
    moved = vectors.copy()
    moved[fit_rows:] = rng.normal(size=moved[fit_rows:].shape)
    again, _ = teacher_targets(moved, STUDENT_DIM, "pca", fit_rows)
    np.testing.assert_allclose(again[:fit_rows], targets[:fit_rows], atol=1e-5)


def test_dense_and_equal_widths_keep_the_teacher_vectors_and_pca_cannot_widen():
    from raydistill.runtime.jobs.st_mse_recipe import teacher_targets

    vectors = np.random.default_rng(1).normal(size=(64, TEACHER_DIM)).astype(np.float32)
    targets, info = teacher_targets(vectors, STUDENT_DIM, "dense", 64)
    assert targets is vectors and info["reduction"] == "dense" and info["target_dim"] == TEACHER_DIM
    targets, info = teacher_targets(vectors, TEACHER_DIM, "pca", 64)
    assert targets is vectors and info["reduction"] == "none"
    with pytest.raises(ConfigError, match="field 'loss.reduction'"):
        teacher_targets(vectors, 2 * TEACHER_DIM, "pca", 64)
    with pytest.raises(ConfigError, match="field 'loss.pca_sentences'"):
        teacher_targets(vectors, STUDENT_DIM, "pca", STUDENT_DIM - 1)


# ----------------------------------------------------------------------------------------------------------------
# The job end to end


@pytest.fixture
def mse_loss_calls(monkeypatch):
    """Counts the forward calls of sentence-transformers' own MSELoss during the test."""
    from raydistill.runtime.jobs.st_mse_recipe import _st_modules

    mse_loss = _st_modules()[3]
    calls: list[float] = []
    original = mse_loss.forward

    def counted(self, *args, **kwargs):
        loss = original(self, *args, **kwargs)
        calls.append(float(loss.detach()))
        return loss

    monkeypatch.setattr(mse_loss, "forward", counted)
    return calls


def test_job_trains_with_sentence_transformers_mse_and_writes_a_valid_result(tiny_bert, tiny_teacher, workspace,
                                                                             mse_loss_calls, capsys):
    from mlflow import MlflowClient

    from raydistill.evaluation import validate_result_file
    from raydistill.models import BiEncoder
    from raydistill.runtime.jobs.st_mse import run_st_mse

    results_dir = workspace["root"] / "results"
    record = run_st_mse(job_config(tiny_bert, tiny_teacher, workspace, "pca"), results_dir=results_dir,
                        command="pytest tests/test_st_mse.py", teacher_in_process=True)

    result_path = results_dir / f"st-mse-{tiny_bert.name}-{tiny_teacher.name}.json"
    assert record["result_path"] == str(result_path)
    validate_result_file(result_path)
    saved = json.loads(result_path.read_text())
    assert saved["method"] == "st-mse" and saved["kind"] == "distill" and saved["teacher"] == tiny_teacher.name
    assert saved["wall_s"] > 0 and saved["command"] == "pytest tests/test_st_mse.py"
    assert saved["git_sha"] and saved["date"]
    assert set(saved["scores"]) >= {"sts12", "sickr", "avg", "stsb_dev"}
    training = saved["training"]
    steps = EPOCHS * (ROWS // BATCH)
    assert training["sentences"] == ROWS and training["corpus"] == workspace["corpus"]
    assert training["reduction"] == "pca" and training["target_dim"] == STUDENT_DIM
    assert training["teacher_dim"] == TEACHER_DIM and training["pca_fit_sentences"] == ROWS
    assert training["steps"] == steps
    assert training["teacher_cache"] == {"hits": 0, "misses": ROWS, "teacher_forward_sentences": ROWS}
    assert "SentenceTransformerTrainer" in training["trainer"]

    # sentence-transformers' MSELoss computed every step, and training moved the student towards its targets
    assert len(mse_loss_calls) == steps
    assert np.mean(mse_loss_calls[-4:]) < np.mean(mse_loss_calls[:4])
    assert training["target_mse_after"] < training["target_mse_before"]

    student = BiEncoder.from_pretrained(saved["model_dir"])
    assert student.dim == STUDENT_DIM and student.projection is None  # the PCA reduced the targets, not the student

    client = MlflowClient(tracking_uri=workspace["mlflow"])
    run = client.get_run(saved["mlflow_run_id"])
    for key in ("method", "student", "teacher", "reduction", "lr", "batch_size", "git_sha", "config_hash",
                "corpus_size", "cache.misses"):
        assert key in run.data.params, key
    assert run.data.params["method"] == "st-mse" and run.data.params["reduction"] == "pca"
    losses = [m.value for m in client.get_metric_history(run.info.run_id, "loss")]
    assert len(losses) == steps and np.mean(losses[-4:]) < np.mean(losses[:4])
    assert "test_avg" in run.data.metrics
    assert result_path.name in {a.path for a in client.list_artifacts(run.info.run_id)}

    out = capsys.readouterr().out
    assert f"step {steps}/{steps}" in out and "teacher cache: 0 hits" in out and "7-STS avg" in out


def test_dense_reduction_widens_the_student_and_reuses_the_teacher_pass(tiny_bert, tiny_teacher, workspace,
                                                                        mse_loss_calls):
    from raydistill.models import BiEncoder
    from raydistill.runtime.jobs.st_mse import run_st_mse

    cfg = job_config(tiny_bert, tiny_teacher, workspace, "dense", reduction="dense")
    record = run_st_mse(cfg, result_path=workspace["root"] / "results" / "dense.json", teacher_in_process=True)

    training = record["training"]
    assert training["reduction"] == "dense" and training["target_dim"] == TEACHER_DIM
    # the vectors the first job's teacher pass cached: no sentence went through the teacher again
    assert training["teacher_cache"] == {"hits": ROWS, "misses": 0, "teacher_forward_sentences": 0}
    assert training["target_mse_after"] < training["target_mse_before"]
    assert len(mse_loss_calls) == training["steps"]
    student = BiEncoder.from_pretrained(record["model_dir"])
    assert student.dim == TEACHER_DIM and student.projection is not None
    assert student.projection_activation == "tanh"  # sentence-transformers' Dense default
