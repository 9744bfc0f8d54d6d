"""``raydistill distill``: from a teacher and a user's text to a model to ship, in one command.

    plan_distill(teacher=..., student=..., corpus=...)   # every check, before any work: DistillError / a user error
    run_distill(plan)                                     # cut the student, train, package; resumes in plan.out_dir

``plan_distill`` refuses a bad input with one line naming the option (exit 2 at the command line) before a model is
loaded, cut or trained: an unknown teacher (with what to install), a student deeper or wider than its teacher, a bad
``layers:`` cut, an unknown ``--labels``, a corpus that is missing, empty or all evaluation text, a bad ``--set``.
It picks the recipe for the student's size (``recipe.recipe_for``) and builds the job config from the recipe's
shipped config and overrides, then the user's ``--set``. A static student (``static``, ``static:N``, or a static
model directory) is the ``static`` size whatever its width; the job builds its table from the teacher
(``registry.resolve_model(name, teacher=...)``), so a width beyond the teacher's is refused (PCA of its token
outputs keeps at most its width), and so is a ``--labels`` it has no recipe for.

``run_distill`` then cuts a shape student (``layers:3``, ``layers:3,hidden:256``) out of the teacher with
``models.derive.derive_student`` (evenly spaced layers, units by activation) into
``<out>.training/student-start-<shape>``; trains with ``runtime.jobs.distill.run_distillation`` in the run dir
``<out>.training`` beside ``<out>`` (``training_dir``; result file ``result.json``); and packages the best model
into ``<out>`` (``ship.package.package_student``), printing its table.

The same command on the same ``--out`` resumes as docs/distill.md ("Resume") says: the result file's config hash
skips the training, ``<out>.training/distill.json`` the packaging; another config is refused by the run dir's check."""

from __future__ import annotations

import json
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from raydistill.ship.recipe import DEFAULT_BUDGET, LABELS, Recipe, labels_for, layer_params, recipe_for

__all__ = ["DistillError", "DistillPlan", "StudentSpec", "parse_student_spec", "plan_distill", "run_distill",
           "train_student", "REGISTER_KNOB", "MANIFEST", "training_dir"]

TRAINING_SUFFIX = ".training"  # the run dir: <out>.training, beside --out
RESULT_FILE = "result.json"  # the job's result record, inside the run dir
MANIFEST = "distill.json"  # what a finished command wrote (recipe, config hash, the report's table), in the run dir

# The job config field that names the MLflow Model Registry entry the job registers its best student under; --register
# sets it as the jobs' own --register does (``runtime.entry.register_overrides``). Checked before any work: a config
# without the field refuses --register with a message.
REGISTER_KNOB = "tracking.register_model"

_CUT_KEYS = ("layers", "hidden", "ffn")
_CUT_FORM = "layers:N[,hidden:H][,ffn:F]"

Progress = Callable[[str], None]


def print_line(line: str) -> None:
    """The default progress: a line at once, also when stdout is a file or a pipe read while the command runs."""
    print(line, flush=True)


class DistillError(ValueError):
    """A bad ``raydistill distill`` argument: one line naming the option; the command exits with status 2."""


@dataclass(frozen=True)
class Shape:
    """What the checks and the recipe need of an encoder: depth, width, FFN width, head size, architecture."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    model_type: str

    @property
    def head_dim(self) -> int:
        return self.hidden // max(1, self.heads)

    @property
    def is_static(self) -> bool:
        """A static token table (raydistill.models.static_embedding): no layers, ``hidden`` is its width."""
        return self.model_type == "static"

    def describe(self) -> str:
        if self.is_static:
            return f"static token table x {self.hidden}"
        return f"{self.layers} layer{'s' if self.layers != 1 else ''} x {self.hidden}"


@dataclass(frozen=True)
class StudentSpec:
    """``--student``: a preset, a model directory, or a shape cut from the teacher (``layers``/``hidden``/``ffn``;
    None keeps the teacher's)."""

    text: str
    kind: str  # "preset" | "directory" | "cut" | "static" (a static name: static, static:N)
    layers: int | None = None
    hidden: int | None = None
    ffn: int | None = None

    def slug(self) -> str:
        """``l3-h256``: the cut in a directory name (a different cut is a different path, so a different config)."""
        return "-".join(f"{key[0]}{value}" for key, value in
                        (("layers", self.layers), ("hidden", self.hidden), ("ffn", self.ffn)) if value is not None)


@dataclass
class DistillPlan:
    """Everything ``run_distill`` does, decided and checked."""

    command: str
    teacher: str  # as given (a preset name or a directory)
    teacher_dir: Path | None  # resolved when the teacher is a directory; presets resolve when first used
    teacher_shape: Shape
    student: StudentSpec
    student_shape: Shape
    student_params: int  # transformer-layer parameters: what picks the recipe
    recipe: Recipe
    corpus: str  # data.corpus
    corpus_sentences: int
    corpus_stats: dict[str, int]
    max_sentences: int | None
    out_dir: Path
    cfg: Any  # the JobConfig run_distillation gets
    config_hash: str
    eval_pairs: Path | None = None
    register: str | None = None
    dev_pairs: Path | None = None
    budget: str | None = None  # train.budget as the config spells it (None: the recipe's epochs)

    @property
    def run_dir(self) -> Path:
        return training_dir(self.out_dir)

    @property
    def result_path(self) -> Path:
        return self.run_dir / RESULT_FILE

    @property
    def manifest_path(self) -> Path:
        return self.run_dir / MANIFEST

    @property
    def start_dir(self) -> Path | None:
        """Where a cut student is written before training (None: the student is a preset or a directory)."""
        return self.run_dir / f"student-start-{self.student.slug()}" if self.student.kind == "cut" else None


def training_dir(out_dir: Path) -> Path:
    """The run dir of ``--out DIR``: ``DIR.training`` beside it, not inside: the packaging step replaces ``DIR`` whole
    (a failed packaging leaves the earlier package, never half of one) and refuses a ``DIR`` holding anything but a
    package, and the checkpoints (hundreds of MB) have no place in the directory a user ships."""
    return out_dir.with_name(out_dir.name + TRAINING_SUFFIX)


def parse_student_spec(text: str) -> StudentSpec | None:
    """A cut such as ``layers:3`` or ``layers:3,hidden:256`` (None: ``text`` is no cut); DistillError if malformed."""
    if ":" not in text:
        return None
    values: dict[str, int] = {}
    for part in text.split(","):
        key, sep, value = (p.strip() for p in part.partition(":"))
        if not sep or key not in _CUT_KEYS:
            raise DistillError(f"--student {text!r}: {part.strip()!r} is not a cut; expected {_CUT_FORM} (or a preset "
                               "or a model directory)")
        if key in values:
            raise DistillError(f"--student {text!r}: {key} given twice; expected {_CUT_FORM}")
        try:
            number = int(value)
        except ValueError:
            raise DistillError(f"--student {text!r}: {key} must be a positive integer, got {value!r}") from None
        if number <= 0:
            raise DistillError(f"--student {text!r}: {key} must be a positive integer, got {number}")
        values[key] = number
    return StudentSpec(text, "cut", **values)


def _shape_of_directory(directory: Path, option: str) -> Shape:
    from raydistill.models.bi_encoder import transformer_directory
    from raydistill.models.static_embedding import is_static_directory

    static = is_static_directory(directory)
    try:
        if static:  # Model2Vec's config.json: the table's width, no layers
            return Shape(0, int(json.loads((directory / "config.json").read_text())["hidden_dim"]), 0, 0, "static")
        config = json.loads((transformer_directory(directory) / "config.json").read_text())
        return Shape(int(config["num_hidden_layers"]), int(config["hidden_size"]),
                     int(config.get("intermediate_size") or 4 * int(config["hidden_size"])),
                     int(config["num_attention_heads"]), str(config.get("model_type", "?")))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        problem = ("a static model whose config.json has no readable hidden_dim" if static
                   else "cannot read the encoder's shape from its config.json")
        raise DistillError(f"{option} {directory}: {problem} ({type(exc).__name__}: {exc})") from None


def _model(text: str, option: str, rows: dict[str, dict[str, Any]]) -> tuple[Shape, Path | None]:
    """``(shape, directory)`` of a preset (directory None: resolved when first used) or a model directory."""
    from raydistill.models.registry import WEIGHTS_EXTRA, ModelNotAvailableError, resolve_model

    if text in rows:
        row = rows[text]
        if row["state"] == "missing":
            raise DistillError(f"{option} {text!r}: the preset's weights are not installed; {row['status']}")
        return Shape(int(row["layers"]), int(row["hidden"]), int(row["intermediate"]), int(row["heads"]),
                     str(row["family"])), None
    path = Path(text).expanduser()
    if not path.exists() and "/" not in text.strip("./~") and not text.startswith((".", "/", "~")):
        from raydistill.config.schema import suggest

        raise DistillError(f"{option} {text!r}: not a preset{suggest(text, rows)} nor a model directory; presets: "
                           f"{', '.join(rows)} (their weights: {WEIGHTS_EXTRA}), "
                           "or a local sentence-transformers / Hugging Face model directory")
    try:
        directory = resolve_model(text)  # a directory (checked: config, weights, tokenizer) or a cached hub id
    except ModelNotAvailableError as exc:
        raise DistillError(f"{option} {text!r}: {str(exc).splitlines()[0]}") from None
    return _shape_of_directory(directory, option), directory


def _cut_shape(spec: StudentSpec, teacher: Shape, teacher_text: str) -> Shape:
    from raydistill.models.derive import DERIVABLE_LAYOUTS as DERIVABLE

    if teacher.model_type not in DERIVABLE:
        raise DistillError(f"--student {spec.text!r}: a student is cut only from a {', '.join(DERIVABLE)} teacher; "
                           f"{teacher_text} is {teacher.model_type!r} (pass a student preset or directory instead)")
    layers, hidden = spec.layers or teacher.layers, spec.hidden or teacher.hidden
    if layers > teacher.layers:
        raise DistillError(f"--student {spec.text!r}: {layers} layers is deeper than the teacher {teacher_text} "
                           f"({teacher.layers} layers)")
    if hidden > teacher.hidden:
        raise DistillError(f"--student {spec.text!r}: hidden {hidden} is wider than the teacher {teacher_text} "
                           f"({teacher.hidden})")
    if hidden % teacher.head_dim:
        raise DistillError(f"--student {spec.text!r}: hidden {hidden} must be a multiple of the teacher's head size "
                           f"{teacher.head_dim} (whole attention heads are kept)")
    # The FFN keeps the teacher's ratio to the width unless given (the presets' 4 x hidden).
    ffn = spec.ffn or (teacher.intermediate if spec.hidden is None else teacher.intermediate * hidden // teacher.hidden)
    if ffn > teacher.intermediate:
        raise DistillError(f"--student {spec.text!r}: ffn {ffn} is wider than the teacher's FFN "
                           f"({teacher.intermediate})")
    return Shape(layers, hidden, ffn, hidden // teacher.head_dim, teacher.model_type)


def _student(text: str, teacher: Shape, teacher_text: str, rows: dict[str, dict[str, Any]]
             ) -> tuple[StudentSpec, Shape, str]:
    """``(spec, shape, the job config's student)``; a cut's start directory is filled in by the plan."""
    exists = Path(text).expanduser().exists()
    static = None if exists else _static_student(text, teacher, teacher_text)
    if static is not None:
        return static
    spec = None if exists or text in rows else parse_student_spec(text)
    if spec is not None:
        return spec, _cut_shape(spec, teacher, teacher_text), ""
    shape, directory = _model(text, "--student", rows)
    for bigger, mine, theirs in (("deeper", shape.layers, teacher.layers), ("wider", shape.hidden, teacher.hidden)):
        if mine > theirs:
            raise DistillError(f"--student {text!r} ({shape.describe()}) is {bigger} than the teacher {teacher_text} "
                               f"({teacher.describe()}): a student must not be larger than its teacher")
    kind = "preset" if directory is None else "directory"
    return StudentSpec(text, kind), shape, text if directory is None else str(directory)


def _static_student(text: str, teacher: Shape, teacher_text: str) -> tuple[StudentSpec, Shape, str] | None:
    """A static name (``static``, ``static:N``) as ``_student`` returns it, None for any other ``--student``. The
    job builds the table from its teacher, so the name goes to the job config as given; checked here is what that
    build would refuse later: a teacher without transformer outputs, or a width PCA cannot give."""
    from raydistill.models.static_embedding import static_width

    try:
        width = static_width(text)
    except ValueError as exc:
        raise DistillError(f"--student {text!r}: {str(exc).split(': ', 1)[-1]}") from None
    if width is None:
        return None
    if teacher.is_static:
        raise DistillError(f"--student {text!r}: a static student is built from a transformer teacher's token "
                           f"outputs; the teacher {teacher_text} is itself a static model")
    if width > teacher.hidden:
        raise DistillError(f"--student {text!r}: a static table {width} wide is wider than the teacher {teacher_text} "
                           f"({teacher.hidden}): its rows are the teacher's token outputs reduced by PCA, which keeps "
                           f"at most {teacher.hidden} dimensions")
    return StudentSpec(text, "static"), Shape(0, width, 0, 0, "static"), text


def _corpus(text: str) -> str:
    """``--corpus`` as ``data.corpus``: a named corpus, ``file:`` + the absolute path (so a resume from another
    working directory reads the same file), ``#column`` kept."""
    from raydistill.data.corpus import NAMED_CORPORA, corpus_spec_problem, parse_corpus_spec

    if text in NAMED_CORPORA:
        return text
    spec = text if text.startswith("file:") else f"file:{text}"
    try:
        parsed = parse_corpus_spec(spec)
    except ValueError as exc:
        raise DistillError(f"--corpus {text!r}: {exc}") from None
    if parsed.path is not None and not parsed.path.exists():
        raise DistillError(f"--corpus {text!r}: file not found: {parsed.path} (a text file with one sentence a line, "
                           f"JSON Lines, CSV/TSV, Parquet, a datasets directory, or one of {', '.join(NAMED_CORPORA)})")
    spec = f"file:{parsed.path.resolve()}" + (f"#{parsed.column}" if parsed.column else "")
    problem = corpus_spec_problem(spec)
    if problem:
        raise DistillError(f"--corpus {text!r}: {problem}")
    return spec


def _register_supported() -> bool:
    """Whether the job config has the field ``REGISTER_KNOB`` names."""
    from raydistill.config.job import JobConfig

    section, _, key = REGISTER_KNOB.partition(".")
    default = getattr(JobConfig.__pydantic_fields__.get(section), "default_factory", None)
    return default is not None and key in getattr(type(default()), "__pydantic_fields__", {})


def _out_dir(out: str | None, student: StudentSpec, teacher: str) -> Path:
    """``--out`` as an absolute path that the packaging step may fill (missing, empty or an earlier package) and
    whose run dir beside it can be written."""
    from raydistill.runtime.engine.rundir import OutputDirError, check_output_dir
    from raydistill.ship.package import PackageError, check_out_dir

    if out is None:  # no ':' (static:N) in a directory name: it separates paths in PATH-like lists
        name = (student.text.replace(":", "-") if student.kind == "static" else student.slug() if student.kind == "cut"
                else Path(student.text.rstrip("/")).name)
        out = f"distilled-{Path(teacher.rstrip('/')).name}-{name}"
    path = Path(out).expanduser().absolute()
    try:
        check_out_dir(path)
        for directory in (path, training_dir(path)):
            check_output_dir(directory)
    except (PackageError, OutputDirError) as exc:
        raise DistillError(f"--out {exc}") from None
    return path


def _thread_overrides() -> list[str]:
    """On a machine with more cores than the shipped configs' two, the teacher and the learner use them all (where
    they run, not what they train: a resume elsewhere is the same run)."""
    cores = os.cpu_count() or 2
    if cores <= 2:
        return []
    return [f"resources.num_cpus={cores}", f"resources.teacher.threads={cores}", f"resources.learner.threads={cores}"]


def _sets_any(overrides: list[str] | tuple[str, ...], fields: tuple[str, ...]) -> bool:
    """Whether a ``--set KEY=VALUE`` of ``overrides`` sets one of ``fields``."""
    return any(item.split("=", 1)[0].strip() in fields for item in overrides)


def _precision_overrides(overrides: list[str] | tuple[str, ...]) -> list[str]:
    """bf16 training where this CPU multiplies bf16 in hardware (AVX512-BF16, AMX): about 3 times the steps of fp32
    in a time budget at the same 7-STS (the committed bf16/fp32 ConGen pairs, docs/benchmarks.md); fp32 elsewhere,
    where bf16 is emulated and many times slower. A ``--set train.precision`` wins."""
    if _sets_any(overrides, ("train.precision",)):
        return []
    from raydistill.runtime.teachers.teacher import bf16_support

    return ["train.precision=bf16"] if bf16_support()[0] else []


# --set fields that give the run its length themselves: with one of them and no --budget, no default budget.
_LENGTH_FIELDS = ("train.epochs", "train.max_steps", "train.budget")


def _budget(budget: str | int | None, overrides: list[str] | tuple[str, ...] = ()) -> str | None:
    """``--budget`` as ``train.budget`` spells it (None: the recipe's epochs). Not given: ``DEFAULT_BUDGET``, unless
    ``--set`` sets the run's length; ``epochs``: the recipe's epochs. DistillError naming the option when it is
    neither steps nor a wall time."""
    if budget is None:
        return None if _sets_any(overrides, _LENGTH_FIELDS) else DEFAULT_BUDGET
    if str(budget).strip().lower() == "epochs":
        return None
    from raydistill.config.sections import parse_budget

    try:
        return parse_budget(budget).describe()
    except ValueError as exc:
        raise DistillError(f"--budget {budget!r}: {exc}") from None


def _pairs_file(option: str, given: str | None) -> tuple[Path | None, list]:
    """``(absolute path, pairs)`` of a scored pairs option, every line read: a bad one is a DataError naming the
    file, line and field; ``(None, [])`` when not given."""
    if given is None:
        return None, []
    from raydistill.data.scored_pairs import read_eval_pairs

    path = Path(given).expanduser().absolute()
    if not path.exists():
        raise DistillError(f"{option} {given}: file not found")
    return path, read_eval_pairs(path)


def _refuse_overlap(dev_path: Path, dev: list, eval_path: Path, evaluation: list) -> None:
    """Pairs that choose the model must not be pairs it is tested on: a shared pair (either order) is refused."""
    tested = {frozenset((p.sentence1, p.sentence2)) for p in evaluation}
    shared = [p for p in dev if frozenset((p.sentence1, p.sentence2)) in tested]
    if shared:
        raise DistillError(f"--dev-pairs {dev_path}: {len(shared)} of its {len(dev)} pairs are also in --eval-pairs "
                           f"{eval_path} (first: {shared[0].sentence1!r} / {shared[0].sentence2!r}); pairs that choose "
                           "the model would then also test it: remove them from one of the files")


def plan_distill(*, teacher: str, student: str, corpus: str, out: str | None = None, labels: str = "none",
                 max_sentences: int | None = None, eval_pairs: str | None = None, register: str | None = None,
                 seed: int | None = None, overrides: list[str] | tuple[str, ...] = (),
                 dev_pairs: str | None = None, budget: str | int | None = None,
                 argv: list[str] | None = None) -> DistillPlan:
    """Check every input and decide the run; raises DistillError or a job user error (``USER_ERRORS``: a config
    field, a data file line) before any model is loaded or cut, Ray starts or a file is written."""
    from raydistill.config.job import JobConfig
    from raydistill.data.corpus import read_corpus
    from raydistill.methods import validate_method
    from raydistill.models.registry import describe_presets
    from raydistill.runtime.engine.preflight import preflight
    from raydistill.runtime.entry import register_overrides
    from raydistill.shipped import shipped_config

    if labels not in LABELS:
        raise DistillError(f"--labels {labels!r}: unknown; choose from {', '.join(LABELS)} (none: label-free, on "
                           "your text only; nli: then DistilCSE's supervised stage on the bundled NLI triplets)")
    if max_sentences is not None and max_sentences <= 0:
        raise DistillError(f"--max-sentences {max_sentences}: must be a positive integer")
    if register is not None and not register.strip():
        raise DistillError("--register: the model name must not be empty")
    if register is not None and not _register_supported():
        raise DistillError(f"--register {register!r}: this raydistill has no {REGISTER_KNOB} config field to register "
                           "the model with")
    rows = {row["name"]: row for row in describe_presets()}
    teacher_shape, teacher_dir = _model(teacher, "--teacher", rows)
    spec, student_shape, student_field = _student(student, teacher_shape, teacher, rows)
    static = student_shape.is_static
    if labels not in labels_for(static=static):
        raise DistillError(f"--labels {labels!r}: no recipe for a static student ({student}): no committed run trains "
                           f"a static table with labels; a static student takes --labels "
                           f"{', '.join(labels_for(static=True))}")
    corpus_spec = _corpus(corpus)
    budget_text = _budget(budget, overrides)
    pairs_path, pairs = _pairs_file("--eval-pairs", eval_pairs)
    dev_path, dev = _pairs_file("--dev-pairs", dev_pairs)
    if pairs and dev:
        _refuse_overlap(dev_path, dev, pairs_path, pairs)
    out_dir = _out_dir(out, spec, teacher)

    # A static table has no layers: its size is "static" whatever its width (recipe.size_for).
    params = 0 if static else layer_params(student_shape.layers, student_shape.hidden, student_shape.intermediate)
    recipe = recipe_for(params, labels, static=static)
    run_dir = training_dir(out_dir)
    teacher_field = str(teacher_dir) if teacher_dir is not None else teacher
    if spec.kind == "cut":
        student_field = str(run_dir / f"student-start-{spec.slug()}")
    settings = [f"student={student_field}", f"teacher={teacher_field}", f"data.corpus={corpus_spec}",
                f"data.max_sentences={max_sentences if max_sentences is not None else 'null'}",
                f"run_dir={run_dir}", f"tracking.run_name={out_dir.name}"]
    settings += [f"{key}={value}" for key, value in (("seed", seed), ("train.budget", budget_text),
                                                      ("train.dev_pairs", dev_path)) if value is not None]
    settings += _thread_overrides() + _precision_overrides(overrides) + register_overrides(register)
    cfg = JobConfig.from_yaml(shipped_config(recipe.config), list(recipe.overrides) + settings + list(overrides))
    # a missing, unreadable, empty or all-evaluation corpus: DataError
    corpus_read = read_corpus(corpus_spec, cfg.data.evaluation_set_split)
    # preflight checks the student path exists: a cut is checked as the teacher it will be cut from.
    preflight(cfg.with_overrides([f"student={teacher_field}"]) if spec.kind == "cut" else cfg)
    command = "raydistill distill " + shlex.join(argv) if argv is not None else "raydistill distill"
    return DistillPlan(
        command=command, teacher=teacher, teacher_dir=teacher_dir, teacher_shape=teacher_shape, student=spec,
        student_shape=student_shape, student_params=params, recipe=recipe, corpus=corpus_spec,
        corpus_sentences=len(corpus_read), corpus_stats=dict(corpus_read.stats), max_sentences=max_sentences,
        out_dir=out_dir, cfg=cfg, config_hash=validate_method(cfg).config_hash(), eval_pairs=pairs_path,
        register=register, dev_pairs=dev_path, budget=budget_text)


def _say(progress: Progress, message: str) -> None:
    progress(f"[distill] {message}")


def describe_plan(plan: DistillPlan) -> list[str]:
    """The lines that say what the command is about to do."""
    teacher = f"teacher {plan.teacher} ({plan.teacher_shape.describe()})"
    student = f"student {plan.student.text}" + (": cut from the teacher" if plan.student.kind == "cut" else "")
    if plan.student_shape.is_static:
        built = ", built from the teacher's token outputs" if plan.student.kind == "static" else ""
        size = f"{student} ({plan.student_shape.describe()}, no layers{built})"
    else:
        size = f"{student} ({plan.student_shape.describe()}, {plan.student_params / 1e6:.2g}M layer parameters)"
    used = (f", {min(plan.max_sentences, plan.corpus_sentences):,} used (--max-sentences)"
            if plan.max_sentences is not None and plan.max_sentences < plan.corpus_sentences else "")
    return [f"{teacher}; {size}",
            plan.recipe.headline(),
            f"corpus {plan.corpus}: {plan.corpus_sentences:,} sentences{used}",
            *([f"budget {plan.budget}: the recipe's epochs give way to it; early stopping after "
               f"{plan.cfg.train.stop_patience()} evaluations without a new best"] if plan.budget else []),
            *([f"dev pairs {plan.dev_pairs}: they, not STS-B dev, choose the best checkpoint"] if plan.dev_pairs
              else []),
            f"precision {plan.cfg.train.precision}" + (" (this CPU multiplies bf16 in hardware)"
                                                       if plan.cfg.train.precision == "bf16" else ""),
            f"output {plan.out_dir} (training run: {plan.run_dir})"]


def run_distill(plan: DistillPlan, progress: Progress = print_line) -> dict[str, Any]:
    """Cut, train and package (module docstring); returns ``{"record", "report", "table", "out_dir"}``.
    Raises the jobs' user errors and ``JobStopped`` (SIGTERM / Ctrl-C: what was kept, how to resume)."""
    for line in describe_plan(plan):
        _say(progress, line)
    manifest = _finished(plan)
    if manifest is not None:
        _say(progress, f"{plan.out_dir} is complete (trained, evaluated and packaged by this command earlier); "
                       f"nothing to do. Its report ({plan.manifest_path}):")
        progress(manifest["table"])
        return {"record": _read_json(plan.result_path), "report": None, "table": manifest["table"],
                "out_dir": str(plan.out_dir)}
    record = train_student(plan, progress)
    report = _package(plan, record, progress)
    table = str(getattr(report, "table", report))
    from raydistill.fileio import atomic_write_json

    atomic_write_json(plan.manifest_path, {"command": plan.command, "config_hash": plan.config_hash,
                                           "recipe": plan.recipe.to_dict(), "result": str(plan.result_path),
                                           "eval_pairs": str(plan.eval_pairs) if plan.eval_pairs else None,
                                           "register": plan.register, "table": table})
    progress(table)
    _say(progress, f"done: {plan.out_dir}")
    return {"record": record, "report": report, "table": table, "out_dir": str(plan.out_dir)}


def train_student(plan: DistillPlan, progress: Progress = print_line) -> dict[str, Any]:
    """``run_distill`` without packaging (``bench/domain.py`` scores the student itself): the job's result record,
    read back when this config already finished in the run dir, else trained (resuming) and evaluated."""
    from raydistill.runtime.jobs.distill import run_distillation

    if plan.start_dir is not None:
        _cut_student(plan, progress)
    record = _read_json(plan.result_path)
    if record and (record.get("training") or {}).get("config_hash") == plan.config_hash \
            and Path(record.get("model_dir", "")).is_dir():
        scores = record.get("scores", {})
        _say(progress, f"training already complete ({plan.result_path}: 7-STS {scores.get('avg', float('nan')):.2f}, "
                       f"STS-B dev {scores.get('stsb_dev', float('nan')):.2f}); not trained again")
        return record
    return run_distillation(plan.cfg, result_path=plan.result_path, command=plan.command)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _finished(plan: DistillPlan) -> dict[str, Any] | None:
    """The manifest of a finished run of this same command (config, evaluation pairs, registry name), else None."""
    from raydistill.ship.package import MANIFEST_FILE

    manifest = _read_json(plan.manifest_path)
    if not manifest or manifest.get("config_hash") != plan.config_hash or "table" not in manifest \
            or not (plan.out_dir / MANIFEST_FILE).is_file():
        return None
    same = (manifest.get("eval_pairs") == (str(plan.eval_pairs) if plan.eval_pairs else None)
            and manifest.get("register") == plan.register)
    return manifest if same else None


def _cut_student(plan: DistillPlan, progress: Progress) -> None:
    """The student cut from the teacher into ``plan.start_dir``, once (kept while it matches the cut and teacher)."""
    from raydistill.fileio import staged_directory
    from raydistill.models import resolve_model
    from raydistill.models.derive import derive_student

    shape, target = plan.student_shape, plan.start_dir
    source = plan.teacher_dir or resolve_model(plan.teacher)
    made = _read_json(target / "raydistill_model.json") if target.is_dir() else None
    if made and made.get("source_path") == str(source) and made.get("shape", {}).get("layers") == shape.layers \
            and made["shape"].get("hidden") == shape.hidden and made["shape"].get("intermediate") == shape.intermediate:
        _say(progress, f"student already cut: {target}")
        return
    started = time.perf_counter()
    prunes = shape.hidden < plan.teacher_shape.hidden or shape.intermediate < plan.teacher_shape.intermediate
    _say(progress, f"cutting the student from {source}: {shape.layers} evenly spaced layers"
                   + (f", the {shape.hidden} hidden units and {shape.intermediate} FFN units that carry most of the "
                      "teacher's activations" if prunes else ""))
    with staged_directory(target) as staged:
        metadata = derive_student(source, staged, layers=shape.layers,
                                  hidden=shape.hidden if shape.hidden < plan.teacher_shape.hidden else None,
                                  intermediate=shape.intermediate if prunes else None,
                                  derived_from=plan.teacher)
    _say(progress, f"student cut: layers {metadata['layers']} of the teacher's {plan.teacher_shape.layers}, "
                   f"{shape.hidden} wide ({time.perf_counter() - started:.1f}s) -> {target}")


def _package(plan: DistillPlan, record: dict[str, Any], progress: Progress):
    """The one call into the packaging step: the model directory, exports, card and report in ``plan.out_dir``."""
    from raydistill.ship.package import package_student

    training = record.get("training") or {}
    sentences = training.get("sentences") or plan.corpus_sentences
    name = plan.corpus[len("file:"):] if plan.corpus.startswith("file:") else f"{plan.corpus} (bundled)"
    corpus_info = {"name": name, "sentences": sentences, "spec": plan.corpus,
                   "description": f"{sentences:,} of its {plan.corpus_sentences:,} sentences (evaluation sentences "
                                  "removed)" if sentences < plan.corpus_sentences else "evaluation sentences removed",
                   "sentences_in_corpus": plan.corpus_sentences, "max_sentences": plan.max_sentences,
                   **plan.corpus_stats}
    start = f"{plan.teacher} cut to {plan.student.text}" if plan.student.kind == "cut" else plan.student.text
    labels = "label-free" if plan.recipe.labels == "none" else "with DistilCSE's NLI stage"
    recipe = plan.recipe.to_dict()
    recipe_info = {
        "methods": [plan.recipe.method], "student": start, "seed": plan.cfg.seed, "budget": plan.budget or "epochs",
        "stages": [{key: stage.get(key) for key in ("method", "epochs", "lr", "batch_size", "steps", "best_step",
                                                     "best_stsb_dev") if stage.get(key) is not None}
                   for stage in training.get("stages") or []],
        "description": f"The {plan.recipe.size}-size recipe of `raydistill distill`, {labels}: "
                       f"{plan.recipe.describe()}, the run with the best STS-B dev among the committed runs of its "
                       f"size (teacher {recipe['source_teacher']}, whole {recipe['source_corpus']} corpus).",
        "recipe": recipe, "student_layer_params": plan.student_params, "config_hash": plan.config_hash,
        "result_file": str(plan.result_path), "scores": record.get("scores"),
        "mlflow_run_id": record.get("mlflow_run_id"),
    }
    return package_student(record["model_dir"], plan.out_dir, teacher=plan.teacher, corpus_info=corpus_info,
                           recipe_info=recipe_info, command=plan.command, eval_pairs=plan.eval_pairs,
                           student_scores=(record.get("scores") or {}, str(plan.result_path)), progress=progress)


def run_command(options: dict[str, Any], argv: list[str] | None = None, progress: Progress = print_line) -> int:
    """``raydistill distill`` after argument parsing: plan, run, and the exit status (2: a user error, one line on
    stderr; 128 + the signal: stopped, and how to resume)."""
    import sys

    from raydistill.runtime.engine.stopping import JobStopped
    from raydistill.runtime.entry import USER_ERRORS, exit_stopped
    from raydistill.ship.package import PackageError

    try:
        run_distill(plan_distill(argv=argv, **options), progress)
    except (DistillError, PackageError) as exc:  # PackageError: an output directory packaging must not replace
        print(f"raydistill distill: {exc}", file=sys.stderr)
        return 2
    except USER_ERRORS as exc:
        message = str(exc).split("\n")[0]
        print(f"raydistill distill: {message}", file=sys.stderr)
        return 2
    except JobStopped as exc:
        exit_stopped(exc)
    return 0
