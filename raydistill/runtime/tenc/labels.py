"""Trans-Encoder label sets: one Parquet directory per (cycle, stage), written once, read by the learners themselves.

A label set has one row per pair of the job's pair set: ``pair_id``, ``sentence1``, ``sentence2``, ``score_<family>``
(what each family's labelling model said) and ``score`` (their mean, plain or weighted by dev: what mutual mode
trains on). The driver writes it at the label exchange (`write_label_set`). Each learner actor then reads its own
training rows from that directory through Ray Data (`read_training_rows`), so the labels never pass through the
driver on their way to a learner, and a rerun of a stage trains on exactly the rows its first run did.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from raydistill.fileio import staged_directory
from raydistill.runtime.tenc.pairs import PairSet

__all__ = ["IDENTITY_COLUMNS", "combine_labels", "dev_label_weights", "label_stats", "read_label_set",
           "read_training_rows", "write_label_set"]

IDENTITY_COLUMNS = ("pair_id", "sentence1", "sentence2")


def write_label_set(directory: Path, pair_set: PairSet, scores: dict[str, np.ndarray], averaged: np.ndarray) -> int:
    """Write one stage's label set (``score_<family>`` from ``scores``, ``score`` from ``averaged``) as one Parquet
    file, atomically; returns the number of rows. Written with pyarrow from the driver, which holds the table: a Ray
    Data write task would fill the CPUs the actors leave to Data (Ray then warns of a hang)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = pair_set.columns()
    table = pa.table({
        "pair_id": pa.array(columns["pair_id"], type=pa.int64()),
        "sentence1": pa.array(list(pair_set.sentence1), type=pa.string()),
        "sentence2": pa.array(list(pair_set.sentence2), type=pa.string()),
        **{f"score_{name}": pa.array(np.asarray(values, dtype=np.float32)) for name, values in scores.items()},
        "score": pa.array(np.asarray(averaged, dtype=np.float32)),
    })
    with staged_directory(directory) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, tmp / "part-00000.parquet")
    return table.num_rows


def read_training_rows(directory: str | os.PathLike, target_column: str, *, task_cpus: float = 1.0) -> Any:
    """The identity columns and ``target_column`` of the label set in ``directory`` (a pandas DataFrame), read through
    Ray Data in the calling learner actor, sorted by ``pair_id``: Ray Data promises no order across blocks, and the
    learner shuffles these rows with its stage seed, so a stage's batches are the same in every run of it."""
    import ray

    # partitioning=None: the cycle=<k>/stage=<s> directory names are the label set's address, not its columns.
    dataset = ray.data.read_parquet(str(directory), columns=[*IDENTITY_COLUMNS, target_column], partitioning=None,
                                    num_cpus=task_cpus)
    dataset.context.enable_progress_bars = False
    return dataset.to_pandas().sort_values("pair_id", kind="stable").reset_index(drop=True)


def read_label_set(directory: str | os.PathLike, columns: list[str] | None = None) -> Any:
    """A label set (or some of its ``columns``, with ``pair_id``) as a pandas DataFrame sorted by ``pair_id``, for the
    driver's pair AUC. Read with pyarrow: a Ray Data read of one small table would only add task scheduling (about
    10 s measured). Learners read theirs with `read_training_rows`."""
    import pyarrow.parquet as pq

    wanted = None if columns is None else list(dict.fromkeys(["pair_id", *columns]))
    frame = pq.read_table(str(directory), columns=wanted, partitioning=None).to_pandas()
    frame = frame[[c for c in frame.columns if c in IDENTITY_COLUMNS or c.startswith("score")]]
    return frame.sort_values("pair_id", kind="stable").reset_index(drop=True)


def combine_labels(per_family: dict[str, np.ndarray], weights: dict[str, float] | None = None) -> np.ndarray:
    """The ``score`` column: the families' labels averaged, weighted by ``weights`` when given, as float32."""
    from raydistill.objectives.trans_encoder import average_pseudo_labels

    families = list(per_family)
    return np.asarray(average_pseudo_labels([per_family[f] for f in families],
                                            None if weights is None else [weights[f] for f in families]),
                      dtype=np.float32)


def label_stats(per_family: dict[str, np.ndarray], averaged: np.ndarray) -> dict[str, float]:
    """Mean, spread and range of the averaged labels; with two or more families, their mean pairwise Spearman
    agreement (how much the labelling models agree on the order of the pairs)."""
    stats = {"mean": float(np.mean(averaged)), "std": float(np.std(averaged)),
             "min": float(np.min(averaged)), "max": float(np.max(averaged))}
    if len(per_family) > 1:
        from raydistill.evaluation import spearman

        names = list(per_family)
        rhos = []
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                # A collapsed labeller (one value for every pair) agrees with nothing: rho 0, not an error.
                constant = np.ptp(per_family[a]) == 0 or np.ptp(per_family[b]) == 0
                rhos.append(0.0 if constant else spearman(per_family[a], per_family[b]) / 100.0)
        stats["agreement"] = float(np.mean(rhos))
    return stats


def dev_label_weights(dev: dict[str, float], temperature: float) -> dict[str, float]:
    """Each family's weight in the averaged label from its labelling model's dev score (``label_weighting: dev``:
    softmax(dev / temperature), ``objectives.trans_encoder.dev_weights``)."""
    from raydistill.objectives.trans_encoder import dev_weights

    families = list(dev)
    return dict(zip(families, dev_weights([dev[f] for f in families], temperature).tolist()))
