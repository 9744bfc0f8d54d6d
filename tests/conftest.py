"""Session-wide test setup: offline Hugging Face, quiet Ray, two torch threads, tiny models built once, small
evaluation sets for the Ray tests (`pytest_runtest_setup`).

Fixtures other test files rely on (keep their names and return types):
    real_sentences -> list[str]           ~1900 real sentences (Flickr30k captions + STS-B train), fixed order
    tiny_models    -> dict[str, Path]     {"bert", "roberta", "mpnet"}: tiny random HF checkpoints + trained tokenizers
    tiny_bert      -> Path                tiny_models["bert"], built without the other two when used alone
For other sizes call `tiny_models.make_tiny_model(family, out_dir, sentences, hidden=..., layers=...)`.
"""

from __future__ import annotations

import gzip
import os
import sys
from pathlib import Path

# Set before anything imports transformers / huggingface_hub / ray: they read these at import time.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ["RAY_DEDUP_LOGS"] = "0"
os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
os.environ["RAY_CHDIR_TO_TRIAL_DIR"] = "0"
# OpenMP threads that sleep instead of spinning while they wait. With the default (spin) policy and other
# processes on the two cores, a 2-thread forward pass of a tiny model measured 20-70x slower than 1 thread
# (0.4-1.5 s vs 0.02 s per call); with PASSIVE, 2 threads cost the same as 1. Read when torch loads libgomp.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

# Two cores are shared by every process on this machine; tests that need another count set it themselves.
torch.set_num_threads(2)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_models import FAMILIES, load_real_sentences, make_tiny_model  # noqa: E402

# Rows of each evaluation set the Ray tests read (`_small_eval_data`). STS-B dev gets more: it picks the best step and
# ranks the Tune trials, where a noisier score could reorder close runs.
SMALL_EVAL_ROWS = {**dict.fromkeys(("sts12", "sts13", "sts14", "sts15", "sts16", "stsb_test", "sick_test"), 128),
                   "stsb_dev": 256}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # `-m "not ray"` must leave out every test that starts Ray, also one that gets the session only through another
    # fixture (distill_runs) or usefixtures and was never marked by hand.
    for item in items:
        if "ray_session" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("ray"):
            item.add_marker(pytest.mark.ray)


def _small_eval_data(config) -> Path:
    """A ``$RAYDISTILL_DATA`` root holding an evenly spaced sample of each set a job evaluates on (the 7 STS sets and
    STS-B dev); every other file falls through to the bundled copy. Written once per session, on first use.

    The whole ~19k pairs cost a whole-job test ~15-50 s per scored model on two cores and test nothing a few hundred
    don't: the Ray tests check that scores are computed, recorded, compared and selected on, never their real values
    (those are tests/test_evaluation.py's, on the bundled sets). Spaced rows keep each set's subsets and score range
    (sts16's six integer grades included), so the Spearman correlations stay far from degenerate. Training data
    (STS-B train, SICK train, Flickr, NLI, QQP, MRPC) stays whole.
    """
    root = getattr(config, "_small_eval_data", None)
    if root is None:
        from raydistill.data import BUNDLED_DIR, DATASETS

        root = config._tmp_path_factory.mktemp("small_eval_data")
        for name, rows in SMALL_EVAL_ROWS.items():
            relpath = DATASETS[name].relpath
            with gzip.open(BUNDLED_DIR / f"{relpath}.gz", "rt", encoding="utf-8") as stream:
                lines = [line for line in stream if line.strip()]
            step = len(lines) / rows
            target = root / relpath
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("".join(lines[int(i * step)] for i in range(rows)), encoding="utf-8")
        config._small_eval_data = root
    return root


# Every Ray test reads the evaluation sets from `_small_eval_data`, in the driver, in its subprocesses and in the Ray
# workers (which inherit the driver's environment when the session's Ray starts inside the first Ray test). Set around
# the whole setup-call-teardown, so the session and module fixtures that run a job (distill_runs, mutual_run, the
# tune sweep) see it too; the tests without Ray keep the bundled sets. A Ray test cannot opt out: the session's
# workers have the small root.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    if item.get_closest_marker("ray") is not None:
        from raydistill.data import DATA_ENV

        item._data_env_before = os.environ.get(DATA_ENV)
        os.environ[DATA_ENV] = str(_small_eval_data(item.config))
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    if hasattr(item, "_data_env_before"):
        from raydistill.data import DATA_ENV

        if item._data_env_before is None:
            os.environ.pop(DATA_ENV, None)
        else:
            os.environ[DATA_ENV] = item._data_env_before


@pytest.fixture(scope="session")
def real_sentences() -> list[str]:
    return load_real_sentences()


class TinyModelBuilder:
    """Builds each family's tiny checkpoint at most once per session, on first request."""

    def __init__(self, root: Path, sentences: list[str]):
        self.root = root
        self.sentences = sentences
        self.built: dict[str, Path] = {}

    def get(self, family: str) -> Path:
        if family not in self.built:
            self.built[family] = make_tiny_model(family, self.root / family, self.sentences)
        return self.built[family]


@pytest.fixture(scope="session")
def tiny_model_builder(tmp_path_factory, real_sentences) -> TinyModelBuilder:
    return TinyModelBuilder(tmp_path_factory.mktemp("tiny_models"), real_sentences)


@pytest.fixture(scope="session")
def tiny_models(tiny_model_builder) -> dict[str, Path]:
    return {family: tiny_model_builder.get(family) for family in FAMILIES}


@pytest.fixture(scope="session")
def tiny_bert(tiny_model_builder) -> Path:
    return tiny_model_builder.get("bert")


# The tiny ConGen set-up shared by the learner and resume-safety tests: real paraphrase pairs (STS-B train pairs scored
# >= 4) as the two views, and the vectors of a tiny MPNet teacher of another width than the student.
TEACHER_DIM = 48
PARAPHRASE_ROWS = 64


@pytest.fixture
def one_thread():
    # Tiny models gain nothing from a second thread, and on a busy 2-core box it makes them ~10x slower.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def paraphrases():
    import numpy as np

    from raydistill.data import load_dataset

    pairs = [p for p in load_dataset("stsb_train") if p.score >= 4.0][:PARAPHRASE_ROWS]
    return (np.array([p.sentence1 for p in pairs], dtype=object), np.array([p.sentence2 for p in pairs], dtype=object))


@pytest.fixture(scope="module")
def tiny_teacher(tmp_path_factory, real_sentences):
    return make_tiny_model("mpnet", tmp_path_factory.mktemp("teacher48"), real_sentences, hidden=TEACHER_DIM,
                           heads=4, intermediate=96, seed=3)


@pytest.fixture(scope="module")
def teacher_vectors(tiny_teacher, paraphrases):
    from raydistill.models import BiEncoder

    return BiEncoder.from_pretrained(str(tiny_teacher)).encode(list(paraphrases[0]), normalize=True)  # [N, 48]


@pytest.fixture
def no_ray_start(monkeypatch):
    """A bad input that gets as far as starting Ray was checked too late: fail instead of training."""
    from raydistill.runtime.engine import cluster

    def started(*args, **kwargs):
        raise AssertionError("Ray was started: the bad input was not refused first")

    monkeypatch.setattr(cluster, "init_ray", started)
