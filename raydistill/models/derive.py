"""Derive a smaller student checkpoint from a trained encoder by selecting layers and units (no training).

A student of depth L' and width H' starts closer to its teacher when it is cut out of the teacher than when it is
randomly initialised (DistilBERT, Sanh et al. 2019, initialises from every other teacher layer; "Sheared LLaMA",
Xia et al. 2023, and Minitron, Muralidharan et al. 2024, prune width by activation-based importance). Here:

* layers: an explicit list, or evenly spaced ones from the first to the last;
* residual-stream (hidden) units: ONE subset of indices used everywhere the residual stream is read or written -
  the columns of every embedding table, every LayerNorm, the input columns of Q/K/V and the FFN's first projection,
  the output rows of the attention output and the FFN's second projection, and both sides of the pooler - so the
  student's residual stream is exactly a coordinate subset of the teacher's;
* attention heads: whole heads, so the head size (and hence the 1/sqrt(d_head) scale) is unchanged and the student
  has hidden / d_head heads (MPNet shares one relative-position bias table over all layers, so there the same head
  subset is kept in every layer);
* FFN units: a subset of the intermediate neurons of each layer;
* the whole vocabulary.

Importance (``selection``):

``"activation"`` (default; Minitron-style, measured on real sentences): with x the residual stream after each kept
    LayerNorm, a hidden unit d scores sum_states E[x_d^2] / E[||x||^2], the share of the stream's energy it carries
    (keeping BERT's large "outlier" dimensions, which dominate LayerNorm statistics). A head h of a layer scores its
    RMS contribution to the kept units: sqrt(E ||W_O[kept, h] c_h||^2) = sqrt(tr(W_O[kept,h] Sigma_h W_O[kept,h]^T)),
    with Sigma_h = E[c_h c_h^T] the second moment of its context vector c_h. An FFN unit j scores
    sqrt(E[a_j^2]) * ||W_2[kept, j]||, with a_j its GELU output. These are first-order "how much does the kept
    output change without this unit" scores; statistics come from one pass of the teacher over calibration
    sentences (by default STS-B train sentences that are no evaluation sentence, ``derive_files.CALIBRATION_SET``).
``"weight_norm"`` (data-free): hidden unit d scores sum_LN (gamma_d^2 + beta_d^2) / sum(gamma^2 + beta^2); head h
    scores ||W_O[kept, h]||_F * ||W_V[h, kept]||_F; FFN unit j scores ||W_1[j, kept]|| * ||W_2[kept, j]||.

Measured on STS-B dev (Spearman x 100 of the cosine of mean-pooled embeddings over the whole set; the source
all-MiniLM-L6-v2 scores 86.7), hidden+heads / FFN scored by:

    ===========================  ===================  =================  =================  =================
    preset (layers)              activation/activ.    weight/weight      activation/weight  weight/activation
    ===========================  ===================  =================  =================  =================
    bert-mini  (0,2,3,5 of 6)    81.1                 80.9               79.9               81.6
    bert-tiny  (2,5 of 6)        73.7                 67.9               72.3               69.9
    bert-small (0,4,8,11 of 12)  78.4                 75.1               76.2               77.8
    ===========================  ===================  =================  =================  =================

Activation statistics beat weight norms for FFN units in all six comparisons (+1.2 to +2.7) and for hidden units
and heads in two of three (+0.6, +3.8; -0.4 on bert-mini), so ``activation`` is the default for both. The table's
calibration sentences were all of STS-B train, 438 of the 512 of them evaluation sentences; without those,
activation/activation scores 80.6 (bert-mini) and 72.5 (bert-tiny)."""

from __future__ import annotations

import copy
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

import torch

from raydistill import __version__
from raydistill.fileio import atomic_write_json
from raydistill.models.derive_files import copy_sentence_transformers_files, copy_tokenizer_files, quiet_progress_bars

logger = logging.getLogger(__name__)

Selection = Literal["activation", "weight_norm"]


@dataclass(frozen=True)
class _Layout:
    """Where the pieces of one encoder layer live, relative to `encoder.layer.<i>`."""

    query: str
    key: str
    value: str
    attention_output: str
    attention_norm: str
    ffn_input: str
    ffn_output: str
    ffn_norm: str
    shared_head_table: str | None = None  # a [buckets, heads] parameter shared by all layers


_BERT_LAYOUT = _Layout("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
                       "attention.output.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm",)
#: Architectures (``config.model_type``) ``derive_student`` can cut, and where each keeps its layer weights.
DERIVABLE_LAYOUTS = {
    "bert": _BERT_LAYOUT, "roberta": _BERT_LAYOUT, "xlm-roberta": _BERT_LAYOUT,
    "mpnet": _Layout(
        "attention.attn.q", "attention.attn.k", "attention.attn.v", "attention.attn.o", "attention.LayerNorm",
        "intermediate.dense", "output.dense", "output.LayerNorm", shared_head_table="encoder.relative_attention_bias",
    ),
}


def evenly_spaced_layers(num_source: int, num_target: int) -> list[int]:
    """`num_target` of `num_source` layers as evenly spaced as integers allow, keeping the first and the last.

    6 -> 3: [0, 3, 5]; 6 -> 4: [0, 2, 3, 5]; 12 -> 4: [0, 4, 7, 11]; one layer: the top one. Keeping the bottom
    layer (which reads the embeddings the student inherits) and the top one (whose output is the sentence
    embedding) scored best on STS-B dev for 3 and 4 of 6 layers (see registry.DERIVATION_PLANS)."""
    if not 1 <= num_target <= num_source:
        raise ValueError(f"cannot take {num_target} layers of {num_source}")
    if num_target == 1:
        return [num_source - 1]
    step = (num_source - 1) / (num_target - 1)
    return [int(i * step + 0.5) for i in range(num_target)]


def default_calibration_sentences(count: int = 512) -> list[str]:
    """`count` distinct STS-B train sentences spread over the file (it is grouped by genre: news, captions, forums).

    None is an evaluation sentence (``raydistill.data.evaluation_text``): STS-B was drawn from STS12-16, so 9 in 10
    of its train sentences are test sentences too, and units kept for how they fire on those would be selected on
    test data. 1,511 distinct sentences remain."""
    from raydistill.data import load_dataset
    from raydistill.data.evaluation_text import evaluation_key, evaluation_keys

    excluded = evaluation_keys()
    sentences = (s.strip() for pair in load_dataset("stsb_train") for s in (pair.sentence1, pair.sentence2))
    distinct = list(dict.fromkeys(s for s in sentences if s and evaluation_key(s) not in excluded))
    stride = max(1, len(distinct) // count)
    return distinct[::stride][:count]


@dataclass
class _Statistics:
    """Second moments gathered from one teacher pass; n_tokens real (non-padding) tokens."""

    n_tokens: int
    residual_sq: torch.Tensor  # [1 + 2 * layers, hidden]: sum of x^2 after the embedding LN and each layer's two LNs
    context_gram: torch.Tensor  # [layers, heads, d_head, d_head]: sum of c_h c_h^T
    ffn_sq: torch.Tensor  # [layers, intermediate]: sum of a_j^2


@torch.inference_mode()
def _activation_statistics(model, layout: _Layout, tokenizer, sentences: Sequence[str], batch_size: int = 32) -> _Statistics:
    config = model.config
    n_layers, hidden, n_heads = config.num_hidden_layers, config.hidden_size, config.num_attention_heads
    d_head = hidden // n_heads
    stats = _Statistics(0, torch.zeros(1 + 2 * n_layers, hidden, dtype=torch.float64),
                        torch.zeros(n_layers, n_heads, d_head, d_head, dtype=torch.float64),
                        torch.zeros(n_layers, config.intermediate_size, dtype=torch.float64))
    token_mask: dict[str, torch.Tensor] = {}

    def real_tokens(x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [N, D] without padding, float64
        return x[token_mask["mask"]].double()

    # Hooks must return None: a returned tensor would replace the module's output.
    def on_residual(state: int):
        def hook(module, args, output) -> None:
            stats.residual_sq[state].add_(real_tokens(output).pow(2).sum(0))
        return hook

    def on_context(layer: int):
        def hook(module, args) -> None:
            context = real_tokens(args[0]).view(-1, n_heads, d_head)  # [N, heads, d_head]
            stats.context_gram[layer].add_(torch.einsum("nhd,nhe->hde", context, context))
        return hook

    def on_ffn(layer: int):
        def hook(module, args) -> None:
            stats.ffn_sq[layer].add_(real_tokens(args[0]).pow(2).sum(0))
        return hook

    handles = [model.embeddings.LayerNorm.register_forward_hook(on_residual(0))]
    for i, layer in enumerate(model.encoder.layer):
        handles += [layer.get_submodule(layout.attention_norm).register_forward_hook(on_residual(1 + 2 * i)),
                    layer.get_submodule(layout.ffn_norm).register_forward_hook(on_residual(2 + 2 * i)),
                    layer.get_submodule(layout.attention_output).register_forward_pre_hook(on_context(i)),
                    layer.get_submodule(layout.ffn_output).register_forward_pre_hook(on_ffn(i))]
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(sentences), batch_size):
            features = tokenizer(list(sentences[start:start + batch_size]), padding=True, truncation=True,
                                 max_length=128, return_tensors="pt")
            token_mask["mask"] = features["attention_mask"].bool()
            stats.n_tokens += int(token_mask["mask"].sum())
            model(**features)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return stats


def _top(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest scores, in ascending index order (ties broken by lower index)."""
    order = torch.argsort(-scores.double(), stable=True)[:k]
    return torch.sort(order).values


def _share(scores: torch.Tensor, kept: torch.Tensor) -> float:
    return float(scores[kept].sum() / scores.sum())


@dataclass(frozen=True)
class _Shape:
    """The student's shape, checked against its source."""

    layers: list[int]  # source layer indices, in order
    hidden: int
    intermediate: int
    heads: int
    d_head: int  # the source's head size, kept


@dataclass
class _Kept:
    """Which source units the student keeps, and the share of the importance score they carry."""

    hidden: torch.Tensor  # [hidden'] residual-stream indices
    heads: dict[int, torch.Tensor]  # source layer -> [heads'] head indices
    ffn: dict[int, torch.Tensor]  # source layer -> [intermediate'] FFN unit indices
    hidden_share: float
    ffn_share: dict[int, float]
    calibration_sentences: int


def derive_student(
    source: str | Path, target: str | Path, *, layers: Sequence[int] | int, hidden: int | None = None,
    intermediate: int | None = None, selection: Selection = "activation", ffn_selection: Selection | None = None,
    calibration_sentences: Sequence[str] | None = None, preset: str | None = None, derived_from: str | None = None,
) -> dict[str, Any]:
    """Write to `target` a student cut out of the checkpoint at `source`; return its metadata.

    `layers`: source layer indices (in order) or a count (evenly spaced). `hidden`: residual width (None keeps all);
    the head size is kept, so heads = hidden / source head size. `intermediate`: FFN units per layer (None keeps all).
    `selection` scores hidden units and heads; `ffn_selection` (default: the same) scores FFN units.
    The result is a plain HF checkpoint (safetensors, the source's tokenizer, and its sentence-transformers pooling
    files when present) plus `raydistill_model.json`."""
    from transformers import AutoConfig

    started = time.perf_counter()
    source, target = Path(source), Path(target)
    config = AutoConfig.from_pretrained(source, local_files_only=True)
    layout = DERIVABLE_LAYOUTS.get(config.model_type)
    if layout is None:
        raise ValueError(f"{source}/config.json: field 'model_type': {config.model_type!r} cannot be derived from "
                         f"(supported: {', '.join(DERIVABLE_LAYOUTS)})")
    shape = _target_shape(config, source, layers, hidden, intermediate)
    ffn_selection = selection if ffn_selection is None else ffn_selection
    for what, value in (("selection", selection), ("ffn_selection", ffn_selection)):
        if value not in ("activation", "weight_norm"):
            raise ValueError(f"{what} must be 'activation' or 'weight_norm', not {value!r}")

    model, has_pooler = _load_source(source)
    prunes_width = shape.hidden < config.hidden_size or shape.intermediate < config.intermediate_size
    if prunes_width:
        kept = _select_units(model, layout, shape, source, selection, ffn_selection, calibration_sentences)
    else:  # layer selection only: every unit is kept, so no scores are needed
        kept = _Kept(torch.arange(config.hidden_size), {i: torch.arange(config.num_attention_heads) for i in shape.layers},
                     {i: torch.arange(config.intermediate_size) for i in shape.layers}, 1.0,
                     {i: 1.0 for i in shape.layers}, 0)
    student = _cut_weights(model, config, layout, shape, kept, has_pooler)

    target.mkdir(parents=True, exist_ok=True)
    with quiet_progress_bars():
        student.save_pretrained(target)
    copy_tokenizer_files(source, target)
    copy_sentence_transformers_files(source, target, shape.hidden)

    method = (f"layer selection {shape.layers}; hidden units and heads by {selection}, FFN units by {ffn_selection}"
              + (f" (activations of {kept.calibration_sentences} calibration sentences)"
                 if kept.calibration_sentences else "")
              if prunes_width else f"layer selection {shape.layers} only (every unit kept)")
    metadata = _metadata(config, type(model).__name__, layout, shape, kept, source, preset, derived_from, method,
                         ffn_selection if prunes_width else "none (all kept)", has_pooler, started)
    atomic_write_json(target / "raydistill_model.json", metadata)
    logger.info("Derived %s from %s (%s): layers %s, hidden %d/%d (score share %.3f), %d/%d heads of %d (%s), "
                "FFN %d/%d by %s, in %.1f s", preset or target.name, derived_from or source, source, shape.layers,
                shape.hidden, config.hidden_size, metadata["hidden_indices"]["score_share_kept"], shape.heads,
                config.num_attention_heads, shape.d_head, metadata["heads"]["per_source_layer"], shape.intermediate,
                config.intermediate_size, ffn_selection, metadata["seconds"])
    return metadata


def _target_shape(config, source: Path, layers: Sequence[int] | int, hidden: int | None,
                  intermediate: int | None) -> _Shape:
    n_source_layers, source_hidden, source_ffn = config.num_hidden_layers, config.hidden_size, config.intermediate_size
    d_head = source_hidden // config.num_attention_heads
    layers = evenly_spaced_layers(n_source_layers, layers) if isinstance(layers, int) else [int(i) for i in layers]
    hidden = source_hidden if hidden is None else hidden
    intermediate = source_ffn if intermediate is None else intermediate
    if not layers or any(not 0 <= i < n_source_layers for i in layers) or len(set(layers)) != len(layers):
        raise ValueError(f"layers {layers} must be distinct indices into the {n_source_layers} layers of {source}")
    if not 0 < hidden <= source_hidden or hidden % d_head:
        raise ValueError(f"hidden {hidden} must be a multiple of the head size {d_head} and at most {source_hidden}")
    if not 0 < intermediate <= source_ffn:
        raise ValueError(f"intermediate {intermediate} must be in 1..{source_ffn} for {source}")
    return _Shape(layers, hidden, intermediate, hidden // d_head, d_head)


def _load_source(source: Path):
    """The source encoder in fp32, and whether its checkpoint has a trained pooler."""
    from transformers import AutoModel

    # Load with a pooler, then drop it if the checkpoint has none: a pooler the loader had to invent is random.
    with quiet_progress_bars():
        model, loading_info = AutoModel.from_pretrained(source, local_files_only=True, dtype=torch.float32,
                                                        output_loading_info=True)
    missing = [k for k in loading_info["missing_keys"] if not k.startswith("pooler.")]
    if missing:
        raise ValueError(f"{source}: the checkpoint lacks weights {missing[:5]}; refusing to derive from random ones")
    has_pooler = (getattr(model, "pooler", None) is not None
                  and not any(k.startswith("pooler.") for k in loading_info["missing_keys"]))
    return model, has_pooler


def _select_units(model, layout: _Layout, shape: _Shape, source: Path, selection: Selection,
                  ffn_selection: Selection, calibration_sentences: Sequence[str] | None) -> _Kept:
    """Score hidden units, then heads and FFN units by what they contribute to the kept hidden units; keep the top."""
    from transformers import AutoTokenizer

    layers, d_head, source_heads = shape.layers, shape.d_head, model.config.num_attention_heads
    encoder_layers = model.encoder.layer
    sentences: list[str] = []
    stats = None
    if "activation" in (selection, ffn_selection):
        sentences = list(calibration_sentences) if calibration_sentences is not None else default_calibration_sentences()
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
        stats = _activation_statistics(model, layout, tokenizer, sentences)

    def weight(layer: int, module: str) -> torch.Tensor:
        return encoder_layers[layer].get_submodule(module).weight.detach().double()

    # ---- residual-stream (hidden) units
    if selection == "activation":
        kept_states = [0] + [s for i in layers for s in (1 + 2 * i, 2 + 2 * i)]
        state_energy = stats.residual_sq[kept_states]  # [states, hidden]
        hidden_scores = (state_energy / state_energy.sum(1, keepdim=True)).sum(0)
    else:
        norms = [model.embeddings.LayerNorm] + [
            encoder_layers[i].get_submodule(name) for i in layers for name in (layout.attention_norm, layout.ffn_norm)
        ]
        norm_energy = torch.stack([n.weight.detach().double() ** 2 + n.bias.detach().double() ** 2 for n in norms])
        hidden_scores = (norm_energy / norm_energy.sum(1, keepdim=True)).sum(0)
    kept_hidden = _top(hidden_scores, shape.hidden)

    # ---- attention heads: RMS (or weight) contribution of each head to the kept residual units
    head_scores = {}
    for i in layers:
        w_out = weight(i, layout.attention_output)[kept_hidden].view(shape.hidden, source_heads, d_head)  # [H', heads, dh]
        if selection == "activation":
            sigma = stats.context_gram[i] / stats.n_tokens  # [heads, dh, dh]
            head_scores[i] = torch.einsum("khd,hde,khe->h", w_out, sigma, w_out).clamp_min(0).sqrt()
        else:
            w_value = weight(i, layout.value)[:, kept_hidden].view(source_heads, d_head, shape.hidden)
            head_scores[i] = w_out.pow(2).sum((0, 2)).sqrt() * w_value.pow(2).sum((1, 2)).sqrt()
    if layout.shared_head_table is not None:
        # One relative-position table serves every layer, so every layer keeps the same heads.
        shared = sum(s / s.sum() for s in head_scores.values())
        kept_heads = {i: _top(shared, shape.heads) for i in layers}
    else:
        kept_heads = {i: _top(head_scores[i], shape.heads) for i in layers}

    # ---- FFN units
    kept_ffn, ffn_share = {}, {}
    for i in layers:
        w_down = weight(i, layout.ffn_output)[kept_hidden]  # [H', I]
        unit_scale = ((stats.ffn_sq[i] / stats.n_tokens).sqrt() if ffn_selection == "activation"
                      else weight(i, layout.ffn_input)[:, kept_hidden].norm(dim=1))
        ffn_scores = unit_scale * w_down.norm(dim=0)
        kept_ffn[i] = _top(ffn_scores, shape.intermediate)
        ffn_share[i] = _share(ffn_scores.pow(2), kept_ffn[i])
    return _Kept(kept_hidden, kept_heads, kept_ffn, _share(hidden_scores, kept_hidden), ffn_share, len(sentences))


def _cut_weights(model, config, layout: _Layout, shape: _Shape, kept: _Kept, has_pooler: bool):
    """A model of the source's class and the student's shape, every weight a slice of a source weight."""
    student_config = copy.deepcopy(config)
    student_config.num_hidden_layers, student_config.hidden_size = len(shape.layers), shape.hidden
    student_config.num_attention_heads, student_config.intermediate_size = shape.heads, shape.intermediate
    student_config.architectures = [type(model).__name__]
    student = type(model)(student_config, add_pooling_layer=has_pooler)

    def head_units(heads: torch.Tensor) -> torch.Tensor:  # head indices -> their rows in Q/K/V
        return (heads[:, None] * shape.d_head + torch.arange(shape.d_head)).reshape(-1)

    # Which axis of each weight runs over which kind of unit: (rows, columns).
    layer_axes = {
        layout.query: ("heads", "hidden"), layout.key: ("heads", "hidden"), layout.value: ("heads", "hidden"),
        layout.attention_output: ("hidden", "heads"), layout.attention_norm: ("hidden", None),
        layout.ffn_input: ("ffn", "hidden"), layout.ffn_output: ("hidden", "ffn"), layout.ffn_norm: ("hidden", None),
    }
    global_axes = {
        "embeddings.word_embeddings": (None, "hidden"), "embeddings.position_embeddings": (None, "hidden"),
        "embeddings.token_type_embeddings": (None, "hidden"), "embeddings.LayerNorm": ("hidden", None),
        "pooler.dense": ("hidden", "hidden"),
    }
    if layout.shared_head_table is not None:
        global_axes[layout.shared_head_table] = (None, "table_heads")
    layer_key = re.compile(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias)$")

    source_state = model.state_dict()
    student_state = {}
    for key, expected in student.state_dict().items():
        match = layer_key.match(key)
        if match:
            source_layer = shape.layers[int(match[1])]
            source_key = f"encoder.layer.{source_layer}.{match[2]}.{match[3]}"
            axes = layer_axes.get(match[2])
        else:
            source_layer, source_key = None, key
            axes = global_axes.get(key.rsplit(".", 1)[0])
        tensor = source_state[source_key]
        if axes is not None:
            index = {"hidden": kept.hidden,
                     "heads": head_units(kept.heads[source_layer]) if source_layer is not None else None,
                     "ffn": kept.ffn.get(source_layer), "table_heads": kept.heads[shape.layers[0]], None: None}
            rows, cols = index[axes[0]], index[axes[1]]
            if rows is not None:
                tensor = tensor.index_select(0, rows)
            if cols is not None and tensor.dim() == 2:
                tensor = tensor.index_select(1, cols)
        if tensor.shape != expected.shape:
            raise RuntimeError(f"derivation has no rule for {key} ({tuple(tensor.shape)} vs {tuple(expected.shape)})")
        student_state[key] = tensor.clone()
    student.load_state_dict(student_state, strict=True)  # every weight comes from the source: none stays random
    return student


def _metadata(config, architecture: str, layout: _Layout, shape: _Shape, kept: _Kept, source: Path,
              preset: str | None, derived_from: str | None, method: str, ffn_method: str, has_pooler: bool,
              started: float) -> dict[str, Any]:
    """``raydistill_model.json``: how the student was cut, enough to cut it again."""
    return {
        "preset": preset, "derived_from": derived_from, "source_path": str(source),
        "architecture": f"{config.model_type} ({architecture})", "layers": shape.layers,
        "shape": {"layers": len(shape.layers), "hidden": shape.hidden, "heads": shape.heads,
                  "head_dim": shape.d_head, "intermediate": shape.intermediate},
        "hidden_indices": {"kept": shape.hidden, "of": config.hidden_size,
                           "score_share_kept": round(kept.hidden_share, 4), "indices": kept.hidden.tolist()},
        "heads": {
            "count": shape.heads, "of": config.num_attention_heads, "head_dim": shape.d_head,
            "per_source_layer": {str(i): kept.heads[i].tolist() for i in shape.layers},
            "same_heads_every_layer": layout.shared_head_table is not None,
        },
        "ffn_selection": {
            "method": ffn_method, "kept": shape.intermediate, "of": config.intermediate_size,
            "score_share_kept_per_source_layer": {str(i): round(s, 4) for i, s in kept.ffn_share.items()},
        },
        "method": method, "calibration_sentences": kept.calibration_sentences, "pooler": has_pooler,
        "seconds": round(time.perf_counter() - started, 2), "raydistill_version": __version__,
    }
