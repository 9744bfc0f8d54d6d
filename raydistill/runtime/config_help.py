"""``--help`` text for a job's config fields, generated from the config dataclasses.

Each field's meaning is the comment the dataclass source gives it (on the field's line, or the comment lines right
above it), so the help cannot drift from the code. Fields whose source has no comment take their line from
``FIELD_MEANINGS``; the keys of the free-form ``loss:``/``extra:`` mappings, which have no dataclass, take theirs
from ``MAPPING_MEANINGS``. ``tests/test_cli_help.py`` fails when a field has neither.

    print(config_fields_help(JobConfig, shipped_values))
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import textwrap
import tokenize
import typing
from functools import lru_cache
from typing import Any

__all__ = ["field_comments", "config_field_rows", "config_fields_help", "FIELD_MEANINGS", "MAPPING_MEANINGS"]

# Fields of the config dataclasses whose source carries no comment (dotted path suffixes; the longest match wins).
FIELD_MEANINGS = {
    "method": "distillation method (congen, sct, sct-distill, distilcse, dvbert, simcse, st-mse)",
    "student": "student model: a preset of `raydistill models` or a local model directory",
    "teacher": "teacher model: a preset or a local model directory (null: no teacher)",
    "seed": "seed of sampling, shuffling, augmentation and initialisation",
    "student_pooling": "student pooling: mean or cls",
    "num_actors": "actors of this role",
    "num_cpus": "CPUs Ray reserves for each actor of this role",
    "num_gpus": "GPUs (fractions allowed) Ray reserves for each actor of this role",
    "batch_size": "rows per training step",
    "lr": "peak learning rate (AdamW, linear warm-up then linear decay)",
    "epochs": "passes over the training data",
    "max_steps": "stop after this many steps (null: run the epochs)",
    "warmup_ratio": "share of the steps spent warming the learning rate up",
    "weight_decay": "AdamW weight decay",
    "grad_clip": "clip the gradient norm to this (0: no clipping)",
    "eval_every": "evaluate STS-B dev every N steps (and at each epoch end); the best-dev model is kept",
    "checkpoint_every": "write a resumable checkpoint every N steps",
    "keep_last": "checkpoints kept on disk",
    "patience": "stop after this many dev evaluations without a new best (null: never)",
    "enabled": "record the run in MLflow",
    "experiment": "MLflow experiment name",
    "run_name": "MLflow run name (null: generated)",
    "shuffle": "shuffle the training rows every epoch",
    "threads": "torch intra-op threads of each actor of this role",
    "precision": "teacher only: auto, fp32 or bf16 (auto: bf16 where the CPU or GPU multiplies bf16 natively)",
    "data.max_sentences": "training sentences read from the corpus (null: all)",
    "data.teacher_max_length": "teacher tokens per sentence",
    "test_sets": "sets of the final 7-STS evaluation",
    "families": "model families, one bi- and one cross-encoder each (shorthand: a list of presets)",
    "families[].name": "family name",
    "families[].bi_stage": "this family's own bi-stage settings over bi: (lr, epochs, batch_size, ...)",
    "families[].cross_stage": "this family's own cross-stage settings over cross: (lr, epochs, batch_size, ...)",
    "cycles": "bi -> cross -> bi cycles",
    "pairs.source": "unlabeled sentence pairs: transductive (the STS test pairs), inductive or file:<path.jsonl>",
    "max_length": "token limit of this stage's encoder",
    "data.max_length": "student tokens per sentence",
    "tracking.tracking_uri": "MLflow store (null: $MLFLOW_TRACKING_URI, else sqlite:///<cwd>/mlflow.db)",
}

# Keys of the free-form ``loss:`` and ``extra:`` mappings that the shipped configs set.
MAPPING_MEANINGS = {
    "loss.queue_size": "K, instance-queue entries the loss scores against (teacher vectors of earlier batches)",
    "loss.tau_teacher": "temperature of the teacher's similarity distribution",
    "loss.tau_student": "temperature of the student's similarity distribution",
    "loss.tau": "temperature of the contrastive loss",
    "loss.temperature": "temperature of the contrastive loss",
    "loss.learnable_temperature": "learn the temperature with the student",
    "loss.reduction": "st-mse, student narrower than the teacher: pca (teacher's vectors reduced) or dense (student "
                      "widened)",
    "loss.pca_sentences": "st-mse: teacher vectors (first training rows) the PCA reduction is fitted on",
    "extra.stage2": "overrides of the second stage (supervised SimCSE on NLI triplets / STS-B fine-tuning)",
    "extra.teachers": "the NLI cross-encoder teachers (presets) fine-tuned before the student",
    "extra.teacher_training": "how the NLI cross-encoder teachers are fine-tuned (pairs, epochs, lr)",
}


@lru_cache(maxsize=None)
def field_comments(cls: type) -> dict[str, str]:
    """Field name -> its comment in ``cls``'s source: the comment on the field's own line, else the comment lines
    right above it (or above the run of fields it belongs to; such a shared comment starts with NUL). Fields
    without either are absent."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source (a frozen build): the fallbacks still answer
        return {}
    names = {f.name for f in dataclasses.fields(cls)}
    comments: dict[str, str] = {}
    pending: list[str] = []  # the comment block above the current run of fields
    line_comment: dict[int, str] = {}
    field_line: dict[str, int] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            line_comment[token.start[0]] = token.string.lstrip("#").strip()
    previous_was_comment = False
    block_start = 0
    for number, text in enumerate(source.splitlines(), start=1):
        stripped = text.strip()
        if stripped.startswith("#"):
            if not previous_was_comment:
                pending = []  # a new block
                block_start = number
            pending.append(line_comment.get(number, stripped.lstrip("#").strip()))
            previous_was_comment = True
            continue
        previous_was_comment = False
        if not stripped:
            pending = []  # a blank line ends what a comment block describes
            continue
        name = stripped.split(":", 1)[0].strip() if ":" in stripped else ""
        if name in names and name not in field_line and text.startswith("    ") and not text.startswith("     "):
            field_line[name] = number
            own = line_comment.get(number)
            if own:
                comments[name] = own
            elif pending:  # a block above a run of fields describes each of them ("max_tokens ... and precision")
                shared = any(line_no > block_start for line_no in field_line.values() if line_no != number)
                comments[name] = ("\0" if shared else "") + " ".join(pending)
        else:
            pending = []
    return comments


def _one_line(text: str, width: int = 110) -> str:
    """The first clause of a comment (up to ". " or "; " outside brackets, "e.g. " not counted), cut to ``width``."""
    depth = 0
    for i, char in enumerate(text):
        depth += char in "([{"
        depth -= char in ")]}"
        if depth == 0 and char in ".;" and text[i + 1: i + 2] == " " and not text[max(0, i - 3): i].endswith(
                ("e.g", "i.e", "etc")):
            text = text[:i]
            break
    return text if len(text) <= width else text[: width - 1].rstrip() + "…"


def _nested_dataclass(hint: Any) -> tuple[type | None, bool]:
    """The dataclass a field holds (or a list of), and whether it is a list."""
    origin = typing.get_origin(hint)
    if origin in (list, tuple):
        args = typing.get_args(hint)
        inner = args[0] if args else None
        return (inner if dataclasses.is_dataclass(inner) else None), True
    if dataclasses.is_dataclass(hint):
        return hint, False
    for arg in typing.get_args(hint):  # Optional[Section]
        if dataclasses.is_dataclass(arg):
            return arg, False
    return None, False


def _meaning(path: str, name: str, comments: dict[str, str]) -> str | None:
    """The field's own comment, else a ``FIELD_MEANINGS`` entry, else a comment block it shares with the fields
    above it (marked with a leading NUL by ``field_comments``)."""
    comment = comments.get(name)
    if comment and not comment.startswith("\0"):
        return _one_line(comment)
    generic = path.replace("[]", "")
    for key in sorted(FIELD_MEANINGS, key=len, reverse=True):
        if path == key or path.endswith("." + key) or generic == key or generic.endswith("." + key):
            return FIELD_MEANINGS[key]
    return _one_line(comment[1:]) if comment else None


def config_field_rows(cls: type, prefix: str = "") -> list[tuple[str, str | None]]:
    """``(dotted path, one-line meaning or None)`` for every field of ``cls`` and its nested sections; the free-form
    mappings (``loss``, ``extra``) appear as one row each. Private fields (``_source``) are left out."""
    hints = typing.get_type_hints(cls)
    comments = field_comments(cls)
    rows: list[tuple[str, str | None]] = []
    for f in dataclasses.fields(cls):
        if f.name.startswith("_"):
            continue
        path = f"{prefix}{f.name}"
        nested, is_list = _nested_dataclass(hints.get(f.name))
        if nested is not None:
            if is_list:
                rows.append((path, _meaning(path, f.name, comments)))
            rows += config_field_rows(nested, f"{path}[]." if is_list else f"{path}.")
        else:
            rows.append((path, _meaning(path, f.name, comments)))
    return rows


def _flatten(values: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(values, dict) and values:
        out: dict[str, Any] = {}
        for key, value in values.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: values}


def _show(value: Any) -> str:
    """A value as it would be written in the YAML file."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def config_fields_help(cls: type, shipped: dict[str, Any] | None = None) -> str:
    """The help block: one line per field, ``path = value  meaning``, values from ``shipped`` (the default
    config's plain data) where it sets the field; the keys ``shipped`` sets under a free-form mapping get a line
    each."""
    flat = _flatten(shipped or {})
    rows = config_field_rows(cls)
    mapping_paths = {path for path, _ in rows if path in ("loss", "extra")}
    lines = []
    for path, meaning in rows:
        if path in mapping_paths:
            keys = sorted({k.split(".")[1] for k in flat if k.startswith(path + ".")})
            lines.append(f"  {path}.*  {meaning or 'method-specific settings'}")
            for key in keys:
                sub = f"{path}.{key}"
                value = (shipped or {}).get(path, {}).get(key)
                shown = _show(value) if not isinstance(value, (dict, list)) else "{...}"
                lines.append(f"    {sub} = {shown}  {MAPPING_MEANINGS.get(sub, 'method-specific')}")
            continue
        value = flat.get(path)
        shown = f" = {_show(value)}" if path in flat and not isinstance(value, (dict, list)) else ""
        lines.append(f"  {path}{shown}  {meaning or ''}".rstrip())
    return "\n".join(lines)
