"""DvBERT (Cheng, "Dual-View Distilled BERT for Sentence Embedding", SIGIR 2021, arXiv:2104.08675): a siamese
student learns NLI from K cross-encoder teachers' soft labels with teacher annealing, then STS-B
(``sts_cosine.py``).

    target = λ·y + (1 − λ)·mean_k q_k(a, b)              # λ: 0 → 1 over training
    L      = CE(target, softmax(W [u; v; |u − v|]))

Rows: the ``nli_teacher_labels`` set: the labelled NLI pairs with the teachers' mean out-of-fold class
distribution, built by the runtime (raydistill.runtime.dvbert_teachers) from ``extra.teachers`` and
``extra.teacher_training`` (``TeacherTraining`` below).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from raydistill.methods.base import Features, MethodSpec, StepContext
from raydistill.objectives import DvBERTLoss
from raydistill.runtime.config import JobConfig

__all__ = ["SPEC", "TeacherTraining", "DVBERT_TEACHERS", "HEADS", "PRECISIONS"]

DVBERT_TEACHERS = ("minilm-l6", "bert-small")
HEADS = ("cls", "mean", "segments", "aligned")
PRECISIONS = ("fp32", "bf16")

# Fields that judge the teachers rather than shape them: not part of the cache key, so changing the bar never
# retrains anything.
_JUDGING_FIELDS = ("min_accuracy",)


@dataclass
class TeacherTraining:
    """How each cross-encoder teacher is fine-tuned and judged (``extra.teacher_training`` of a DvBERT config).

    The defaults are the paper's schedule (1 epoch, Adam lr 2e-5, 10 % warm-up, dropout 0.1) on its [CLS] head;
    raydistill/configs/dvbert.yaml sets what trains on a CPU (see its comments and raydistill.runtime.dvbert_teachers).
    """

    epochs: int = 1
    lr: float = 2e-5
    batch_size: int = 32
    max_length: int = 64
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    dropout: float = 0.1          # in the head; the transformer keeps its own config's dropout
    finetune: bool = True         # False: the transformer stays frozen, encodes each pair once, only the head trains
    head: str = "cls"             # what the head reads (``pool_pair``): cls (the paper's), mean, segments, aligned
    head_hidden: int = 0          # 0: one FC layer (the paper's); n: FC(n) → GELU → FC
    folds: int = 2                # each teacher trains `folds` models; model f labels only fold f
    max_pairs: int | None = None  # None: every labelled NLI pair shipped (SNLI dev + MultiNLI dev)
    precision: str = "fp32"       # bf16: forward and backward under torch.autocast(bfloat16); weights stay fp32
    min_accuracy: float = 0.6     # refuse a teacher whose held-out accuracy is below this
    seed: int = 1000

    def __post_init__(self) -> None:
        if self.head not in HEADS:
            raise ValueError(f"head must be one of {', '.join(HEADS)}, got {self.head!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if isinstance(self.folds, bool) or not isinstance(self.folds, int) or self.folds < 2:
            raise ValueError(f"folds must be an integer >= 2 (each pair is labelled by a model that did not train "
                             f"on it), got {self.folds!r}")
        if not (isinstance(self.min_accuracy, (int, float)) and 0.0 <= self.min_accuracy <= 1.0):
            raise ValueError(f"min_accuracy must be a number in [0, 1], got {self.min_accuracy!r}")
        if isinstance(self.head_hidden, bool) or not isinstance(self.head_hidden, int) or self.head_hidden < 0:
            raise ValueError(f"head_hidden must be an integer >= 0, got {self.head_hidden!r}")
        if not isinstance(self.finetune, bool):
            raise ValueError(f"finetune must be true or false, got {self.finetune!r}")
        for name in ("epochs", "batch_size", "max_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            raise ValueError(f"lr must be a number > 0, got {self.lr!r}")
        if self.max_pairs is not None and (isinstance(self.max_pairs, bool) or not isinstance(self.max_pairs, int)
                                           or self.max_pairs < 2 * self.folds):
            raise ValueError(f"max_pairs must be null (all pairs) or an integer >= 2 x folds, got {self.max_pairs!r}")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> TeacherTraining:
        d = dict(d or {})
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"extra.teacher_training: unknown field(s) {sorted(unknown)}; allowed: "
                             f"{', '.join(cls.__dataclass_fields__)}")
        return cls(**d)

    def shaping(self) -> dict[str, Any]:
        """The settings that determine the trained models (the cache key's part)."""
        return {k: v for k, v in asdict(self).items() if k not in _JUDGING_FIELDS}


def teachers_of(cfg: JobConfig) -> list:
    """The cross-encoder teachers a DvBERT config names (``extra.teachers``, default ``DVBERT_TEACHERS``)."""
    return list(cfg.extra.get("teachers") or DVBERT_TEACHERS)


def dvbert_features(ctx: StepContext, batch) -> Features:
    """u, v of the pair and the teachers' mean class distribution; labels = gold classes. The loss mixes them with
    the annealing weight λ (0 → 1 over training; its step count is checkpointed with it)."""
    u, v = ctx.encode_views(batch["text_a"], batch["text_b"])
    return ({"u": u, "v": v, "teacher_probs": ctx.tensor(batch["teacher_probs"])},
            ctx.tensor(batch["label"], dtype=torch.long))


def check_dvbert(cfg: JobConfig) -> None:
    teachers = cfg.extra.get("teachers", list(DVBERT_TEACHERS))
    if not isinstance(teachers, list) or not teachers:
        raise cfg._error("extra.teachers", "a non-empty list of cross-encoder teacher models, e.g. "
                                           "[minilm-l6, bert-small]")
    if len(set(teachers)) != len(teachers):
        raise cfg._error("extra.teachers", f"lists a teacher twice ({teachers}): identical teachers share "
                                           "one cache entry and add no second view")
    try:
        TeacherTraining.from_dict(cfg.extra.get("teacher_training"))
    except (TypeError, ValueError) as exc:
        raise cfg._error("extra.teacher_training", str(exc)) from None


SPEC = MethodSpec(
    name="dvbert",
    summary="DvBERT (Cheng, SIGIR 2021): K NLI cross-encoder teachers, teacher annealing, then STS-B",
    views={},
    teacher_views=(),
    needs_teacher=False,
    default_loss={},
    loss_class=DvBERTLoss,
    loss_dim="student",
    batch_to_features=dvbert_features,
    student_sentences_per_row=2,
    dataset="nli_teacher_labels",
    stages=("sts-cosine",),
    stage_defaults=({"train": {"lr": 2e-5, "epochs": 4, "batch_size": 16, "warmup_ratio": 0.1},
                     "data": {"max_sentences": None}},),
    check=check_dvbert,
    extra_keys=("teachers", "teacher_training", "stage2"),
)
