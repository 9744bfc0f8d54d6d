"""The pictures a run leaves behind: its learning curve, how its best model scores STS-B dev, and (Trans-Encoder)
every family's dev score per cycle.

All use matplotlib's Agg backend (no display on a training box) and are logged as MLflow artifacts by the runtime."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

__all__ = ["plot_learning_curve", "plot_dev_scatter", "plot_dev_by_cycle"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_learning_curve(history: list[dict], path: str | os.PathLike, title: str | None = None,
                        loss_key: str = "loss", dev_key: str = "stsb_dev") -> Path:
    """Training loss per step (left axis) and STS-B dev Spearman at each evaluation (right axis).

    ``history``: rows with ``step`` and any of ``loss_key`` / ``dev_key`` (rows may carry only one of them)."""
    plt = _pyplot()
    loss_rows = [(r["step"], r[loss_key]) for r in history if r.get(loss_key) is not None and "step" in r]
    dev_rows = [(r["step"], r[dev_key]) for r in history if r.get(dev_key) is not None and "step" in r]
    if not loss_rows and not dev_rows:
        raise ValueError(f"plot_learning_curve: no row has 'step' with '{loss_key}' or '{dev_key}'")
    fig, loss_ax = plt.subplots(figsize=(7, 4), dpi=110)
    if loss_rows:
        steps, losses = np.array(loss_rows, dtype=float).T
        loss_ax.plot(steps, losses, color="tab:blue", linewidth=1, alpha=0.5, label="train loss")
        if len(losses) >= 20:  # a moving average shows the trend under per-batch noise
            window = max(5, len(losses) // 20)
            smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
            loss_ax.plot(steps[window - 1:], smooth, color="tab:blue", linewidth=2, label=f"mean of {window}")
        loss_ax.set_ylabel("train loss", color="tab:blue")
    loss_ax.set_xlabel("step")
    if dev_rows:
        dev_ax = loss_ax.twinx()
        steps, scores = np.array(dev_rows, dtype=float).T
        dev_ax.plot(steps, scores, color="tab:orange", marker="o", markersize=3, label="STS-B dev")
        best = int(np.argmax(scores))
        dev_ax.annotate(f"best {scores[best]:.2f} @ {int(steps[best])}", (steps[best], scores[best]),
                        textcoords="offset points", xytext=(0, 8), ha="center", fontsize=8)
        dev_ax.set_ylabel("STS-B dev Spearman x 100", color="tab:orange")
    loss_ax.set_title(title or "learning curve")
    return _save(fig, plt, path)


def plot_dev_scatter(gold: Sequence[float], predicted: Sequence[float], path: str | os.PathLike,
                     title: str = "STS-B dev") -> Path:
    """Gold score against the model's similarity for each pair, with the Spearman correlation in the title."""
    from scipy.stats import spearmanr

    plt = _pyplot()
    gold_arr, predicted_arr = np.asarray(gold, dtype=float), np.asarray(predicted, dtype=float)
    if gold_arr.shape != predicted_arr.shape or gold_arr.ndim != 1 or len(gold_arr) < 2:
        raise ValueError(f"plot_dev_scatter: need two equal-length 1-D sequences of >= 2 values, got "
                         f"{gold_arr.shape} and {predicted_arr.shape}")
    rho = spearmanr(gold_arr, predicted_arr).statistic * 100
    fig, ax = plt.subplots(figsize=(5, 5), dpi=110)
    ax.scatter(gold_arr, predicted_arr, s=6, alpha=0.4, edgecolors="none")
    ax.set(xlabel="gold score", ylabel="predicted similarity", title=f"{title}: Spearman {rho:.2f} (n={len(gold_arr)})")
    ax.grid(alpha=0.3)
    return _save(fig, plt, path)


def plot_dev_by_cycle(curves: dict[tuple[str, str], list[tuple[int, float]]], path: str | os.PathLike,
                      dev_set: str = "stsb_dev", title: str | None = None) -> Path:
    """One chart of every family's dev score per cycle: bi-encoders solid (from cycle 0, the start), cross-encoders
    dashed in the same family's colour. ``curves``: (family, "bi" | "cross") -> [(cycle, score)]."""
    if not any(curves.values()):
        raise ValueError("plot_dev_by_cycle: no dev score to plot")
    plt = _pyplot()
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    families = list(dict.fromkeys(family for family, _ in curves))
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for i, family in enumerate(families):
        for kind, style, marker in (("bi", "-", "o"), ("cross", "--", "s")):
            points = sorted(curves.get((family, kind), []))
            if points:
                cycles, scores = zip(*points)
                ax.plot(cycles, scores, linestyle=style, marker=marker, color=colours[i % len(colours)],
                        label=f"{family} {kind}")
    last = max(cycle for points in curves.values() for cycle, _ in points)
    ax.set(xticks=range(last + 1), xlabel="cycle (0 = the starting checkpoint)", ylabel=f"{dev_set} Spearman x 100",
           title=title or f"{dev_set} per cycle")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, plt, path)


def _save(fig, plt, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
