"""Which training recipe ``raydistill distill`` runs for a student: per student size, the committed run with the best
STS-B dev, label-free by default, with DistilCSE's supervised NLI stage under ``--labels nli``.

The table is code, not a lookup in ``results/``: an installed wheel has no results directory. Each recipe names the
result file it comes from (under the repository's ``results/``), the shipped job config it starts from and the
``--set`` overrides that reproduce that run's training, and carries the scores of that file. tests/
test_distill_command.py recomputes the choice from the committed files (best STS-B dev among the runs on the whole
``mixed`` corpus, never the 7-STS test average) and rebuilds each recipe's config against the file's recorded
settings, so the table cannot go stale silently.

What a recipe leaves out of its source run: the student and the teacher (the user's), ``train.precision`` (the source
runs used bf16 on a CPU with native bf16; `raydistill distill` chooses it for the CPU it runs on, bf16 only where
the hardware multiplies it, and a ``--set train.precision`` wins) and ``resources`` (where it ran, not what it
trained).

A student gets the recipe of the size nearest to it by the parameters of its transformer layers (embeddings not
counted: they are looked up, not computed, and a vocabulary's size says nothing about how a student learns), on a log
scale: ``size_for(layer_params)``. A static student (a token table, no layers) is a size of its own,
``STATIC_SIZE``, with a label-free recipe only (``STATIC_LABELS``): ``recipe_for(..., "nli", static=True)`` raises
ValueError naming what is supported rather than borrowing a transformer size's recipe.

    recipe = recipe_for(layer_params(layers=3, hidden=384, intermediate=1536), labels="none")
    recipe.config, recipe.overrides      # "congen", ()
    recipe_for(0, static=True).size      # "static"
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["DEFAULT_BUDGET", "LABELS", "RECIPES", "SIZES", "STATIC_LABELS", "STATIC_SIZE", "Recipe", "labels_for",
           "layer_params", "recipe_for", "recipes_help", "size_for"]

# ``--labels`` values: none (label-free distillation on the user's text only) or nli (then supervised SimCSE on the
# bundled NLI triplets, DistilCSE's second stage).
LABELS = ("none", "nli")
# `raydistill distill`'s training length when --budget is not given (docs/distill.md, "Budgets": what it buys,
# measured by bench/domain.py).
DEFAULT_BUDGET = "30m"

# Where every recipe's scores come from: runs from this teacher on the whole bundled ``mixed`` corpus (the static
# row: the part of it whose teacher vectors were cached, said beside the row).
SOURCE_TEACHER = "mpnet-base"
SOURCE_CORPUS = "mixed"


@dataclass(frozen=True)
class Recipe:
    """One row of the table: what to train a student of ``size`` with, and the committed run that chose it."""

    size: str  # the student preset whose runs chose it
    labels: str  # "none" | "nli"
    method: str  # the method trained ("ckd" is DistilCSE's label-free first stage on its own)
    config: str  # the shipped job config (raydistill/configs/<config>.yaml) it starts from
    overrides: tuple[str, ...]  # --set on top of that config: what the source run changed, for what it trained
    source: str  # its result file, relative to the repository's results/
    stage: int | None  # the stage of that run whose model this is (1: DistilCSE's CKD), None: the whole run
    stsb_dev: float  # STS-B dev (Spearman x 100) of that model: what the recipe was chosen by
    sts7: float  # its 7-STS average: reported, never chosen by

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "overrides": list(self.overrides), "source_teacher": SOURCE_TEACHER,
                "source_corpus": SOURCE_CORPUS}

    def headline(self) -> str:
        """What ``raydistill distill`` prints about its recipe: ``recipe of the minilm-l3 size, label-free: ...``."""
        labels = "label-free" if self.labels == "none" else "with NLI labels"
        return f"recipe of the {self.size} size, {labels}: {self.describe()}"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Recipe":
        """The recipe ``to_dict`` wrote (as a package manifest records it)."""
        return cls(**{f.name: data[f.name] for f in fields(cls)} | {"overrides": tuple(data["overrides"])})

    def describe(self) -> str:
        """``congen (results/mixed/congen-minilm-l3-mpnet-base.json: STS-B dev 83.77, 7-STS 77.08)``."""
        stage = f" stage {self.stage}" if self.stage else ""
        return f"{self.method} (results/{self.source}{stage}: STS-B dev {self.stsb_dev:.2f}, 7-STS {self.sts7:.2f})"


# The size presets' shapes (raydistill.models.registry.PRESETS): (layers, hidden, intermediate).
SIZES: dict[str, tuple[int, int, int]] = {
    "minilm-l3": (3, 384, 1536),
    "bert-mini": (4, 256, 1024),
    "bert-tiny": (2, 128, 512),
}

# A static student's size: a table has no layers to measure, and how it learns (no dropout, each step moving only
# the rows of its batch's tokens) is not how a transformer does, so it never borrows the nearest transformer recipe.
STATIC_SIZE = "static"
# ``--labels`` a static student has a recipe for: no committed run trains a table with DistilCSE's NLI stage.
STATIC_LABELS = ("none",)

_CKD = ("method=ckd", "extra={}")  # distilcse.yaml without its NLI stage: the CKD stage alone
_NLI_LONGER = ("extra.stage2.train.epochs=3", "extra.stage2.data.max_sentences=null")

RECIPES: tuple[Recipe, ...] = (
    # minilm-l3 label-free: congen 83.77 > ckd 83.62 > sct-distill 83.50 > l2 83.00 (STS-B dev; the last two before
    # the evaluation-text filter)
    Recipe("minilm-l3", "none", "congen", "congen", (), "mixed/congen-minilm-l3-mpnet-base.json", None, 83.77, 77.08),
    Recipe("minilm-l3", "nli", "distilcse", "distilcse", (), "mixed/distilcse-minilm-l3-mpnet-base.json", None,
           84.12, 78.13),
    # bert-mini: CKD for 2 epochs beat 1 epoch (83.76 against 82.98 before the filter, results/history/); rerun on
    # the filtered corpus; its NLI stage on all 9.2k triplets for 3 epochs
    Recipe("bert-mini", "none", "ckd", "distilcse", _CKD + ("train.epochs=2",),
           "mixed/longer/distilcse-bert-mini-mpnet-base.json", 1, 83.52, 76.63),
    Recipe("bert-mini", "nli", "distilcse", "distilcse", ("train.epochs=2",) + _NLI_LONGER,
           "mixed/longer/distilcse-bert-mini-mpnet-base.json", None, 84.59, 78.36),
    # bert-tiny: CKD for 3 epochs beat 2 and 1 (81.77 / 80.98 / 79.84 before the filter, results/history/); rerun
    # on the filtered corpus; its NLI stage on all 9.2k triplets for 3 epochs
    Recipe("bert-tiny", "none", "ckd", "distilcse", _CKD + ("train.epochs=3",),
           "mixed/three-epochs/distilcse-bert-tiny-mpnet-base.json", 1, 81.71, 72.95),
    Recipe("bert-tiny", "nli", "distilcse", "distilcse", ("train.epochs=3",) + _NLI_LONGER,
           "mixed/three-epochs/distilcse-bert-tiny-mpnet-base.json", None, 82.70, 74.81),
    # static (a token table, Model2Vec-style init from the teacher): ConGen with a table's learning rate, chosen on
    # STS-B dev over 20,000 sentences (1e-2: 83.36, 1e-3: 82.63). Unlike the rows above, its run trained on the
    # 152,660 sentences of `mixed` whose mpnet-base vectors the teacher cache held, not the whole corpus.
    Recipe(STATIC_SIZE, "none", "congen", "congen", ("train.lr=1e-2", "train.epochs=2", "train.eval_every=200"),
           "static/congen-static-mpnet-base.json", None, 83.91, 73.53),
)


def layer_params(layers: int, hidden: int, intermediate: int) -> int:
    """Parameters of ``layers`` BERT-style transformer layers (attention, FFN, two LayerNorms): the size measure."""
    return layers * (4 * (hidden * hidden + hidden) + (hidden * intermediate + intermediate)
                     + (intermediate * hidden + hidden) + 2 * 2 * hidden)


def _size_params() -> dict[str, int]:
    return {size: layer_params(*shape) for size, shape in SIZES.items()}


def size_for(params: int, *, static: bool = False) -> str:
    """The size whose layer parameters are nearest to ``params`` on a log scale (ties: the larger size);
    ``STATIC_SIZE`` for a static student, whatever ``params`` says (a table has none)."""
    if static:
        return STATIC_SIZE
    sizes = sorted(_size_params().items(), key=lambda item: -item[1])
    return min(sizes, key=lambda item: abs(math.log(max(params, 1)) - math.log(item[1])))[0]


def labels_for(*, static: bool = False) -> tuple[str, ...]:
    """The ``--labels`` values a student of this kind has a recipe for."""
    return STATIC_LABELS if static else LABELS


def recipe_for(params: int, labels: str = "none", *, static: bool = False) -> Recipe:
    """The recipe for a student with ``params`` layer parameters (``layer_params``) and ``labels``; ``static``: a
    static student (``params`` is then ignored). ValueError for labels with no recipe for that student."""
    if labels not in LABELS:
        raise ValueError(f"labels must be one of {', '.join(LABELS)}, not {labels!r}")
    if labels not in labels_for(static=static):
        raise ValueError(f"labels {labels!r}: no recipe for a static student (no committed run trains a static table "
                         f"with labels); a static student supports labels {', '.join(STATIC_LABELS)}")
    size = size_for(params, static=static)
    return next(recipe for recipe in RECIPES if recipe.size == size and recipe.labels == labels)


def _boundaries() -> list[tuple[str, float, float]]:
    """``(size, from, to)`` in millions of layer parameters: the range of students each size's recipe serves."""
    sizes = sorted(_size_params().items(), key=lambda item: item[1])
    edges = [math.sqrt(a[1] * b[1]) for a, b in zip(sizes, sizes[1:])]
    lows, highs = [0.0] + edges, edges + [math.inf]
    return [(size, low / 1e6, high / 1e6) for (size, _), low, high in zip(sizes, lows, highs)]


def recipes_help() -> str:
    """The recipe table as ``raydistill distill --help`` prints it."""
    lines = [f"recipes: per student size, the run with the best STS-B dev among the committed runs from "
             f"{SOURCE_TEACHER} on the whole {SOURCE_CORPUS} corpus (7-STS shown, never chosen by); a student gets "
             "the size nearest by its transformer layers' parameters (embeddings not counted):"]
    sizes = []
    for size, low, high in reversed(_boundaries()):
        layers, hidden, _ = SIZES[size]
        span = f"{low:.1f}M+" if high == math.inf else (f"< {high:.1f}M" if low == 0 else f"{low:.1f}-{high:.1f}M")
        sizes.append((size, f"{layers} layers x {hidden}; students with {span} layer parameters"))
    sizes.append((STATIC_SIZE, "static:N, a token table N wide, no layers; its own size whatever its width"))
    for size, about in sizes:
        lines.append(f"  {size} ({about})")
        for recipe in [recipe for recipe in RECIPES if recipe.size == size]:
            what = ("label-free (only)" if size == STATIC_SIZE
                    else "label-free (default)" if recipe.labels == "none" else "--labels nli")
            settings = "".join(f" --set {override}" for override in recipe.overrides)
            lines += [f"    {what:<21} {recipe.describe()}", f"    {'':<21} = configs/{recipe.config}.yaml{settings}"]
    return "\n".join(lines)
