"""The Trans-Encoder job's family actors (``FamilyActors``) and its progress line (``say``).

``FamilyActors`` makes one bi- and one cross-encoder learner actor per family and remembers which model each actor
holds, so a labeller or an evaluated model is loaded only when the actor holds another. Every part of the job prints
with ``say``. ``frozen_labels`` runs the config's ``teacher`` as a bi-encoder learner that never trains, once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from raydistill.config.job import RoleResources
from raydistill.runtime.tenc.config import TEACHER_LABELLER, FamilyConfig, TencConfig

__all__ = ["FamilyActors", "frozen_labels", "say"]


def say(message: str) -> None:
    """One progress line of the job."""
    print(f"[tenc] {message}", flush=True)


class FamilyActors:
    """The bi- and cross-encoder actor of every family, and which model each one holds (module docstring)."""

    def __init__(self, cfg: TencConfig, pair_set_ref, poolings: dict[str, str | None]):
        import ray

        # Imported here, with torch, when actors are made: a config check or --help does not load torch.
        from raydistill.runtime.tenc.learners import BiEncoderLearner, CrossEncoderLearner

        self.actors: dict[tuple[str, str], Any] = {}
        self.holding: dict[tuple[str, str], str | None] = {}
        learner_classes = {"bi": BiEncoderLearner, "cross": CrossEncoderLearner}
        for family in cfg.families:
            for kind in ("bi", "cross"):
                resources: RoleResources = getattr(cfg.resources, kind)
                # "control": request_stop runs beside a fit in progress (every other method waits its turn).
                actor_class = ray.remote(concurrency_groups={"control": 1})(learner_classes[kind])
                self.actors[(family.name, kind)] = actor_class.options(
                    num_cpus=resources.num_cpus, num_gpus=resources.num_gpus, name=None, max_restarts=0,
                    resources=cfg.resources.families.get(family.name) or None,
                ).remote(family.name, pair_set_ref, **_learner_settings(cfg, family, kind, poolings.get(family.name)))
                self.holding[(family.name, kind)] = None

    def actor(self, family: str, kind: str):
        return self.actors[(family, kind)]

    def load(self, family: str, kind: str, checkpoint: str, cycle: int):
        """A ref to (re)load ``checkpoint`` into the actor, seeded for ``cycle``."""
        self.holding[(family, kind)] = str(checkpoint)
        return self.actor(family, kind).load.remote(str(checkpoint), cycle=cycle)

    def ensure_loaded(self, family: str, kind: str, checkpoint: str, cycle: int):
        """A ref to load ``checkpoint`` unless the actor already holds it (None then); for labelling/evaluation."""
        if self.holding[(family, kind)] == str(checkpoint):
            return None
        return self.load(family, kind, checkpoint, cycle)

    def request_stop(self, kind: str) -> None:
        """Ask every family's ``kind`` learner to stop its ``fit`` at the next step boundary."""
        for (family, actor_kind), actor in self.actors.items():
            if actor_kind == kind:
                actor.request_stop.options(concurrency_group="control").remote()

    def kill(self) -> None:
        import ray

        for actor in self.actors.values():
            ray.kill(actor)


def _learner_settings(cfg: TencConfig, family: FamilyConfig, kind: str, pooling: str | None) -> dict[str, Any]:
    """The settings a family's ``kind`` learner is built with, besides its name and the pair set."""
    resources: RoleResources = getattr(cfg.resources, kind)
    return dict(train=cfg.stage_settings(family, kind), pooling=pooling, label_scaling=cfg.label_scaling,
                seed=cfg.seed, threads=resources.threads, device="cuda" if resources.num_gpus > 0 else "cpu",
                inference_batch_size=resources.batch_size, dev_set=cfg.eval.dev_set,
                data_task_cpus=cfg.resources.data_task_cpus, learners=dataclasses.asdict(cfg.resources.learners))


def frozen_labels(cfg: TencConfig, pair_set_ref, checkpoint: str) -> dict[str, Any]:
    """``teacher``'s labels: its cosine for every pair ([N] float32, pair-set order), its dev score and weight
    fingerprint, as a family's bi-encoder would give them (same pair lengths, dev set and scoring), computed in one Ray
    task with a bi-encoder actor's resources and returned to the driver."""
    import ray

    def label(pair_set) -> dict[str, Any]:
        from raydistill.runtime.tenc.learners import BiEncoderLearner

        teacher = FamilyConfig(name=TEACHER_LABELLER, bi=cfg.teacher)
        learner = BiEncoderLearner(TEACHER_LABELLER, pair_set, **_learner_settings(cfg, teacher, "bi", None))
        learner.load(checkpoint, cycle=0)
        return {"scores": learner.predict_pairs(), "dev": float(learner.dev_score()),
                "fingerprint": learner.fingerprint()}

    task = ray.remote(label).options(num_cpus=cfg.resources.bi.num_cpus, num_gpus=cfg.resources.bi.num_gpus,
                                     max_retries=0)
    return ray.get(task.remote(pair_set_ref))
