"""Does the training code run on a CUDA GPU by configuration alone? A short, pure-torch check for a lent GPU machine.

    python bench/gpu_check.py [--device cuda|cpu] [--write PATH] [--quick] [--simulate-no-ray] [--budget-s S]
    python bench/gpu_check.py --write $OUT/gpu-check.json         # on a lent GPU machine: about 1.5-2 minutes
    python bench/gpu_check.py --device cpu --quick --simulate-no-ray   # the dry run here

Runs on ``--device`` (default: cuda when available) with tiny random models only (``tests/tiny_models.py``: no
weights, no hub, no Ray needed), each check in fp32 and in bf16 autocast:

1. ``objectives``: every objective of ``raydistill/objectives`` trains a tiny BiEncoder / CrossEncoder student for a
   few epochs over the same batches. Passes when every loss is finite, the last epoch's mean loss is below the first
   epoch's, and no op inside the loss's forward touches a tensor off the model's device (``DeviceAudit``: a CPU
   tensor mixed into CUDA work either raises or silently syncs; both are the bug class this check exists for).
2. ``learner``: ``DistillLearner.train_step`` for every method, the device chosen by the config
   (``resources.learner.num_gpus``), not passed in; ``tenc``: Trans-Encoder's bi and cross ``StageLearner.fit``
   (labels from the other learner's ``predict_pairs``, read from memory instead of Ray Data).
3. ``timing``: steps/s of a ConGen step (6-layer width-384 BERT, batch 64, length 32, K 16384) on the device in fp32
   and bf16, and 3 fp32 steps on the CPU (a ratio: the CPU is that machine's).

A check whose imports fail (no Ray, pydantic or mlflow there) is reported as skipped with the reason, and the others
run. So far it has run only on CPUs (``--device cpu``, with and without Ray): no GPU result is committed yet. The JSON (``--write``) is rewritten after every check, so a run killed by its time limit keeps what it did.
Exit status: 0 when every check that ran passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import io
import math
import platform
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

STARTED = time.perf_counter()
BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:  # also when started through runpy (the no-Ray simulation)
    sys.path.insert(0, str(BENCH))

TEACHER_DIM = 48  # tiny teacher wider than the 32-wide student, so projecting methods get their projection layer
PRECISIONS = ("fp32", "bf16")
JSON_ONLY = ("traceback", "log_tail", "first_step_off_device_elsewhere", "first_step_from_host")  # not printed
# Looked up, not imported: importing Ray and MLflow costs tens of seconds, and the code imports them lazily anyway.
OPTIONAL = ("ray", "mlflow", "sentence_transformers")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")
    parser.add_argument("--write", default=None, help="JSON result file")
    parser.add_argument("--quick", action="store_true", help="fewer steps and a small timing shape (CPU dry runs)")
    parser.add_argument("--checks", default="objectives,learner,tenc,timing", help="comma-separated subset")
    parser.add_argument("--precisions", default=",".join(PRECISIONS), help="comma-separated subset of fp32,bf16")
    parser.add_argument("--simulate-no-ray", action="store_true", help="import as if Ray were not installed")
    parser.add_argument("--simulate-missing", default="", help="comma-separated modules to hide (e.g. pydantic)")
    parser.add_argument("--budget-s", type=float, default=150.0,
                        help="checks not started by then are skipped (the device run has a hard limit)")
    args = parser.parse_args(argv)
    unknown = set(args.precisions.split(",")) - set(PRECISIONS)
    if unknown:
        parser.error(f"--precisions: unknown {sorted(unknown)}; choose from {', '.join(PRECISIONS)}")
    return args


# ----------------------------------------------------------------------------------------------------------------
# Device audit


def device_audit_class():
    """``DeviceAudit(device)``: a dispatch mode that counts the aten calls that touch a tensor off ``device``
    (``off_device``), and apart from those the tensors made from host data on the CPU (``host_data``: what
    ``torch.tensor`` without ``device=`` makes, e.g. a tokenizer's ids) and the copies from the host to ``device``
    (``host_copies``). Each count is keyed ``"<op> @ <file>:<line>"``, the innermost caller outside torch, so a
    finding names the line that made the tensor; ``ours(counter)`` keeps the ones made by raydistill's code.
    None where torch lacks dispatch modes."""
    try:
        import torch
        from torch.utils._pytree import tree_flatten
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError:
        return None

    copies = {"aten._to_copy", "aten.copy_", "aten.to"}
    from_host = {"aten.lift_fresh", "aten.lift_fresh_copy", "aten.lift"}
    torch_dir = str(Path(torch.__file__).resolve().parent)
    root = BENCH.parent

    def origin() -> str:
        frame = sys._getframe(2)
        while frame is not None and (frame.f_code.co_filename.startswith(torch_dir)
                                     or frame.f_code.co_filename.startswith("<")):
            frame = frame.f_back
        if frame is None:
            return "?"
        path = Path(frame.f_code.co_filename)
        try:
            shown = str(path.resolve().relative_to(root))
        except ValueError:  # a library: its package-relative path
            shown = "/".join(path.parts[-3:])
        return f"{shown}:{frame.f_lineno}"

    class DeviceAudit(TorchDispatchMode):
        def __init__(self, device):
            super().__init__()
            self.device = torch.device(device).type
            self.off_device: Counter = Counter()
            self.host_data: Counter = Counter()
            self.host_copies: Counter = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = str(func.overloadpacket)
            inputs = {t.device.type for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
            outputs = {t.device.type for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)}
            foreign = (inputs | outputs) - {self.device}
            if not foreign:
                return out
            if name in copies and outputs <= {self.device}:
                counter = self.host_copies
            elif name in from_host and foreign <= {"cpu"}:
                counter = self.host_data
            else:
                counter = self.off_device
            counter[f"{name} @ {origin()}"] += 1
            return out

        @staticmethod
        def ours(counter: Counter) -> dict[str, int]:
            return {k: v for k, v in counter.items() if " @ raydistill/" in k}

    return DeviceAudit


# ----------------------------------------------------------------------------------------------------------------
# Result bookkeeping


class Report:
    """Every check's outcome, printed as it lands and written (whole) after each one."""

    def __init__(self, args: argparse.Namespace, record: dict[str, Any]):
        self.args, self.record = args, record
        record["checks"] = {}

    def elapsed(self) -> float:  # since the process started: the device run's limit counts the imports too
        return time.perf_counter() - STARTED

    def add(self, group: str, name: str, status: str, **details) -> None:
        entry = {"status": status, **details}
        self.record["checks"].setdefault(group, {})[name] = entry
        shown = " ".join(f"{k}={_short(v)}" for k, v in details.items() if k not in JSON_ONLY)
        print(f"  [{status:7}] {group}/{name} {shown}", flush=True)
        if status == "error" and details.get("traceback"):
            print("    " + details["traceback"].strip().replace("\n", "\n    "), flush=True)

    def over_budget(self) -> bool:
        return self.elapsed() > self.args.budget_s

    def write(self) -> None:
        statuses = [c["status"] for group in self.record["checks"].values() for c in group.values()]
        self.record.update(passed=all(s in ("pass", "skipped") for s in statuses),
                           counts=dict(Counter(statuses)), wall_s=round(self.elapsed(), 1))
        if self.args.write:
            from raydistill.fileio import atomic_write_json

            path = Path(self.args.write)
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, self.record, default=str)


def _short(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_short(v)}" for k, v in value.items()) + "}"
    return str(value)


def _error_details(exc: BaseException) -> dict[str, Any]:
    return {"error": f"{type(exc).__name__}: {exc}"[:500], "traceback": "".join(traceback.format_exc(limit=-6))}


def guarded(report: Report, group: str, name: str, body: Callable[[], dict[str, Any]]) -> None:
    """Run one case; its dict says ``status`` (pass/fail) and the numbers; an exception is an ``error``."""
    if report.over_budget():
        report.add(group, name, "skipped", reason=f"time budget {report.args.budget_s:.0f} s spent")
        return
    started = time.perf_counter()
    try:
        result = body()
    except Exception as exc:  # noqa: BLE001 - one broken case must not hide the others
        report.add(group, name, "error", wall_s=round(time.perf_counter() - started, 2), **_error_details(exc))
        return
    status = result.pop("status")
    report.add(group, name, status, wall_s=round(time.perf_counter() - started, 2), **result)


def probe_imports() -> dict[str, str]:
    """``module -> version`` or ``"MISSING: why"`` for what the checks may need."""
    from importlib import metadata, util

    found = {}
    for name in OPTIONAL:
        try:
            if util.find_spec(name) is None:
                raise ModuleNotFoundError(f"No module named {name!r}")
            found[name] = metadata.version(name.replace("_", "-"))
        except Exception as exc:  # noqa: BLE001 - ValueError where a simulation set sys.modules[name] = None
            found[name] = f"MISSING: {type(exc).__name__}: {exc}"[:300]
    for name in ("torch", "transformers", "tokenizers", "pydantic", "raydistill.objectives", "raydistill.models",
                 "raydistill.methods", "raydistill.runtime.engine.learner", "raydistill.runtime.tenc.learners",
                 "tests.tiny_models"):
        try:
            module = importlib.import_module(name)
            found[name] = str(getattr(module, "__version__", "ok"))
        except Exception as exc:  # noqa: BLE001 - anything an import raises means "not usable here"
            found[name] = f"MISSING: {type(exc).__name__}: {exc}"[:300]
    return found


def missing(imports: dict[str, str], *names: str) -> str | None:
    bad = [f"{n} ({imports[n][9:]})" for n in names if imports.get(n, "MISSING").startswith("MISSING")]
    return "cannot import " + "; ".join(bad) if bad else None


# ----------------------------------------------------------------------------------------------------------------
# Shared fixtures: tiny models, sentences, teacher vectors


@dataclass
class Setup:
    device: Any  # torch.device
    tmp: Path
    sentences: list[str]
    student_dir: Path  # tiny BERT, width 32
    teacher_dir: Path  # tiny MPNet, width TEACHER_DIM
    batch: int
    batches: int
    epochs: int
    precisions: tuple[str, ...]

    @property
    def rows(self) -> int:
        return self.batch * self.batches


def build_setup(device, tmp: Path, quick: bool, precisions: tuple[str, ...]) -> Setup:
    from tests.tiny_models import load_real_sentences, make_tiny_model

    sentences = load_real_sentences()
    student = make_tiny_model("bert", tmp / "bert", sentences)
    teacher = make_tiny_model("mpnet", tmp / "teacher", sentences, hidden=TEACHER_DIM, intermediate=2 * TEACHER_DIM,
                              seed=1)
    batch, batches, epochs = (16, 3, 4) if quick else (32, 4, 6)
    return Setup(device, tmp, sentences, student, teacher, batch, batches, epochs, precisions)


def autocast(device, precision: str):
    import torch

    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def as_float32(value):
    """bf16 tensors (in dicts, lists, tuples) as fp32: what the learner hands a loss after the autocast student."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in (torch.bfloat16, torch.float16) else value
    if isinstance(value, dict):
        return {k: as_float32(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(as_float32(v) for v in value)
    return value


def off_device_of(modules, device) -> list[str]:
    """Names of parameters / buffers of ``modules`` (name -> nn.Module) that are not on ``device``."""
    return [f"{owner}.{name}" for owner, module in modules.items()
            for name, tensor in [*module.named_parameters(), *module.named_buffers()]
            if tensor.device.type != device.type][:10]


# ----------------------------------------------------------------------------------------------------------------
# 1. Objectives


@dataclass
class Case:
    model: Any  # the student (nn.Module), trained
    loss: Any  # the loss module, trained with it
    features: Callable[[int], tuple]  # batch index -> (features, labels); runs the student (inside autocast)
    track: tuple[str, ...] = ()  # sum these parts instead of the loss (a loss with a moving self-target)
    loss_in_autocast: bool = False  # Trans-Encoder's learners run their loss under autocast too


def objective_cases(s: Setup) -> dict[str, Callable[[str], Case]]:
    """name -> builder of the case in a precision, all on ``s.device`` over the same ``s.rows`` training rows."""
    import numpy as np
    import torch

    from raydistill.augment import make_views
    from raydistill.data import load_dataset
    from raydistill.models import BiEncoder, CrossEncoder
    from raydistill import objectives as o
    from raydistill.objectives.cosine import CosineDistillLoss

    device, n, batch = s.device, s.rows, s.batch
    order = np.random.default_rng(0).permutation(len(s.sentences))
    train = [s.sentences[i] for i in order[:n]]
    view = make_views(train, "delete:0.2", seed=0)
    teacher = BiEncoder.from_pretrained(str(s.teacher_dir), max_length=32).to(device)
    vec = lambda texts: torch.tensor(teacher.encode(texts, batch_size=128, normalize=True), device=device)  # noqa: E731
    teacher_a, teacher_b = vec(train), vec(view)
    groups = torch.arange(n, device=device)  # one group per row: a row's own queued teacher vector is no negative
    stsb = [(p.sentence1, p.sentence2) for p in load_dataset("stsb_train")[:n]]
    pair_cos = (vec([a for a, _ in stsb]) * vec([b for _, b in stsb])).sum(dim=1)
    pair_targets = torch.as_tensor(o.cosine_to_target(pair_cos.cpu().numpy(), "clip"), dtype=torch.float32,
                                   device=device)

    def rows(b: int) -> slice:
        return slice(b * batch, (b + 1) * batch)

    def tokens(model, items) -> list[dict]:  # tokenised once per batch, on the device (the runtime does it per step)
        return [{k: v.to(device) for k, v in model.tokenize(items[rows(b)]).items()} for b in range(s.batches)]

    def student(project: bool):
        torch.manual_seed(0)
        return BiEncoder.from_pretrained(str(s.student_dir), projection_dim=TEACHER_DIM if project else None,
                                         max_length=32).to(device)

    def loss(cls, precision, **kwargs):
        if "precision" in inspect.signature(cls).parameters:  # ConGen picks its own bf16 products
            kwargs["precision"] = precision
        return cls(**kwargs).to(device)

    def queued(module, *vectors):  # full queues of the training rows' teacher vectors from the first step
        queues = [module.queue] if hasattr(module, "queue") else [module.queue_a, module.queue_b]
        for queue, v in zip(queues, vectors):
            queue.init_from(v, groups)
        return module

    def congen(precision):
        m = student(True)
        t, tv = tokens(m, train), tokens(m, view)
        module = queued(loss(o.ConGenLoss, precision, queue_size=n, dim=TEACHER_DIM), teacher_a)
        return Case(m, module, lambda b: ({"student_control": m(t[b]), "student_generalize": m(tv[b]),
                                           "teacher": teacher_a[rows(b)], "group": groups[rows(b)]}, None))

    def ckd(precision):
        m = student(True)
        t = tokens(m, train)
        module = queued(loss(o.CKDLoss, precision, queue_size=n, dim=TEACHER_DIM), teacher_a)
        return Case(m, module, lambda b: ({"student": m(t[b]), "teacher": teacher_a[rows(b)],
                                           "group": groups[rows(b)]}, None))

    def with_reference(m, t, tv, b):
        with torch.no_grad():  # the reference pass: the same student again, dropout on
            return m(t[b]), m(tv[b])

    def sct(precision):
        m = student(False)
        t, tv = tokens(m, train), tokens(m, view)

        def features(b):
            ref_a, ref_b = with_reference(m, t, tv, b)
            return {"online_a": m(t[b]), "online_b": m(tv[b]), "reference_a": ref_a, "reference_b": ref_b,
                    "group": groups[rows(b)]}, None
        return Case(m, loss(o.SCTLoss, precision, queue_size=n, dim=m.dim), features)

    def sct_distill(precision):
        m = student(True)
        t, tv = tokens(m, train), tokens(m, view)

        def features(b):
            ref_a, ref_b = with_reference(m, t, tv, b)
            return {"student_a": m(t[b]), "student_b": m(tv[b]), "teacher_a": teacher_a[rows(b)],
                    "teacher_b": teacher_b[rows(b)], "reference_a": ref_a, "reference_b": ref_b,
                    "group": groups[rows(b)]}, None
        module = loss(o.SCTDistillLoss, precision, queue_size=n, dim=TEACHER_DIM, objective="joint",
                      projector_expansion=2)
        # The L_SCT half chases the student's own moving reference vectors: only the distillation half must fall.
        return Case(m, queued(module, teacher_a, teacher_b), features, track=("cd_a", "cd_b"))

    def to_teacher(cls):
        def build(precision):
            m = student(True)
            t = tokens(m, train)
            return Case(m, loss(cls, precision), lambda b: ({"student": m(t[b]), "teacher": teacher_a[rows(b)]},
                                                            None))
        return build

    def simcse(precision):
        m = student(False)
        t = tokens(m, train)
        return Case(m, loss(o.SimCSELoss, precision, tau=0.05),
                    lambda b: ({"first": m(t[b]), "second": m(t[b])}, None))

    def simcse_sup(precision):
        triplets = o.load_nli_triplets(("snli_dev",))[:n]
        m = student(False)
        anchor, positive, negative = (tokens(m, [row[i] for row in triplets]) for i in range(3))
        return Case(m, loss(o.SupervisedSimCSELoss, precision, tau=0.05), lambda b: (
            {"anchor": m(anchor[b]), "positive": m(positive[b]), "negative": m(negative[b])}, None))

    def dvbert(precision):
        pairs = [(p.sentence1, p.sentence2) for p in load_dataset("snli_dev")[:n]]
        gold = torch.tensor([("entailment", "neutral", "contradiction").index(p.label)
                             for p in load_dataset("snli_dev")[:n]], device=device)
        torch.manual_seed(2)
        judge = CrossEncoder.from_pretrained(str(s.student_dir), num_labels=3).to(device)  # a tiny NLI "teacher"
        logits = torch.tensor(judge.score(pairs, activation=None), device=device)[:, None, :]  # [N, 1, 3]
        m = student(False)
        first, second = tokens(m, [a for a, _ in pairs]), tokens(m, [b for _, b in pairs])
        # λ stays small over these steps: the target is mostly the teacher's (annealing is unit-tested).
        module = loss(o.DvBERTLoss, precision, dim=m.dim, total_steps=10 * s.batches * s.epochs)
        return Case(m, module, lambda b: ({"u": m(first[b]), "v": m(second[b]), "teacher_logits": logits[rows(b)]},
                                          gold[rows(b)]))

    def soft_bce(precision):
        torch.manual_seed(0)
        m = CrossEncoder.from_pretrained(str(s.student_dir), num_labels=1, max_length=32).to(device).train()
        t = tokens(m, stsb)
        return Case(m, loss(o.SoftBCELoss, precision), lambda b: ({"logits": m(t[b])}, pair_targets[rows(b)]),
                    loss_in_autocast=True)

    def cosine_mse(precision):
        m = student(False)
        first, second = tokens(m, [a for a, _ in stsb]), tokens(m, [b for _, b in stsb])
        return Case(m, loss(o.CosineMSELoss, precision), lambda b: ({"u": m(first[b]), "v": m(second[b])},
                                                         pair_targets[rows(b)]), loss_in_autocast=True)

    return {"congen": congen, "ckd": ckd, "sct": sct, "sct-distill": sct_distill,
            "l2": to_teacher(o.L2DistillLoss), "cosine": to_teacher(CosineDistillLoss), "simcse": simcse,
            "simcse-sup": simcse_sup, "dvbert": dvbert, "tenc-soft-bce": soft_bce, "tenc-cosine-mse": cosine_mse}


def train_case(case: Case, s: Setup, precision: str, audit_cls) -> dict[str, Any]:
    """AdamW over student + loss for ``s.epochs`` epochs of the same batches; the epoch means and the audit."""
    import torch

    torch.manual_seed(1)
    params = list(case.model.parameters()) + list(case.loss.parameters())
    optimizer = torch.optim.AdamW(params, lr=5e-3)
    case.model.train()
    case.loss.train()
    audit = audit_cls(s.device) if audit_cls else contextlib.nullcontext()
    per_epoch, nonfinite = [], 0
    for _ in range(s.epochs):
        values = []
        for b in range(s.batches):
            with autocast(s.device, precision):
                features, labels = case.features(b)
                if case.loss_in_autocast:
                    with audit:
                        output = case.loss(features, labels)
            if not case.loss_in_autocast:
                with audit:
                    output = case.loss(as_float32(features), labels)
            nonfinite += not bool(torch.isfinite(output.loss))
            optimizer.zero_grad(set_to_none=True)
            output.loss.backward()
            optimizer.step()
            values.append(sum(output.parts[k] for k in case.track) if case.track else float(output.loss.detach()))
        per_epoch.append(sum(values) / len(values))
    first, last = per_epoch[0], per_epoch[-1]
    # Inside a loss even a host tensor copied over is a finding: its inputs are all on the device already.
    off = {**audit.off_device, **audit.host_data, **audit.host_copies} if audit_cls else None
    placement = off_device_of({"student": case.model, "loss": case.loss}, s.device)
    problems = [p for p, bad in (("non-finite loss", nonfinite), ("loss did not fall", not last < first),
                                 (f"ops in the loss off {s.device.type} or from the host: {off}", off),
                                 (f"off-device state: {placement}", placement)) if bad]
    return {"status": "fail" if problems else "pass", "loss_first_epoch": first, "loss_last_epoch": last,
            "steps": s.epochs * s.batches, **({"problems": problems} if problems else {}),
            **({"tracked": list(case.track)} if case.track else {})}


def check_objectives(report: Report, s: Setup, imports: dict[str, str], audit_cls) -> None:
    why = missing(imports, "raydistill.objectives", "raydistill.models", "tests.tiny_models")
    if why:
        report.add("objectives", "all", "skipped", reason=why)
        return
    try:
        builders = objective_cases(s)
    except Exception as exc:  # noqa: BLE001 - the other checks still run
        report.add("objectives", "setup", "error", **_error_details(exc))
        return
    for precision in s.precisions:
        for name, build in builders.items():
            guarded(report, "objectives", f"{name}-{precision}",
                    lambda build=build: train_case(build(precision), s, precision, audit_cls))
        report.write()


# ----------------------------------------------------------------------------------------------------------------
# 2. The engine's learner and Trans-Encoder's stage learners


def method_batches(spec, cfg, s: Setup, teacher, texts: list[str], view: list[str]) -> list[dict[str, Any]] | None:
    """The numpy batches ``TrainingData.iter_batches`` would hand this method (None: a dataset not built here)."""
    import numpy as np

    from raydistill.data import load_dataset

    n, rows = len(texts), np.arange(len(texts))
    text = lambda items: np.array(list(items), dtype=object)  # noqa: E731
    if spec.reads_corpus:
        views = {name: texts if i == 0 else view for i, name in enumerate(cfg.data.views)}
        columns = {f"text_{name}": text(v) for name, v in views.items()}
        columns.update({f"teacher_{name}": teacher.encode(views[name], normalize=True)
                        for name in spec.teacher_views_of(cfg)})
        columns["group"] = rows.astype(np.int64)
    elif spec.dataset in ("nli_teacher_labels", "stsb_train"):
        pairs = load_dataset("snli_dev" if spec.dataset == "nli_teacher_labels" else "stsb_train")[:n]
        columns = {"text_a": text(p.sentence1 for p in pairs), "text_b": text(p.sentence2 for p in pairs)}
        if spec.dataset == "stsb_train":
            columns["score"] = np.array([p.score / 5.0 for p in pairs], dtype=np.float32)
        else:
            columns["label"] = np.array([("entailment", "neutral", "contradiction").index(p.label) for p in pairs])
            columns["teacher_probs"] = np.random.default_rng(0).dirichlet(np.ones(3), size=n).astype(np.float32)
    elif spec.dataset == "nli_triplets":
        from raydistill.objectives import load_nli_triplets

        triplets = load_nli_triplets(("snli_dev",))[:n]
        columns = {f"text_{key}": text(t[i] for t in triplets) for i, key in
                   enumerate(("anchor", "positive", "negative"))}
    else:
        return None
    columns["idx"] = rows.astype(np.int64)
    return [{k: v[i:i + s.batch] for k, v in columns.items()} for i in range(0, n, s.batch)]


def learner_case(name: str, precision: str, s: Setup, teacher, texts, view, audit_cls) -> dict[str, Any]:
    import numpy as np
    import torch

    from raydistill.config.job import JobConfig
    from raydistill.methods import METHODS, validate_method
    from raydistill.data.arrays import ArrayData
    from raydistill.runtime.engine.learner import DistillLearner

    spec = METHODS[name]
    uses_teacher = spec.needs_teacher or bool(spec.teacher_views)
    d = {"method": name, "student": str(s.student_dir), "run_dir": str(s.tmp / "runs" / f"{name}-{precision}"),
         "data": {"max_length": 32},
         "train": {"batch_size": s.batch, "lr": 2e-3, "warmup_ratio": 0.0, "epochs": 1, "precision": precision},
         "tracking": {"enabled": False},
         # The point of the check: the GPU comes from the config, as a job's learner gets it.
         "resources": {"learner": {"num_gpus": 1 if s.device.type == "cuda" else 0}}}
    if uses_teacher:
        d["teacher"] = str(s.teacher_dir)
    if "queue_size" in spec.allowed_loss_keys():
        d["loss"] = {"queue_size": 4 * s.batch}
    cfg = validate_method(JobConfig.from_dict(d))
    batches = method_batches(spec, cfg, s, teacher, texts, view)
    if batches is None:
        return {"status": "skipped", "reason": f"dataset {spec.dataset!r} not built by this check"}
    rounds = 2
    learner = DistillLearner(cfg, total_steps=rounds * len(batches), teacher_dim=TEACHER_DIM if uses_teacher else None,
                             run_dir=s.tmp / "runs" / f"{name}-{precision}")
    if learner.device.type != s.device.type:
        return {"status": "fail", "problems": [f"config put the learner on {learner.device}, not {s.device.type}"]}
    # A fresh start as the engine makes one: each hook's sample drawn from the check's rows, applied to the learner.
    rows = ArrayData({key: np.concatenate([np.asarray(b[key]) for b in batches]) for key in batches[0]})
    for hook in spec.hooks:
        hook.at_fresh_start(learner, hook.fresh_start_sample(spec, cfg, rows, None))
    audit = audit_cls(s.device) if audit_cls else None
    if audit is not None:  # the first step's forward (student passes, batch -> tensors, loss) under the audit
        forward = learner._forward

        def audited(batch):
            del learner._forward  # later steps: the class's own method again
            with audit:
                return forward(batch)
        learner._forward = audited
    losses = [learner.train_step(batch)["loss"] for _ in range(rounds) for batch in batches]
    placement = off_device_of({"student": learner.student, "loss": learner.loss_module}, s.device)
    placement += [f"optimizer.{k}" for group in learner.optimizer.state.values() for k, v in group.items()
                  if isinstance(v, torch.Tensor) and v.device.type != s.device.type and v.dim() > 0][:5]
    off = audit.ours(audit.off_device) if audit else None
    problems = [p for p, bad in (("non-finite loss", not all(math.isfinite(x) for x in losses)),
                                 (f"raydistill ops off {s.device.type} in the first step's forward: {off}", off),
                                 (f"off-device state: {placement}", placement)) if bad]
    result = {"status": "fail" if problems else "pass", "device": str(learner.device), "steps": len(losses),
              "loss_first": losses[0], "loss_last": losses[-1], **({"problems": problems} if problems else {})}
    if audit is not None:  # for the record: libraries' own off-device ops, and the host data a step brings over
        # (tokenising makes the ids on the host and copies them over: expected)
        result["first_step_off_device_elsewhere"] = {k: v for k, v in audit.off_device.items() if k not in off}
        result["first_step_from_host"] = {**audit.host_data, **audit.host_copies}
    return result


def check_learner(report: Report, s: Setup, imports: dict[str, str], audit_cls) -> None:
    why = missing(imports, "raydistill.runtime.engine.learner", "raydistill.methods", "tests.tiny_models")
    if why:
        report.add("learner", "all", "skipped", reason=why)
        return
    from raydistill.augment import make_views
    from raydistill.methods import METHODS
    from raydistill.models import BiEncoder

    teacher = BiEncoder.from_pretrained(str(s.teacher_dir), max_length=32).to(s.device)
    texts = s.sentences[:4 * s.batch]
    view = make_views(texts, "delete:0.2", seed=0)
    for precision in s.precisions:
        for name in METHODS:
            guarded(report, "learner", f"{name}-{precision}",
                    lambda name=name: learner_case(name, precision, s, teacher, texts, view, audit_cls))
        report.write()


def tenc_case(precision: str, s: Setup, pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """bi labels the pairs -> cross fits them -> cross labels the pairs -> bi fits those, as one Trans-Encoder cycle."""
    import numpy as np

    from raydistill.runtime.tenc import learners as tl
    from raydistill.runtime.tenc.pairs import PairSet

    first, second = [a for a, _ in pairs], [b for _, b in pairs]
    pair_set = PairSet(pair_id=np.arange(len(pairs), dtype=np.int64), sentence1=tuple(first), sentence2=tuple(second),
                       source="memory", pool_size=len(pairs))
    train = {"batch_size": s.batch, "lr": 2e-3, "epochs": s.epochs, "max_steps": None, "max_length": 32,
             "warmup_ratio": 0.1, "weight_decay": 0.01, "grad_clip": 1.0, "eval_every": 10**6,
             "amp": precision == "bf16", "precision": precision, "head": "classifier"}
    common = dict(label_scaling="clip", seed=0, threads=None, device=s.device.type, dev_set="sick_trial")
    bi, cross = tl.BiEncoderLearner("bert", pair_set, train, **common), tl.CrossEncoderLearner("bert", pair_set, train,
                                                                                                **common)
    out, log = {}, io.StringIO()
    with contextlib.redirect_stdout(log):
        for learner in (bi, cross):
            learner.load(str(s.student_dir), cycle=0)
        for learner, teacher in ((cross, bi), (bi, cross)):
            labels = teacher.predict_pairs()
            learner.training_rows = lambda labels_dir, column, labels=labels: (first, second, labels)
            summary = learner.fit("<in memory>", "score_bert", cycle=1, stage=f"{teacher.kind}->{learner.kind}",
                                  out_dir=str(s.tmp / "tenc" / f"{learner.kind}-{precision}"))
            losses = [h["loss"] for h in summary["history"] if "loss" in h]
            per_epoch = math.ceil(summary["examples"] / s.batch)
            out[learner.kind] = {"loss_first_epoch": float(np.mean(losses[:per_epoch])),
                                 "loss_last_epoch": float(np.mean(losses[-per_epoch:])), "steps": summary["steps"],
                                 "best_dev": summary["best_dev"], "precision": learner.precision,
                                 "off_device": off_device_of({"model": learner.model}, s.device)}
    problems = [f"{kind}: {p}" for kind, r in out.items() for p, bad in (
        ("non-finite loss", not all(map(math.isfinite, (r["loss_first_epoch"], r["loss_last_epoch"])))),
        ("loss did not fall", not r["loss_last_epoch"] < r["loss_first_epoch"]),
        (f"model off {s.device.type}: {r['off_device']}", r["off_device"])) if bad]
    return {"status": "fail" if problems else "pass", **out, **({"problems": problems} if problems else {}),
            "log_tail": log.getvalue().strip().splitlines()[-3:]}


def check_tenc(report: Report, s: Setup, imports: dict[str, str]) -> None:
    why = missing(imports, "raydistill.runtime.tenc.learners", "tests.tiny_models")
    if why:
        report.add("tenc", "all", "skipped", reason=why)
        return
    from raydistill.data import load_dataset
    from raydistill.runtime.tenc import learners as tl

    report.record["notes"].append("tenc: each fit reads its label set from memory (training_rows replaced), not "
                                  "through Ray Data")
    if imports["ray"].startswith("MISSING"):
        # fit records which Ray node trained the stage; without Ray there is none.
        tl._ray_node_id = lambda: None
        report.record["notes"].append("tenc: fit's Ray node id stubbed to None (Ray is not importable)")
    pairs = [(p.sentence1, p.sentence2) for p in load_dataset("stsb_train")[:s.rows]]
    for precision in s.precisions:
        guarded(report, "tenc", f"bi+cross-{precision}", lambda: tenc_case(precision, s, pairs))
    report.write()


# ----------------------------------------------------------------------------------------------------------------
# 3. Timing


def congen_step_rate(model_dir: Path, device, precision: str, *, batch: int, length: int, queue: int, vocab: int,
                     steps: int, warmup: int) -> dict[str, Any]:
    """Steps/s of a ConGen training step (two views, queue K) on ``device`` with fixed-length random token ids."""
    import torch

    from raydistill.models import BiEncoder
    from raydistill.objectives import ConGenLoss

    torch.manual_seed(0)
    model = BiEncoder.from_pretrained(str(model_dir), max_length=length)
    # The tiny tokenizer knows ~2k words; a real BERT vocabulary's embedding matrix is part of every AdamW step.
    model.transformer.resize_token_embeddings(vocab)
    model = model.to(device).train()
    loss = ConGenLoss(queue_size=queue, dim=model.dim, queue_init="random", precision=precision).to(device)
    try:  # the engine's optimiser (fused AdamW); it lives in a module that needs pydantic
        from raydistill.runtime.engine.learner import build_optimizer

        optimizer, optimiser_name = build_optimizer([model, loss], lr=1e-4, weight_decay=0.01), "build_optimizer"
    except ImportError:
        optimizer, optimiser_name = torch.optim.AdamW(list(model.parameters()), lr=1e-4), "torch AdamW"
    keys = model.tokenize(["a b"]).keys()

    def views():
        ids = torch.randint(5, vocab, (batch, length), device=device)
        return {k: ids if k == "input_ids" else (torch.ones_like(ids) if k == "attention_mask" else
                                                    torch.zeros_like(ids)) for k in keys}

    control, generalize = views(), views()
    teacher = torch.nn.functional.normalize(torch.randn(batch, model.dim, device=device), dim=1)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step():
        with autocast(device, precision):
            features = {"student_control": model(control), "student_generalize": model(generalize)}
        output = loss({**as_float32(features), "teacher": teacher})
        optimizer.zero_grad(set_to_none=True)
        output.loss.backward()
        optimizer.step()
        return output.loss

    for _ in range(warmup):
        step()
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    for _ in range(steps):
        value = step()
    sync()
    seconds = time.perf_counter() - started
    result = {"steps_per_s": steps / seconds, "step_ms": 1000 * seconds / steps, "steps": steps,
              "loss_finite": bool(torch.isfinite(value)), "optimizer": optimiser_name}
    if device.type == "cuda":
        result["peak_mem_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
    return result


def check_timing(report: Report, s: Setup, imports: dict[str, str], quick: bool) -> None:
    why = missing(imports, "raydistill.objectives", "raydistill.models", "tests.tiny_models")
    if why:
        report.add("timing", "all", "skipped", reason=why)
        return
    import torch

    from tests.tiny_models import make_tiny_model

    # Not quick: the shape of all-MiniLM-L6-v2 (6 layers, width 384, BERT's 30522-token vocabulary), random init.
    shape = dict(hidden=128, layers=2, heads=4, vocab=30522, batch=16, length=32, queue=1024) if quick else \
        dict(hidden=384, layers=6, heads=6, vocab=30522, batch=64, length=32, queue=16384)
    model_dir = make_tiny_model("bert", s.tmp / "mid", s.sentences, hidden=shape["hidden"], layers=shape["layers"],
                                heads=shape["heads"], intermediate=4 * shape["hidden"], initializer_range=0.02)
    report.record["timing_shape"] = {**shape, "step": "ConGen: 2 views x batch rows of random ids, queue K, AdamW"}
    sizes = {k: shape[k] for k in ("batch", "length", "queue", "vocab")}
    rates = {}
    cpu = torch.device("cpu")
    runs = [(s.device, p, 3 if quick else 20, 1 if quick else 3) for p in s.precisions]
    if s.device.type != "cpu":
        runs.append((cpu, "fp32", 3, 1))
    for device, precision, steps, warmup in runs:
        key = f"{device.type}-{precision}"

        def body(device=device, precision=precision, steps=steps, warmup=warmup, key=key):
            rates[key] = congen_step_rate(model_dir, device, precision, steps=steps, warmup=warmup, **sizes)
            ok = rates[key]["loss_finite"]
            return {"status": "pass" if ok else "fail", **rates[key],
                    **({} if ok else {"problems": ["loss not finite"]})}
        guarded(report, "timing", key, body)
    base = rates.get("cpu-fp32")
    if base:
        report.record["timing_ratio_vs_cpu_fp32"] = {k: round(v["steps_per_s"] / base["steps_per_s"], 2)
                                                     for k, v in rates.items()}
    report.write()


# ----------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    hidden = [m for m in args.simulate_missing.split(",") if m] + (["ray"] if args.simulate_no_ray else [])
    for name in hidden:  # before anything imports them: `import ray` then raises ModuleNotFoundError
        sys.modules[name] = None
    from common import command_line, cpu_model  # first: it sets the environment (offline Hugging Face) before torch

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda but torch.cuda.is_available() is False", file=sys.stderr)
        return 1
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    imports = probe_imports()
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # one "newly initialised head" report per tiny model would bury the lines
    hf_logging.disable_progress_bar()
    record: dict[str, Any] = {
        "command": command_line(), "torch": torch.__version__, "cuda": torch.version.cuda, "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model(),
        "cpu": cpu_model(), "cpu_threads": torch.get_num_threads(), "python": platform.python_version(),
        "quick": args.quick, "simulated_missing": hidden, "imports": imports, "notes": []}
    if device.type == "cuda":
        record["bf16_supported"] = torch.cuda.is_bf16_supported()
    audit_cls = device_audit_class()
    if audit_cls is None:
        record["notes"].append("torch has no TorchDispatchMode: off-device ops are caught only when they raise")
    record["imports_s"] = round(time.perf_counter() - STARTED, 1)
    print(f"gpu_check on {device} ({record['device_name']}), torch {torch.__version__}; imports done at "
          f"{record['imports_s']} s", flush=True)
    for name, version in imports.items():
        if version.startswith("MISSING"):
            print(f"  could not import {name}: {version[9:]}", flush=True)
    report = Report(args, record)
    checks = set(args.checks.split(","))
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        s = None
        if imports["tests.tiny_models"].startswith("MISSING"):
            report.add("setup", "tiny-models", "skipped", reason=missing(imports, "tests.tiny_models"))
        else:
            t0 = time.perf_counter()
            s = build_setup(device, Path(tmp), args.quick, tuple(p for p in args.precisions.split(",") if p))
            if device.type == "cuda":
                torch.zeros(1, device=device)  # CUDA context here, not inside the first check's numbers
            record["setup_s"] = round(time.perf_counter() - t0, 1)
        if s is not None:
            if "objectives" in checks:
                check_objectives(report, s, imports, audit_cls)
            if "learner" in checks:
                check_learner(report, s, imports, audit_cls)
            if "tenc" in checks:
                check_tenc(report, s, imports)
            if "timing" in checks:
                check_timing(report, s, imports, args.quick)
    report.write()
    counts = record["counts"]
    print(f"gpu_check {'PASSED' if record['passed'] else 'FAILED'} in {record['wall_s']} s: "
          + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())), flush=True)
    for group, cases in record["checks"].items():
        for name, case in cases.items():
            if case["status"] not in ("pass", "skipped"):
                print(f"  {case['status']}: {group}/{name}: {case.get('problems') or case.get('error')}")
    if record.get("timing_ratio_vs_cpu_fp32"):
        print(f"  timing (steps/s relative to this machine's CPU fp32): {record['timing_ratio_vs_cpu_fp32']}")
    if args.write:
        print(f"wrote {args.write}")
    return 0 if record["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
