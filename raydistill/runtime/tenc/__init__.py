"""Trans-Encoder self- and mutual distillation as a Ray job: families of bi-/cross-encoder actors exchanging labels.

Trans-Encoder (Liu, Jiao, Massiah, Yilmaz & Havrylov, ICLR 2022, arXiv:2109.13059; repo amzn/trans-encoder) turns
a pretrained sentence encoder into a better one without labels by alternating its two formulations on a set of
unlabeled pairs (``pairs.py``). One *cycle*, for every model family f (a bi-encoder b_f and a cross-encoder c_f
built from one checkpoint):

    bi2cross:  y_f  = cos(b_f(s1), b_f(s2))             every family labels every pair      (label set)
               y    = mean_f y_f   (mutual)   or  y_f   (self)
               c_f <- BCEWithLogits(c_f(s1,s2), t(y)) + both orders, best STS-B dev checkpoint
    cross2bi:  z_f  = (sigmoid c_f(s1,s2) + sigmoid c_f(s2,s1)) / 2                         (label set)
               z    = mean_f z_f   (mutual)   or  z_f   (self)
               b_f <- MSE(cos(b_f(s1), b_f(s2)), z), best STS-B dev checkpoint

Mutual distillation averages the families' labels, so each family learns from an ensemble of differently
pretrained models; self-distillation uses one family's own labels. Each learner is a Ray actor (``learners.py``);
families train concurrently and meet only at the label exchange (``job.py``). The authors' "parallel" script trains
the models one after another in one process (docs/methods.md, Trans-Encoder).

The job is split by what each part does; each module imports only the ones listed before it:

    sections.py       the config's sections and the stage names
    config.py         TencConfig: loading, validation, the config hash
    state.py          the run directory's layout and state.json (resume)
    labels.py         label sets: write (driver), read (learners, through Ray Data), statistics, dev weights
    learners.py       the bi- and cross-encoder learners behind the actors
    actors.py         FamilyActors (each family's bi- and cross-encoder actor) and the job's progress line
    evaluation.py     JobEvaluation, the job's mix-in: evaluations, pair AUC, model selection
    job.py            TransEncoderJob: the job's resources, cycle 0, stages, label exchange
    report.py         result files, summary.json, the verdict lines
    __init__.py       run_trans_encoder: the steps in order (this module)

Initialisation (``init``): ``refresh`` (the paper's ``--init_with_new_models``; the authors' mutual script always
refreshes, here both modes honour ``init``) starts every cross-encoder from the family's original checkpoint with a
new head and every bi-encoder from its original checkpoint, so only labels carry information across stages;
``sequential`` starts each stage from the weights of the stage before it (cross_k from bi_{k-1}, bi_k from cross_k's
encoder, heads dropped/new).

Run directory (everything a resume or an inspection needs):

    <run_dir>/state.json                                  completed stages, label sets, evaluations, config hash
    <run_dir>/labels/cycle=<k>/stage=<bi2cross|cross2bi>/ Parquet: pair_id, sentence1, sentence2,
                                                          score_<family> per family (and score_teacher with a
                                                          ``teacher``), score (the average)
    <run_dir>/teacher/pair-labels.npy                     the teacher's cosine of every pair, computed once
    <run_dir>/models/cycle=<k>/<bi|cross>/<family>/       the stage's best-dev model (cycle 0 = start checkpoints)
    <run_dir>/training/cycle=<k>/<bi|cross>/<family>/     the engine's run dir of a stage in progress or stopped
                                                          (checkpoints/, best/; removed once the stage finishes)
    <run_dir>/eval/cycle=<k>/<bi|cross>/<family>.npz      per-pair test predictions (ensembles are computed from these)
    <run_dir>/eval/cycle=<k>/<bi|cross>/<family>-pairs.npy the model's score of every training pair (qqp, mrpc)
    <run_dir>/best/<family>/<bi|cross>                    the best-dev model over all cycles (a copy)
    <run_dir>/summary.json                                start, best and whether training improved, per family
    <run_dir>/plots/dev_by_cycle.png                      every family's dev score per cycle (MLflow parent artifact)

A restarted job with the same config skips every completed stage (``state.py``); a stage stopped mid-way continues
from its saved step; ``cycles`` may grow between runs. Results go to ``results_dir`` as result-schema JSON: one per
family, encoder and cycle (``eval.test_cycles: all``; cycle 0 = the starting bi-encoders) or for cycle 0 and each
family's best-dev models only (``best``), plus the families' ensembles (mean of their predictions), and a copy of
``summary.json``. Model selection is on the dev set and includes the start (``TransEncoderJob.select_best``), so a
run whose training never beats its start keeps it and says so in its last lines and ``summary.json``. With
``pairs.source: qqp`` / ``mrpc`` every evaluated model also gets the ROC AUC of its pair scores against the gold
labels (``extra.pair_auc``, ``pairs.py``), read in the driver only; the AUC never chooses a model.
"""

from __future__ import annotations

from typing import Any

from raydistill.evaluation.results import git_sha
from raydistill.runtime.tenc.config import TencConfig, stage_key
from raydistill.runtime.tenc.evaluation import scores_from_predictions
from raydistill.runtime.tenc.job import TransEncoderJob
from raydistill.runtime.tenc.labels import read_label_set
from raydistill.runtime.tenc.report import TencReport

__all__ = ["TencConfig", "TransEncoderJob", "read_label_set", "run_trans_encoder", "scores_from_predictions",
           "stage_key"]


def run_trans_encoder(cfg: TencConfig) -> dict[str, Any]:
    """Validate, start/join Ray, run (or resume) the job; returns the summary (also ``<run_dir>/summary.json``).

    With ``stop_after_stage`` set, the job stops cleanly once that stage is complete, as a crash there would, and
    returns ``{"stopped_after": key, "run_dir", "state"}``.
    """
    git_sha()  # cached now: every result file and the summary carry the code this process imported, not later edits
    job = TransEncoderJob(cfg)
    report = TencReport(job)
    with job.running():
        job.start()
        report.publish_results()
        for cycle, stage in job.stages():
            job.run_stage(cycle, stage)
            report.publish_results()
            if job.cfg.stop_after_stage == stage_key(cycle, stage):
                return report.stopped(stage_key(cycle, stage))
        best = job.select_best()
        report.publish_results()
        return report.finish(best)
