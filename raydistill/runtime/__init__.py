"""The Ray layer of raydistill: config and preflight, cluster, teacher / queue actors, learners on Ray Train, data
pipeline, tracking.

Names are imported on first use, so ``import raydistill.runtime`` stays cheap (Ray, MLflow and matplotlib are heavy
imports that a config check or a CLI ``--help`` should not pay for).

    from raydistill.runtime import JobConfig, init_ray, build_training_data, Tracker
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    # config.py
    "ConfigError": "config", "JobConfig": "config", "DataConfig": "config", "TrainConfig": "config",
    "ResourcesConfig": "config", "RoleResources": "config", "LearnerResources": "config",
    "TrackingConfig": "config",
    # cluster.py
    "init_ray": "cluster", "check_resources": "cluster", "ResourceError": "cluster",
    # teacher.py
    "TeacherSpec": "teacher", "TeacherEncoder": "teacher", "TeacherActor": "teacher", "TeacherEmbed": "teacher",
    "teacher_identity": "teacher",
    # embedding_cache.py
    "EmbeddingCache": "embedding_cache", "ensure_teacher_embeddings": "embedding_cache",
    "TeacherVectors": "embedding_cache",
    # queue_actor.py
    "SharedInstanceQueue": "queue_actor", "SharedQueueActor": "queue_actor", "QueueClient": "queue_actor",
    "create_shared_queue": "queue_actor",
    # pipeline.py
    "TrainingData": "pipeline", "load_training_texts": "pipeline", "build_training_data": "pipeline",
    # tracking.py / plots.py
    "Tracker": "tracking", "plot_learning_curve": "plots", "plot_dev_scatter": "plots",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        module = importlib.import_module(f"raydistill.runtime.{_EXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'raydistill.runtime' has no attribute {name!r}")
