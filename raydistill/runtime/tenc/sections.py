"""The Trans-Encoder config's sections (``FamilyConfig``, ``StageConfig``, ``PairsConfig``, ``TencEvalConfig``,
``TencResources``) and the names of a cycle's two stages (``STAGES``, ``stage_key``, which encoder a stage trains and
which one labels its pairs).

Every section is a ``@section`` of ``raydistill.config.schema``, as the job config's. The rules across fields are
``TencConfig.validate``'s (``config.py``, which assembles these sections into ``TencConfig`` and re-exports every
name of this module).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, StrictBool

from raydistill.config.job import LearnerResources, RoleResources
from raydistill.config.sections import data_headroom
from raydistill.config.schema import Float, Int, none_is_default, section, states, str_is_list
from raydistill.models.cross_encoder import HEADS

STS7 = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")
# A cycle is two stages; each is named for the direction its labels flow.
STAGES = ("bi2cross", "cross2bi")  # bi labels -> cross learns; cross labels -> bi learns
STAGE_TRAINS = {"bi2cross": "cross", "cross2bi": "bi"}  # which encoder a stage trains
STAGE_LABELS = {"bi2cross": "bi", "cross2bi": "cross"}  # which encoder labels a stage's pairs
STAGE_TRAINED_IN = {"cross": "bi2cross", "bi": "cross2bi"}
TEACHER_LABELLER = "teacher"  # the name of ``teacher:``'s labels beside the families' (score_teacher, weights)


def stage_key(cycle: int, stage: str) -> str:
    """``cycle=<k>/stage=<bi2cross|cross2bi>``: how the run state, the label directories and ``stop_after_stage``
    name a stage."""
    return f"cycle={cycle}/stage={stage}"


_DEFAULTS_IF_NULL = BeforeValidator(none_is_default)


@states("[a-z0-9][a-z0-9_.-]*")
def _family_name(name: str) -> str:
    if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", name):
        raise ValueError(f"{name!r} must be lower-case letters, digits, '-', '_' or '.' (it names Parquet columns "
                         "and directories)")
    return name


@section
class FamilyConfig:
    """One model family: a bi-encoder and a cross-encoder built from the same pretrained encoder."""

    name: Annotated[str, AfterValidator(_family_name)] = Field(
        description="family name, used in column names (score_<name>), paths and run names")
    bi: str = Field(description="bi-encoder: a preset name or a local directory")
    cross: str | None = Field(None, description="start checkpoint of the cross-encoder (null: the bi checkpoint, "
                                                "with a new head)")
    pooling: Literal["mean", "cls"] | None = Field(None, description="bi-encoder pooling: mean or cls (null: the checkpoint's own, mean "
                                                  "for plain HF checkpoints)")
    # e.g. a higher learning rate for a 2-layer bi-encoder, which barely moves at the rate a 4-layer one needs.
    bi_stage: dict[str, Any] | None = Field(None, description="this family's own bi-stage settings over bi: (lr, "
                                                              "epochs, batch_size, max_steps, warmup_ratio, ...)")
    cross_stage: dict[str, Any] | None = Field(None, description="this family's own cross-stage settings over cross: "
                                                                 "(lr, epochs, batch_size, ...)")

    @property
    def cross_start(self) -> str:
        return self.cross or self.bi

    def own_stage(self, kind: str) -> dict[str, Any]:
        """This family's own ``bi`` or ``cross`` stage settings ({} when it has none)."""
        return (self.bi_stage if kind == "bi" else self.cross_stage) or {}

    def recorded(self) -> dict[str, Any]:
        """The family as result files record it (``training.families[<name>]``): its models and own settings."""
        return {"bi": self.bi, "cross": self.cross_start,
                **{f"{kind}_stage": self.own_stage(kind) for kind in ("bi", "cross") if self.own_stage(kind)}}


@section
class StageConfig:
    """Training of one encoder kind in every cycle (the bi- or the cross-encoder stage)."""

    batch_size: Int = Field(32, gt=0, description="rows (pairs) per training step")
    lr: Float = Field(2e-5, gt=0, description="peak learning rate")
    epochs: Int = Field(1, gt=0, description="passes over the labelled pairs per stage")
    max_steps: Int | None = Field(None, gt=0, description="cap per stage (quick runs, tests; null: the epochs)")
    max_length: Int = Field(64, ge=8, description="token limit of this stage's encoder (fewer cannot hold a pair)")
    warmup_ratio: Float = Field(0.1, ge=0, lt=1, description="share of the steps spent warming the learning rate up")
    weight_decay: Float = Field(0.01, ge=0, description="AdamW weight decay")
    grad_clip: Float = Field(1.0, ge=0, description="clip the gradient norm to this (0: no clipping)")
    eval_every: Int = Field(200, gt=0, description="STS-B dev every N steps and at each epoch end; the best checkpoint is "
                                             "the stage's output")
    amp: StrictBool = Field(True, description="bf16 autocast on CUDA only (the authors train with AMP); ignored on CPU")
    # "bf16" is several times faster on CPUs with hardware bf16 products (AVX512-BF16, AMX) and many times slower
    # where torch emulates it (warned); each learner logs which precision "auto" chose.
    precision: Literal["fp32", "bf16", "auto"] = Field("fp32", description="CPU precision of training, labelling and evaluation: fp32, bf16 "
                                               "autocast, or auto (bf16 where the CPU has hardware bf16 products)")
    head: Literal[HEADS] | None = Field(None, description="cross-encoder only (bi: leave null): classifier (a head on [CLS], the "
                                               "paper's) or segment_cosine (scale x cos of the two sentences' mean "
                                               "token states in the joint encoding); null = classifier")


@section
class PairsConfig:
    """The unlabeled sentence pairs the encoders label for each other."""

    source: str = Field("transductive", description="unlabeled sentence pairs: transductive (the STS test pairs), "
                                                    "inductive, qqp, mrpc or file:<path.jsonl> (pairs.py)")
    max_pairs: Int | None = Field(None, gt=0, description="seeded subsample of the deduplicated pool (null: all)")
    seed: Int | None = Field(None, description="seed of the subsample (null: the job's seed)")
    held_out: Int | None = Field(None, gt=0, description="qqp / mrpc: split the pairs in two halves and learn from one "
                                                         "(less every pair sharing a sentence with the other); "
                                                         "the ROC AUC is then measured on this many pairs of the "
                                                         "other half, never seen (inductive). null: the AUC is on "
                                                         "the pairs learned from (transductive)")


@section
class TencEvalConfig:
    """Model selection and the final evaluation."""

    dev_set: str = Field("stsb_dev", description="model selection inside every stage")
    test_sets: Annotated[list[str], BeforeValidator(str_is_list)] = Field(
        default_factory=lambda: list(STS7), description="sets of the final 7-STS evaluation")
    test_cycles: Literal["all", "best", "none"] = Field("all", description="all: 7-STS of every family, encoder and cycle (+ cycle 0); best: "
                                                "cycle 0 and each family's best-dev model only; none: no test "
                                                "evaluation (quick checks)")


@section
class TencResources:
    """Per-role actor resources. Each family has one bi- and one cross-encoder actor; they never compute at the
    same time, so on a small machine both may reserve a fraction of a CPU while running one thread each."""

    num_cpus: Float = Field(2, gt=0, description="CPUs of the local Ray the job starts itself (unused on a cluster)")
    bi: Annotated[RoleResources, _DEFAULTS_IF_NULL] = Field(
        default_factory=lambda: RoleResources(num_cpus=0.25, threads=1, batch_size=128),
        description="each family's bi-encoder actor (batch_size: sentences per forward pass)")
    cross: Annotated[RoleResources, _DEFAULTS_IF_NULL] = Field(
        default_factory=lambda: RoleResources(num_cpus=0.25, threads=1, batch_size=64),
        description="each family's cross-encoder actor (batch_size: pairs per forward pass)")
    # 0: a Ray Train run costs 19.4 s to start, local mode 0.10 s (tenc/learners.py); a stage is a minute or two.
    learners: Annotated[LearnerResources, _DEFAULTS_IF_NULL] = Field(
        default_factory=lambda: LearnerResources(num_learners=0, num_cpus=1, threads=1, cpu_speedups=False),
        description="each stage's Ray Train learners: num_learners 0 trains the stage in Train's local mode inside "
                    "its family's actor (threads and GPU: the actor's); N: a Train run of N data-parallel workers "
                    "per stage, started by the actor, each with num_cpus / num_gpus / threads")
    # Measured hang with every CPU reserved: docs/runtime.md, Ray behaviour.
    data_max_cpus: Annotated[Float, AfterValidator(data_headroom)] = Field(1.0, description="CPUs the actors must leave to Ray Data (the label sets' Parquet "
                                                  "writes and the learners' reads of them)")
    # The nodes started as `ray start --resources '{"node_a": 4}'`: one family per node on a multi-node cluster.
    families: dict[str, dict[str, Annotated[Float, Field(gt=0)]]] = Field(
        default_factory=dict, description="custom Ray resources each family's two actors ask for, by family name, "
                                          "e.g. {bert: {node_a: 1}}; a family not named goes wherever Ray has room")

    @property
    def data_task_cpus(self) -> float:
        """CPUs each Ray Data task of the job asks for: at most one, and never more than the headroom, so a task
        always fits in what the actors leave."""
        return min(1.0, self.data_max_cpus)
