"""Evaluation: 7-STS Spearman (bi- or cross-encoder), paraphrase ROC AUC, and the result files behind the README and docs.

    from raydistill.evaluation import evaluate_sts, STS7
    scores = evaluate_sts(model)            # {"sts12": .., ..., "sickr": .., "stsb_dev": .., "avg": ..}, x 100
"""

from raydistill.evaluation.metrics import PAIR_METRIC_NAMES, pair_metric, roc_auc, score_pairs, spearman
from raydistill.evaluation.results import (
    SCHEMA_PATH, ResultError, default_command, format_scores_table, git_sha, validate_result, validate_result_file,
    write_result,
)
from raydistill.evaluation.sts import (
    DEV_SET, STS7, STS_SETS, detect_encoder, evaluate_pair_auc, evaluate_sts, pair_similarities, sts_predictions,
)

__all__ = [
    "DEV_SET", "PAIR_METRIC_NAMES", "pair_metric", "score_pairs", "SCHEMA_PATH", "STS7", "STS_SETS", "ResultError",
    "default_command", "detect_encoder", "evaluate_pair_auc", "evaluate_sts", "format_scores_table", "git_sha",
    "pair_similarities", "roc_auc", "spearman", "sts_predictions", "validate_result", "validate_result_file",
    "write_result",
]
