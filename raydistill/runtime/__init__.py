"""The Ray layer of raydistill, by what its parts do:

    teachers/   frozen teachers, the embedding cache, the Ray Data pipeline, the queue actor
    engine/     the training loop on Ray Train, learners, checkpoints, tracking, cluster, preflight, stopping
    jobs/       distillation and its stage data, sentence-transformers' MSE baseline, DvBERT's teachers, the
                teacher pass
    tenc/       Trans-Encoder self- and mutual distillation
    tune/       Ray Tune sweeps
    entry.py    the job scripts' and the CLI's entry points

Each floor imports only the ones listed before it (and ``raydistill.config`` below them all). Names are imported on
first use, so ``import raydistill.runtime`` stays cheap (Ray, MLflow and matplotlib are heavy imports that a config
check or a CLI ``--help`` should not pay for).

    from raydistill.runtime import JobConfig, init_ray, build_training_data, Tracker
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ConfigError": "config.job", "JobConfig": "config.job", "DataConfig": "config.job", "TrainConfig": "config.job",
    "ResourcesConfig": "config.job", "RoleResources": "config.job", "LearnerResources": "config.job",
    "TrackingConfig": "config.job", "init_ray": "runtime.engine.cluster", "check_resources": "runtime.engine.cluster",
    "ResourceError": "runtime.engine.cluster", "TeacherSpec": "runtime.teachers.teacher",
    "TeacherEncoder": "runtime.teachers.teacher", "TeacherEmbed": "runtime.teachers.teacher",
    "teacher_identity": "runtime.teachers.teacher", "EmbeddingCache": "runtime.teachers.embedding_cache",
    "ensure_teacher_embeddings": "runtime.teachers.embedding_cache",
    "TeacherVectors": "runtime.teachers.embedding_cache",
    "SharedInstanceQueue": "methods.shared_queue", "SharedQueueActor": "methods.shared_queue",
    "QueueClient": "methods.shared_queue", "create_shared_queue": "methods.shared_queue",
    "TrainingData": "runtime.teachers.pipeline", "load_training_texts": "runtime.teachers.pipeline",
    "build_training_data": "runtime.teachers.pipeline", "Tracker": "runtime.engine.tracking",
    "plot_learning_curve": "evaluation.plots", "plot_dev_scatter": "evaluation.plots",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        module = importlib.import_module(f"raydistill.{_EXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'raydistill.runtime' has no attribute {name!r}")
