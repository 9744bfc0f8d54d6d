"""``run_teacher_pass(cfg)``: only the teacher pass of a job config, its corpus's views into the teacher cache.

Pays the slow part of a distillation job once (a GPU node, a quiet night); every later job with the same teacher,
teacher max length and texts starts on cache hits (``raydistill run teacher_pass --config NAME``).
"""

from __future__ import annotations

from typing import Any

from raydistill.runtime.engine.cluster import init_ray
from raydistill.config.job import JobConfig
from raydistill.runtime.teachers.pipeline import cache_teacher_vectors, load_training_texts
from raydistill.runtime.engine.preflight import preflight

__all__ = ["run_teacher_pass"]


def run_teacher_pass(cfg: JobConfig) -> dict[str, Any]:
    """Only the teacher pass of ``cfg`` (module docstring); stopped part-way, it keeps what it encoded. Returns the
    cache stats."""
    cfg = preflight(cfg)
    if not cfg.data.teacher_views:
        raise cfg._error("data.teacher_views", f"method {cfg.method!r} reads no teacher vectors: nothing to cache")
    rows = load_training_texts(cfg.data, cfg.seed)
    init_ray(cfg)
    _, stats = cache_teacher_vectors(cfg, {view: [row[f"text_{view}"] for row in rows]
                                           for view in cfg.data.teacher_views})
    return {"teacher": cfg.teacher, "corpus": cfg.data.corpus, "rows": len(rows),
            "cache_dir": str(cfg.resolved_cache_dir()), **stats}
