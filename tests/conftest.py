"""Session-wide test setup: offline Hugging Face, quiet Ray, two torch threads, tiny models built once.

Fixtures other test files rely on (keep their names and return types):
    real_sentences -> list[str]           ~1900 real sentences (Flickr30k captions + STS-B train), fixed order
    tiny_models    -> dict[str, Path]     {"bert", "roberta", "mpnet"}: tiny random HF checkpoints + trained tokenizers
    tiny_bert      -> Path                tiny_models["bert"], built without the other two when used alone
For other sizes call `tiny_models.make_tiny_model(family, out_dir, sentences, hidden=..., layers=...)`.
"""

from __future__ import annotations

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
