"""The sentence-transformers side of the ``st_mse`` baseline: its student, its targets and its trainer, unchanged.

``build_student`` is the student as sentence-transformers' distillation example builds it (the preset's Transformer
and Pooling, with ``Dense(d_s -> d_t)`` for ``reduction: dense``); ``teacher_targets`` turns the teacher's vectors
into the student's targets (the example's PCA ``Dense`` on the teacher for ``reduction: pca``); ``train_student``
runs ``SentenceTransformerTrainer`` with ``losses.MSELoss`` on (sentence, target) rows and prints the jobs' progress
lines. Works with sentence-transformers before and after 6.x, which moved the modules (``_st_modules``). The job
around it (config, teacher vectors, evaluation, result file) is ``st_mse``.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from raydistill.config.job import ConfigError, JobConfig

__all__ = ["build_student", "embedding_dimension", "target_mse", "teacher_targets", "train_student"]


def _st_modules():
    """``(Transformer, Pooling, Dense, MSELoss)`` of the installed sentence-transformers (6.x moved them)."""
    try:
        from sentence_transformers.sentence_transformer.losses import MSELoss
        from sentence_transformers.sentence_transformer.modules import Dense, Pooling, Transformer
    except ImportError:  # before 6.x
        from sentence_transformers.losses import MSELoss
        from sentence_transformers.models import Dense, Pooling, Transformer
    return Transformer, Pooling, Dense, MSELoss


def build_student(cfg: JobConfig, teacher_dim: int | None = None):
    """The student as the recipe builds it: the preset's Transformer (``data.max_length`` tokens) and Pooling;
    with ``teacher_dim`` a ``Dense(d_s -> teacher_dim)`` on top (sentence-transformers' default tanh)."""
    import torch
    from sentence_transformers import SentenceTransformer

    from raydistill.models import resolve_model
    from raydistill.models.bi_encoder import transformer_directory

    Transformer, Pooling, Dense, _ = _st_modules()
    torch.manual_seed(cfg.seed)  # the Dense layer's initial weights
    word = Transformer(str(transformer_directory(Path(resolve_model(cfg.student)))), max_seq_length=cfg.data.max_length)
    width = embedding_dimension(word)
    modules = [word, Pooling(width, pooling_mode=cfg.student_pooling)]
    if teacher_dim is not None and teacher_dim != width:
        modules.append(Dense(width, teacher_dim))
    device = "cuda" if cfg.resources.learner.num_gpus and torch.cuda.is_available() else "cpu"
    return SentenceTransformer(modules=modules, device=device)


def embedding_dimension(module) -> int:
    """Output width of a SentenceTransformer or its Transformer module (6.x renamed the getters)."""
    for getter in ("get_embedding_dimension", "get_sentence_embedding_dimension", "get_word_embedding_dimension"):
        if hasattr(module, getter):
            return int(getattr(module, getter)())
    raise TypeError(f"{type(module).__name__} reports no embedding dimension")


def teacher_targets(vectors: np.ndarray, student_dim: int, reduction: str, fit_rows: int
                    ) -> tuple[np.ndarray, dict[str, Any]]:
    """The student's targets from the teacher's vectors [N, d_t], and what was done to them: for ``pca`` with a
    narrower student, the example's teacher Dense layer (PCA components, no bias, identity) applied, [N, d_s]; else
    unchanged. ConfigError (``loss.reduction``) for ``pca`` with a wider student: PCA cannot add dimensions."""
    teacher_dim = vectors.shape[1]
    info: dict[str, Any] = {"reduction": "none", "teacher_dim": teacher_dim, "student_dim": student_dim,
                            "target_dim": teacher_dim}
    if student_dim == teacher_dim:
        return vectors, info
    if reduction == "dense":
        return vectors, info | {"reduction": "dense"}
    if student_dim > teacher_dim:
        raise ConfigError(f"field 'loss.reduction': pca reduces the teacher's {teacher_dim} dimensions to the "
                          f"student's, and this student has more ({student_dim}); use reduction: dense")
    import torch
    from sklearn.decomposition import PCA

    _, _, Dense, _ = _st_modules()
    fitted_on = vectors[:fit_rows]
    if len(fitted_on) < student_dim:
        raise ConfigError(f"field 'loss.pca_sentences': PCA to {student_dim} components needs at least "
                          f"{student_dim} teacher vectors; the training data gives {len(fitted_on)}. Train on more "
                          "sentences (data.max_sentences) or use reduction: dense")
    pca = PCA(n_components=student_dim)
    pca.fit(fitted_on)
    dense = Dense(in_features=teacher_dim, out_features=student_dim, bias=False,
                  activation_function=torch.nn.Identity())
    dense.linear.weight = torch.nn.Parameter(torch.tensor(pca.components_, dtype=torch.float32))
    with torch.inference_mode():
        reduced = dense({"sentence_embedding": torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32))})
    targets = reduced["sentence_embedding"].numpy()
    return targets, info | {"reduction": "pca", "target_dim": student_dim, "pca_fit_sentences": len(fitted_on),
                            "pca_explained_variance": round(float(pca.explained_variance_ratio_.sum()), 4)}


def target_mse(student, texts: list[str], targets: np.ndarray, batch_size: int) -> float:
    """``losses.MSELoss``'s value (mean squared difference per element) of the student's vectors, in eval mode."""
    embeddings = student.encode(texts, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)
    return float(np.mean((embeddings - targets) ** 2))


def _trainer_callback(tracker, history: list[dict[str, Any]], cfg: JobConfig):
    """A ``TrainerCallback`` that sends each logged loss to MLflow and prints the jobs' progress line."""
    from transformers import TrainerCallback

    from raydistill.durations import format_duration

    class ReportLosses(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.started = self.last = time.perf_counter()
            self.last_step = 0

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "loss" not in logs:
                return
            now, step = time.perf_counter(), state.global_step
            rate = (step - self.last_step) * cfg.train.batch_size / max(now - self.last, 1e-9)
            metrics = {"loss": float(logs["loss"]), "lr": float(logs.get("learning_rate", 0.0)),
                       "sentences_per_s": rate}
            history.append({"step": step, **metrics})
            tracker.log_metrics(metrics, step=step)
            eta = (state.max_steps - step) * (now - self.started) / max(step, 1)
            epoch = min(max(1, math.ceil(state.epoch or 0)), cfg.train.epochs)  # state.epoch: 1.0 ends epoch 1
            print(f"[{cfg.method}] step {step}/{state.max_steps} ({100 * step / max(1, state.max_steps):.0f}%) "
                  f"ep {epoch}/{cfg.train.epochs} loss {metrics['loss']:.3e} {rate:.0f} sent/s "
                  f"ETA {format_duration(eta)}",
                  flush=True)
            self.last, self.last_step = now, step

    return ReportLosses()


def train_student(student, texts: list[str], targets: np.ndarray, cfg: JobConfig, run_dir: Path, tracker,
           history: list[dict[str, Any]]) -> tuple[int, float]:
    """``SentenceTransformerTrainer`` with ``MSELoss`` on (sentence, label = target) rows; (steps, seconds)."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from transformers import PrinterCallback

    _, _, _, MSELoss = _st_modules()
    train = cfg.train
    dataset = Dataset.from_dict({"sentence": texts, "label": targets.astype(np.float32).tolist()})
    steps_per_epoch = len(texts) // train.batch_size
    log_every = cfg.runtime.log_every or max(1, steps_per_epoch * train.epochs // 50)
    arguments = SentenceTransformerTrainingArguments(
        output_dir=str(run_dir / "trainer"), num_train_epochs=train.epochs,
        max_steps=train.max_steps or -1, per_device_train_batch_size=train.batch_size, learning_rate=train.lr,
        # a float below 1 is a share of the steps (transformers 5; warmup_ratio is deprecated)
        warmup_steps=float(train.warmup_ratio), weight_decay=train.weight_decay, max_grad_norm=train.grad_clip,
        seed=cfg.seed, data_seed=cfg.seed,
        # the distillation jobs' step count: whole batches only
        dataloader_drop_last=True, logging_strategy="steps", logging_steps=log_every, save_strategy="no",
        eval_strategy="no", report_to="none", disable_tqdm=True, use_cpu=student.device.type == "cpu",
        bf16=train.precision == "bf16")
    trainer = SentenceTransformerTrainer(model=student, args=arguments, train_dataset=dataset,
                                         loss=MSELoss(student),
                                         callbacks=[_trainer_callback(tracker, history, cfg)])
    trainer.remove_callback(PrinterCallback)  # its raw log dicts repeat the progress lines ReportLosses prints
    started = time.perf_counter()
    trainer.train()
    with contextlib.suppress(OSError):  # save_strategy "no" leaves the trainer's output_dir empty
        (run_dir / "trainer").rmdir()
    return trainer.state.global_step, time.perf_counter() - started
