"""The learner: one student, its loss module, AdamW, the LR schedule, dev evaluation, best model and checkpoints.

``DistillLearner`` is a plain class (no Ray import at module level). Ray Train runs it: ``train_loop.train_worker``
builds one per Train worker (in the calling process in Train's local mode, ``num_learners: 0``: the driver, or a
Trans-Encoder learner actor), and with several workers ``enable_ddp`` wraps its student and loss in
``DistributedDataParallel`` over the process group Train set up (gloo on CPU, NCCL on GPU).

One optimiser step (the fork of sentence-transformers' ``fit`` that SCT and ConGen share, docs/methods.md):

    features, labels = method.batch_to_features(ctx, batch)     # student forward passes (+ teacher vectors)
    loss = loss_module(features, labels).loss                   # queue updates happen inside, before backward
    loss.backward()  [DDP averages grads over workers]; clip_grad_norm_(1.0); AdamW.step(); scheduler.step()

Optimiser: ``torch.optim.AdamW`` with weight decay 0.01 on every weight matrix and none on biases, LayerNorm weights
and scalars (the learnable temperature), eps 1e-6. The authors' ``transformers.AdamW(correct_bias=False)`` is gone
from recent transformers, and torch always bias-corrects the moments, so the first few hundred updates are somewhat
larger than the authors' (a known, documented deviation: docs/methods.md, SCT).

Schedule: linear warm-up over ``warmup_ratio`` of the *total* steps, then linear decay to 0 at the nominal end;
early stopping does not shorten the schedule (as in the authors' fit loop). With a time budget (``train.budget``:
budget.py) the total is fixed a few dozen steps into the run (``fix_total``) and the schedule ends there.

Model selection: the method's dev score (``MethodSpec.dev_score``: STS-B dev Spearman of the cosine unless the method
says otherwise) every ``eval_every`` steps and at each epoch end; whenever it improves, the student is written to
``<run_dir>/best/`` (a sentence-transformers directory with its projection layer, or a cross-encoder's directory).
That, early stopping and the checkpoints are ``learner_state.LearnerState``, the learner's mix-in.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from raydistill.models.speedups import use_fast_attention_dropout, use_fast_dropout, use_reused_embedding_grad
from raydistill.methods import StepContext, get_method
from raydistill.config.job import JobConfig
from raydistill.runtime.engine.budget import BudgetFactor
from raydistill.runtime.engine.learner_state import BestDev, LearnerState, seed_everything

__all__ = ["DistillLearner", "build_optimizer", "linear_schedule"]

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------------------------
# Optimiser and schedule


def _no_decay(name: str, param: nn.Parameter) -> bool:
    # Biases, LayerNorm gains and scalars (e.g. a learnable temperature) are not weights to shrink.
    lowered = name.lower()
    return param.ndim < 2 or lowered.endswith("bias") or "layernorm" in lowered or "layer_norm" in lowered


def build_optimizer(modules: list[nn.Module], lr: float, weight_decay: float, eps: float = 1e-6,
                    betas: tuple[float, float] = (0.9, 0.999)) -> torch.optim.AdamW:
    """AdamW over the trainable parameters of ``modules``; no decay on biases, LayerNorm and scalars."""
    decay, no_decay, seen = [], [], set()
    for module in modules:
        for name, param in module.named_parameters():
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            (no_decay if _no_decay(name, param) else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    params = decay + no_decay
    # The fused kernel updates each tensor in one pass. The default per-tensor loop allocates temporaries of the
    # parameters' size (sqrt of the second moment, ...) and measured 7-15x slower on CPU: 300-800 ms per step for
    # minilm-l3's 18M parameters on 2 cores against 40 ms fused, i.e. 5-10 % of a ConGen step (bench/train_step.py).
    fused = bool(params) and all(p.is_floating_point() for p in params) and \
        len({p.device.type for p in params}) == 1 and params[0].device.type in ("cpu", "cuda")
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, eps=eps, betas=tuple(betas),
                             fused=fused or None)


def linear_schedule(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int,
                    ) -> torch.optim.lr_scheduler.LambdaLR:
    """lr · step/warmup during warm-up, then lr · (total − step)/(total − warmup), reaching 0 at ``total_steps``."""
    warmup_steps, total_steps = int(warmup_steps), max(1, int(total_steps))

    def factor(step: int) -> float:
        if step < warmup_steps:
            return float(step) / float(max(1, warmup_steps))
        return max(0.0, float(total_steps - step) / float(max(1, total_steps - warmup_steps)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class DistillLearner(LearnerState):
    """Student + loss module + optimiser of one method; trains on numpy batches from ``TrainingData.iter_batches``.

    ``spec``: the method (default ``METHODS[cfg.method]``); ``total_steps``: the whole run's (LR schedule);
    ``teacher_dim``: with a method that projects, a student of another width gets ``projection_dim = teacher_dim``
    (tanh, saved with it); ``run_dir``: for ``best/`` and ``checkpoints/``; ``init_model``: the student's start
    instead of ``cfg.student`` (later stages); ``rank``/``world_size``: only rank 0 evaluates and writes files;
    ``shared_actors``: by hook name, the actors the hooks share (the ``EventRelay``'s), made loss arguments
    (``MethodHook.loss_context``); ``threads``: torch intra-op threads (Ray gives fractional-CPU workers 1);
    ``device``: default cuda when ``cfg.resources.learner.num_gpus > 0`` and available.
    """

    def __init__(self, cfg: JobConfig, spec=None, *, total_steps: int, teacher_dim: int | None = None,
                 run_dir: str | os.PathLike | None = None, init_model: str | None = None, rank: int = 0,
                 world_size: int = 1, shared_actors: dict[str, list] | None = None, threads: int | None = None,
                 device: str | None = None):
        if threads:
            torch.set_num_threads(int(threads))
        _quiet_transformers()
        self.cfg = cfg
        self.spec = spec if spec is not None else get_method(cfg.method)
        self.total_steps = int(total_steps)
        self.teacher_dim = teacher_dim
        self.run_dir = Path(run_dir) if run_dir is not None else cfg.resolved_run_dir()
        self.rank, self.world_size = int(rank), int(world_size)
        if device is None:
            device = "cuda" if cfg.resources.learner.num_gpus > 0 and torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self._ddp: nn.Module | None = None  # DistributedDataParallel over student + loss (enable_ddp)

        # Same seed on every rank: identical initial projection / head weights everywhere.
        seed_everything(cfg.seed)
        self.student = self.spec.build_student(cfg, teacher_dim=teacher_dim, init_model=init_model).to(self.device)
        if self.device.type == "cpu" and cfg.resources.learner.cpu_speedups:
            # The reused sparse embedding gradient is set by a hook after accumulation, behind DDP's back: with
            # several workers the embedding keeps plain dense gradients so DDP averages them like any other.
            _use_cpu_speedups(self.student, sparse_embedding_grad=self.world_size == 1)
        # A cross-encoder student (Trans-Encoder's bi -> cross stage) has scores, no embedding width.
        context = {}
        for hook in self.spec.hooks:
            context.update(hook.loss_context(self.spec, cfg, (shared_actors or {}).get(hook.name, []), teacher_dim))
        self.loss_module = self.spec.build_loss(cfg, student_dim=getattr(self.student, "dim", None),
                                                teacher_dim=teacher_dim, total_steps=self.total_steps, **context)
        if self.device.type != "cpu":  # modules are built on the CPU; moving a no-op there is skipped
            self.loss_module.to(self.device)
        # Different dropout masks per rank, reproducible per (seed, rank).
        seed_everything(cfg.seed + 7919 * self.rank)

        train = cfg.train
        optim = self.spec.optimizer_kwargs(cfg)
        self.optimizer = build_optimizer([self.student, self.loss_module], lr=train.lr,
                                         weight_decay=train.weight_decay, **optim)
        budget = train.budget_limit()
        # A time budget plans its capacity until the measured step rate fixes the total (budget.py).
        self.budget_factor = BudgetFactor(train.warmup_ratio) if budget is not None and budget.seconds else None
        self.seconds_used = 0.0  # wall seconds of training over every (re)start (the train loop counts them)
        if self.budget_factor is not None:
            self.warmup_steps = 0
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.budget_factor)
        else:
            self.warmup_steps = int(train.warmup_ratio * self.total_steps)
            self.scheduler = linear_schedule(self.optimizer, self.warmup_steps, self.total_steps)
        self.step = 0
        self.best = BestDev()
        self.history: list[dict[str, Any]] = []
        self.signals: dict[str, bool] = {}  # the last train_step's signals, agreed by the workers
        self.bucket_tokens = _bucket_tokens(cfg, self.device)
        if cfg.train.precision == "bf16" and self.device.type == "cpu":
            from raydistill.runtime.teachers.teacher import bf16_support

            fast, why = bf16_support()
            if not fast:  # emulated bf16 products run tens of times slower than fp32 (AVX2-only CPUs)
                log.warning("%s: train.precision bf16 on a CPU without hardware bf16 (%s): expect steps many times "
                            "slower than fp32; set train.precision=fp32", self.spec.name, why)

    # ------------------------------------------------------------------------------------------------------------
    # A time budget's total

    @property
    def total_pending(self) -> bool:
        """A time budget whose total is not fixed yet (``total_steps`` is then its capacity)."""
        return self.budget_factor is not None and self.budget_factor.total is None

    def fix_total(self, total: int, at_step: int | None = None) -> None:
        """The run's total steps from here on (a time budget's, once measured; the same on every worker): the LR
        schedule ends at it, and a loss that counts towards the total (DvBERT's teacher annealing) counts to it."""
        total = int(total)
        self.budget_factor.fix(total, self.step if at_step is None else at_step)
        self.total_steps, self.warmup_steps = total, self.budget_factor.warmup_steps
        # The next step's LR from the fixed schedule (LambdaLR computes it at its step; the factor just changed).
        for group, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs):
            group["lr"] = base * self.budget_factor(self.scheduler.last_epoch)
        self.scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]
        for holder in [self.loss_module, *self.loss_module.modules(),
                       *(value for module in self.loss_module.modules() for value in vars(module).values())]:
            if isinstance(getattr(holder, "total_steps", None), int) and not isinstance(holder, DistillLearner):
                holder.total_steps = total

    # ------------------------------------------------------------------------------------------------------------
    # Data-parallel set-up (N Ray Train workers)

    def enable_ddp(self) -> bool:
        """Wrap student + loss in ``DistributedDataParallel`` over Ray Train's process group, after the resume or fresh
        start, so DDP's broadcast from rank 0 starts every worker from the same weights. Buffers are not re-broadcast
        at each forward (a shared queue's mirror already holds the shared content); ``find_unused_parameters``: a
        pooler or unused loss head gets no gradient in some methods."""
        import inspect

        import torch.distributed as dist

        if self.world_size <= 1 or not dist.is_available() or not dist.is_initialized():
            return False
        device_ids = [self.device.index if self.device.index is not None else torch.cuda.current_device()] \
            if self.device.type == "cuda" else None
        ddp = torch.nn.parallel.DistributedDataParallel
        # Newer torch renames broadcast_buffers (and warns on the old name); both keep forwards from syncing them.
        no_buffer_sync = {"forward_sync_buffers": False} if "forward_sync_buffers" in \
            inspect.signature(ddp.__init__).parameters else {"broadcast_buffers": False}
        self._ddp = ddp(_StepModule(self), device_ids=device_ids, find_unused_parameters=True, **no_buffer_sync)
        return True

    def _named_trainable(self) -> list[tuple[str, nn.Parameter]]:
        named, seen = [], set()
        for prefix, module in (("student", self.student), ("loss", self.loss_module)):
            for name, param in module.named_parameters():
                if param.requires_grad and id(param) not in seen:
                    seen.add(id(param))
                    named.append((f"{prefix}.{name}", param))
        return named

    def _forward(self, batch: dict[str, np.ndarray]):
        """Student forward passes and the loss of one batch: ``(loss, parts)``; what DDP's forward runs."""
        ctx = StepContext(student=self.student, loss=self.loss_module, device=self.device, step=self.step,
                          total_steps=self.total_steps, cfg=self.cfg, bucket_tokens=self.bucket_tokens)
        # bf16: the student's matrix products in bfloat16 (2-3x fp32 on AVX512-BF16 CPUs). The loss runs outside
        # autocast: a loss that takes ``precision`` (ConGen) picks its own bf16 products and keeps every softmax
        # in fp32.
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.train.precision == "bf16"):
            features, labels = self.spec.batch_to_features(ctx, batch)
        features = _as_float32(features)
        output = self.loss_module(features, labels)
        return output.loss, output.parts

    def _agree_on_step(self, problem: str | None, signals: dict[str, bool], loss: torch.Tensor,
                       parts: dict[str, Any], crc: int | None) -> tuple[dict[str, bool], float, dict[str, float],
                                                                        list[int] | None]:
        """The step's one control all-reduce of [problem, signals, loss, parts, every rank's batch crc]: signals OR-ed,
        loss and parts averaged, crcs by rank. FloatingPointError on every worker when any has a problem (one that
        raised alone would leave the others waiting in the next collective)."""
        import torch.distributed as dist

        names, part_names = sorted(signals), sorted(parts or {})
        crcs = self.world_size if crc is not None else 0
        values = torch.zeros(1 + len(names) + 1 + len(part_names) + crcs, dtype=torch.float64)
        values[0] = 1.0 if problem else 0.0
        for i, name in enumerate(names):
            values[1 + i] = 1.0 if signals[name] else 0.0
        at = 1 + len(names)
        values[at] = float(loss.detach())
        for i, name in enumerate(part_names):
            values[at + 1 + i] = float(parts[name])
        if crc is not None:
            values[at + 1 + len(part_names) + self.rank] = float(crc)  # < 2**32: exact in float64
        values = values.to(self.device)  # NCCL: on the GPU
        dist.all_reduce(values)
        values = values.cpu()
        if values[0] > 0:
            problems: list[str | None] = [None] * self.world_size
            dist.all_gather_object(problems, problem)  # only on the way out: which worker met what
            raise FloatingPointError(next(f"worker {rank}: {text}" for rank, text in enumerate(problems) if text))
        agreed = {name: bool(values[1 + i] > 0) for i, name in enumerate(names)}
        mean_parts = {name: float(values[at + 1 + i]) / self.world_size for i, name in enumerate(part_names)}
        by_rank = [int(c) for c in values[at + 1 + len(part_names):].tolist()] if crc is not None else None
        return agreed, float(values[at]) / self.world_size, mean_parts, by_rank

    def all_reduce_mean(self, values: dict[str, float]) -> dict[str, float]:
        """``values`` averaged over the workers (the same keys on every worker); unchanged without DDP."""
        if self._ddp is None:
            return dict(values)
        import torch.distributed as dist

        keys = sorted(values)
        summed = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
        dist.all_reduce(summed)
        return {k: float(v) / self.world_size for k, v in zip(keys, summed.tolist())}

    # ------------------------------------------------------------------------------------------------------------
    # Training

    def train_step(self, batch: dict[str, np.ndarray], signals: dict[str, bool] | None = None) -> dict[str, float]:
        """One optimiser step on ``batch``; returns loss, its parts, lr, grad norm and sentences/s.

        With several workers, loss and parts are averaged and ``signals`` (e.g. rank 0's stop request) come back OR-ed
        in ``self.signals``, in the step's one control collective: after backward (DDP's all-reduce needs every worker
        there) and before the optimiser step, which a problem on any worker (non-finite teacher vector or loss) skips
        on all. Alone, ``self.signals`` is ``signals``."""
        started = time.perf_counter()
        problem = _teacher_vector_problem(batch, self.step + 1, self.spec.name)
        if problem and self._ddp is None:
            raise FloatingPointError(problem)
        self.student.train()
        self.loss_module.train()
        # Through DDP when several workers train: its forward arms the gradient all-reduce that backward runs.
        loss, parts = self._ddp(batch) if self._ddp is not None else self._forward(batch)
        if not torch.isfinite(loss):
            problem = problem or (f"{self.spec.name}: loss is {loss.item()} at step {self.step + 1} (parts {parts}); "
                                  f"{self.spec.nonfinite_hint}")
            if self._ddp is None:
                raise FloatingPointError(problem)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        # Which rows this step trained on, kept in the checkpointed history: a resumed run can be checked for
        # replayed or skipped batches (tests/test_faults.py). Only rank 0 writes checkpoints, so with several
        # learners every rank's crc is gathered into rank 0's row.
        crc = zlib.crc32(np.ascontiguousarray(batch["idx"], dtype=np.int64).tobytes()) if "idx" in batch else None
        crcs = None
        loss_value = float(loss.detach())
        parts_values = {k: float(v) for k, v in (parts or {}).items()}
        self.signals = dict(signals or {})
        if self._ddp is not None:
            self.signals, loss_value, parts_values, crcs = self._agree_on_step(problem, self.signals, loss,
                                                                               parts_values, crc)
        params = [param for _, param in self._named_trainable()]
        if self.cfg.train.grad_clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.train.grad_clip)
        else:
            grad_norm = torch.norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
        if not torch.isfinite(grad_norm):
            # A finite loss can still give inf/NaN gradients (an overflow in backward); clipping would spread the
            # NaN into every weight. Stop before the optimiser step: the weights and checkpoints stay finite. The
            # gradients are all-reduced, so every worker stops here.
            bad = [name for name, param in self._named_trainable()
                   if param.grad is not None and not bool(torch.isfinite(param.grad).all())]
            raise FloatingPointError(f"{self.spec.name}: gradient norm is {float(grad_norm)} at step {self.step + 1} "
                                     f"(loss {loss_value:.6g}; non-finite gradients in "
                                     f"{', '.join(bad[:5]) or 'the all-reduced gradients'}); the weights were not "
                                     "updated. Lower train.lr, or check the inputs of this step")
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1

        seconds = time.perf_counter() - started
        rows = len(next(iter(batch.values())))
        sentences = rows * self.spec.student_sentences_per_row
        metrics = {"loss": loss_value, "lr": float(lr), "grad_norm": float(grad_norm),
                   "sentences_per_s": sentences / max(seconds, 1e-9), "step_s": seconds}
        metrics.update({f"loss_{k}": v for k, v in parts_values.items()})
        row = {"step": self.step, **metrics}
        if crc is not None:
            row["batch_crc32"] = crc
            if crcs is not None:
                row["batch_crc32_by_rank"] = crcs
        self.history.append(row)
        return metrics

    def barrier(self) -> None:
        """Wait for every learner (a no-op with one)."""
        import torch.distributed as dist

        if self.world_size > 1 and dist.is_available() and dist.is_initialized():
            dist.barrier()


def _quiet_transformers() -> None:
    # "Writing model shards" bars at every best-model save would bury the progress lines.
    with contextlib.suppress(Exception):  # cosmetic only
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def _as_float32(value):
    """``value`` with every bf16/fp16 tensor (nested in dicts, lists, tuples) cast to fp32; the rest unchanged."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in (torch.bfloat16, torch.float16) else value
    if isinstance(value, dict):
        return {key: _as_float32(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_as_float32(item) for item in value)
    return value


class _StepModule(nn.Module):
    """Student and loss module as one module whose forward is a training step's forward: DDP sees every trainable
    parameter, and the student's several passes of a step (views, length buckets) run inside one DDP forward."""

    def __init__(self, learner: "DistillLearner"):
        super().__init__()
        self.student, self.loss = learner.student, learner.loss_module
        self.__dict__["_learner"] = learner  # not a submodule: the learner is no nn.Module

    def forward(self, batch: dict[str, np.ndarray]):
        return self.__dict__["_learner"]._forward(batch)


def _use_cpu_speedups(student: nn.Module, sparse_embedding_grad: bool = True) -> None:
    """models/speedups.py on a CPU student: the same training with dropout masks from a quarter of the random
    draws (hidden states and attention) and, when ``sparse_embedding_grad``, the word-embedding gradient in one
    reused buffer."""
    use_fast_dropout(student)
    transformer = getattr(student, "transformer", None)
    if transformer is not None:
        use_fast_attention_dropout(transformer)
    if not sparse_embedding_grad:
        return
    embeddings = transformer.get_input_embeddings() if hasattr(transformer, "get_input_embeddings") else None
    if isinstance(embeddings, nn.Embedding):
        use_reused_embedding_grad(embeddings)


def _bucket_tokens(cfg: JobConfig, device: torch.device) -> int | None:
    """Sub-batch size (padded tokens) of the student's training forward: ``extra.bucket_tokens`` (0 = off), else
    ``CPU_TRAIN_BUCKET_TOKENS`` on CPU, where padding costs its full share of every matrix product, and off on GPUs."""
    from raydistill.models.batching import CPU_TRAIN_BUCKET_TOKENS

    configured = cfg.extra.bucket_tokens
    if configured is not None:
        return int(configured) or None
    return CPU_TRAIN_BUCKET_TOKENS if device.type == "cpu" else None


def _teacher_vector_problem(batch: dict[str, np.ndarray], step: int, method: str) -> str | None:
    """Why the run must stop at this step, or None: a NaN/inf teacher vector would train the student towards NaN."""
    for name, column in batch.items():
        if not name.startswith("teacher"):
            continue
        try:
            values = np.stack(column) if isinstance(column, np.ndarray) and column.dtype == object else \
                np.asarray(column)
        except (ValueError, TypeError):  # ragged or non-numeric: not vectors
            continue
        if values.dtype.kind == "f" and len(values) and not np.isfinite(values).all():
            rows = np.flatnonzero(~np.isfinite(values.reshape(len(values), -1)).all(axis=1))
            return (f"{method}: non-finite teacher vectors in column {name} at step {step} ({len(rows)} of "
                    f"{len(values)} rows, first at row {int(rows[0])}); the run stopped before training on them. "
                    "Re-run to resume: the teacher cache recomputes non-finite vectors it holds")
    return None
