"""BiEncoder: a transformer + pooling (+ optional projection) that maps each sentence to one vector.

This is the sentence-transformers / SBERT recipe (Reimers & Gurevych, 2019) as a plain `nn.Module`:

    h = transformer(tokens)                              # [B, T, H] token states
    mean pooling:  e = sum_t m_t h_t / max(sum_t m_t, 1e-9)   # m = attention mask, so padding never counts
    CLS pooling:   e = h_first                           # first attended token ([CLS] / <s>)
    projection:    e = act(W e + b)                      # Linear(H -> P), act = tanh by default

The projection is the `Dense(d_s -> d_t, tanh)` that ConGen and SCT-distillation append when the student's
width differs from the teacher's; it is saved with the model, so deployed embeddings are P-dimensional.

Directories round-trip with sentence-transformers: `from_pretrained` honours an ST directory's `modules.json`
(pooling mode, `max_seq_length`, Dense layer, Normalize), and `save` writes one that
`sentence_transformers.SentenceTransformer(path)` loads and that gives the same embeddings.
That directory format (reading its module chain, the files `save` adds) is `st_layout.py`'s.

A static student (`static_embedding.py`: a table E [V, D] instead of a transformer, `h = E[x]`) is a BiEncoder too:
its tokens come without [CLS]/[SEP], mean pooling averages its rows, and `save` writes a directory that
sentence-transformers (`StaticEmbedding`) and Model2Vec load; `from_pretrained` recognises such a directory. Its
projection, if any, must be linear: `save` folds it into the table, E' = E Wᵀ + b [V, P], which gives the same
sentence vectors because a mean's weights sum to 1 (a tanh after the mean would not fold)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file as save_safetensors
from torch import Tensor, nn
from transformers import AutoModel, AutoTokenizer

from raydistill.fileio import atomic_write_json
from raydistill.models.batching import (
    check_texts, config_error, forward_input_names, inference, length_sorted_batches, masked_mean,
    read_metadata, resolve_checkpoint, torch_threads, usable_max_length, write_metadata,
)
from raydistill.models import st_layout
from raydistill.models.progress import Progress
from raydistill.models.static_embedding import (
    StaticEmbeddingModel, is_static_directory, read_static_directory, write_static_directory,
)
from raydistill.models.st_layout import (
    POOLING_MODES, PROJECTION_ACTIVATIONS, activation_import_path, read_sentence_transformers_layout,
    sentence_transformers_config,
)

# Re-exported: the cross-encoder, the jobs and the scripts find a checkpoint's weights through this module.
transformer_directory = st_layout.transformer_directory


PROJECTION_INITS = ("default", "orthogonal")


def init_projection(layer: nn.Linear, mode: str = "default") -> None:
    """Initial weights of a new projection Linear(H -> P).

    "default": PyTorch's (Kaiming-uniform), what ConGen's and SCT's code get from ``models.Dense``.
    "orthogonal": W with orthonormal columns (P >= H: Wᵀ W = I) and zero bias, so <W x, W y> = <x, y> and, while
    tanh stays near its linear range (mean-pooled sentence vectors have small components), the student's cosine
    geometry survives the new layer. A student that is already a good sentence encoder (minilm-l3, layer-selected
    from all-MiniLM-L6-v2) then starts distillation from its own quality instead of from a random projection of
    it. A deviation from the authors' code, off by default. Measured for ConGen minilm-l3 <- mpnet-base (lr 1e-4,
    6,000 captions): 7-STS 71.69 with it vs 71.73 without — the random projection is not why ConGen lowers that
    student (docs/results.md, distillation results)."""
    if mode not in PROJECTION_INITS:
        raise ValueError(f"projection_init must be one of {PROJECTION_INITS}, got {mode!r}")
    if mode == "orthogonal":
        nn.init.orthogonal_(layer.weight)  # [P, H]
        if layer.bias is not None:
            nn.init.zeros_(layer.bias)


class BiEncoder(nn.Module):
    """Sentence encoder: transformer -> mean/CLS pooling -> optional Linear(H -> P) + activation.

    `forward` returns raw (not L2-normalised) embeddings with gradients; `encode` is the batched inference path.
    `normalize_in_sentence_transformers` only records whether the source ST directory ended in a Normalize
    module, so `save` writes one back and sentence-transformers users get what they had before."""

    def __init__(
        self, transformer: nn.Module, tokenizer, pooling: str = "mean", projection_dim: int | None = None,
        projection_activation: str | None = "tanh", projection_bias: bool = True, max_length: int | None = None,
        do_lower_case: bool = False, projection_init: str = "default",
        normalize_in_sentence_transformers: bool = False, metadata: dict[str, Any] | None = None,
        source: str | None = None,
    ):
        super().__init__()
        if pooling not in POOLING_MODES:
            raise ValueError(f"pooling must be one of {POOLING_MODES}, got {pooling!r}")
        self.transformer, self.tokenizer, self.pooling, self.source = transformer, tokenizer, pooling, source
        self.do_lower_case = do_lower_case
        self.normalize_in_sentence_transformers = normalize_in_sentence_transformers
        self.metadata = dict(metadata or {})
        self.max_length = usable_max_length(transformer.config, tokenizer, max_length, Path(source or "."))
        # The tokenizer then truncates the same way when used on its own or after `save`.
        self.tokenizer.model_max_length = self.max_length
        self.input_names = forward_input_names(transformer)

        hidden = transformer.config.hidden_size
        self.projection_activation = "identity" if projection_activation is None else projection_activation.lower()
        if self.projection_activation not in PROJECTION_ACTIVATIONS:
            raise ValueError(f"projection_activation {self.projection_activation!r} is not one of "
                             f"{sorted(PROJECTION_ACTIVATIONS)}")
        self.activation = PROJECTION_ACTIVATIONS[self.projection_activation]()
        self.projection = None if projection_dim is None else nn.Linear(hidden, projection_dim, bias=projection_bias)
        if self.projection is not None:
            init_projection(self.projection, projection_init)

    @classmethod
    def from_pretrained(
        cls, name_or_path: str | Path, pooling: str | None = None, projection_dim: int | None = None,
        max_length: int | None = None, projection_activation: str | None = None, projection_init: str = "default",
    ) -> BiEncoder:
        """Load a local checkpoint (plain Hugging Face or sentence-transformers directory) or a registry name.

        Arguments left as None come from the checkpoint: an ST directory's pooling mode, max_seq_length and
        Dense layer; a plain HF checkpoint defaults to mean pooling and no projection. `projection_dim` on a
        checkpoint without a Dense layer adds a freshly initialised projection (activation `projection_activation`,
        default tanh; weights by `projection_init`, see `init_projection`)."""
        directory = resolve_checkpoint(name_or_path)
        if is_static_directory(directory):
            return cls._from_static_directory(directory, pooling, projection_dim, max_length, projection_activation,
                                              projection_init)
        layout = read_sentence_transformers_layout(directory)
        transformer_dir = layout.transformer_dir if layout is not None else directory
        transformer = AutoModel.from_pretrained(transformer_dir, local_files_only=True, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(transformer_dir, local_files_only=True)

        dense = layout.dense if layout is not None else None
        if dense is not None:
            if projection_dim is not None and projection_dim != dense.out_features:
                raise ValueError(
                    f"{directory}: the checkpoint's Dense layer outputs {dense.out_features} dimensions but "
                    f"projection_dim={projection_dim} was requested; "
                    "load without projection_dim, or from the bare transformer")
            if projection_activation is not None and projection_activation.lower() != dense.activation:
                raise ValueError(f"{directory}: the checkpoint's Dense layer uses {dense.activation!r}, "
                                 f"not {projection_activation!r}")
            hidden = transformer.config.hidden_size
            if dense.in_features != hidden:
                raise config_error(layout.transformer_dir / "config.json", "hidden_size",
                                   f"{hidden}, but the Dense layer expects {dense.in_features} inputs")

        model = cls(
            transformer, tokenizer, pooling=pooling or (layout.pooling if layout is not None else "mean"),
            projection_dim=dense.out_features if dense is not None else projection_dim,
            projection_activation=dense.activation if dense is not None else (projection_activation or "tanh"),
            projection_bias=dense.bias if dense is not None else True,
            max_length=max_length if max_length is not None else (layout.max_seq_length if layout else None),
            do_lower_case=layout.do_lower_case if layout is not None else False,
            normalize_in_sentence_transformers=layout.normalize if layout is not None else False,
            projection_init=projection_init, metadata=read_metadata(directory), source=str(directory),
        )
        if dense is not None:
            weights = {key.removeprefix("linear."): value for key, value in dense.weights.items()}
            model.projection.load_state_dict(weights)
        return model.eval()  # as Hugging Face's from_pretrained: inference-ready; training code calls .train()

    @classmethod
    def _from_static_directory(cls, directory: Path, pooling: str | None, projection_dim: int | None,
                               max_length: int | None, projection_activation: str | None,
                               projection_init: str) -> BiEncoder:
        if pooling not in (None, "mean"):
            raise ValueError(f"{directory}: a static model is the mean of its token vectors; pooling={pooling!r} "
                             "is not available for it")
        transformer, tokenizer, saved_max_length, normalize = read_static_directory(directory)
        return cls(
            transformer, tokenizer, pooling="mean", projection_dim=projection_dim,
            projection_activation=projection_activation or "tanh",
            max_length=max_length if max_length is not None else saved_max_length,
            normalize_in_sentence_transformers=normalize, projection_init=projection_init,
            metadata=read_metadata(directory), source=str(directory),
        ).eval()

    @property
    def is_static(self) -> bool:
        """A static-embedding student (a token table, no transformer layers)."""
        return isinstance(self.transformer, StaticEmbeddingModel)

    @property
    def dim(self) -> int:
        return self.projection.out_features if self.projection is not None else self.transformer.config.hidden_size

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def tokenize(self, texts: list[str]) -> dict[str, Tensor]:
        """Token ids padded to the longest text in `texts`, truncated to `max_length`."""
        texts = check_texts(texts)
        if self.do_lower_case:
            texts = [text.lower() for text in texts]
        # A static model averages its token rows: [CLS]/[SEP] would add the same two rows to every sentence.
        return dict(self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length,
                                   return_tensors="pt", add_special_tokens=not self.is_static))

    def forward(self, features: dict[str, Tensor]) -> Tensor:
        """Sentence embeddings [B, D] with gradients; keys other than the model's inputs are ignored."""
        sentence_embeddings = self.pool(features)  # [B, H]
        if self.projection is not None:
            sentence_embeddings = self.activation(self.projection(sentence_embeddings))  # [B, P]
        return sentence_embeddings

    def pool(self, features: dict[str, Tensor]) -> Tensor:
        """The pooled transformer output [B, H], before the projection."""
        inputs = {name: value for name, value in features.items() if name in self.input_names}
        if "inputs_embeds" in features:  # word embeddings looked up by the caller (batching.bucketed_forward)
            inputs.pop("input_ids", None)
            inputs["inputs_embeds"] = features["inputs_embeds"]
        token_states = self.transformer(**inputs).last_hidden_state  # [B, T, H]
        attention_mask = features["attention_mask"]  # [B, T], 1 = real token
        if self.pooling == "mean":
            return masked_mean(token_states, attention_mask)  # [B, H]
        # First attended token, not index 0: the same answer with right padding, the right one with left padding.
        first = attention_mask.to(torch.int64).argmax(dim=1)  # [B]
        return token_states[torch.arange(token_states.size(0), device=first.device), first]

    @torch.no_grad()
    def fit_projection(self, texts: list[str], targets: np.ndarray, batch_size: int = 128, ridge: float = 1e-3,
                       num_threads: int | None = None) -> float:
        """Set the projection to the ridge least-squares map from this model's pooled vectors to ``targets``.

            X = [pool(texts), 1]                        # [N, H + 1]
            W = argmin ||X W - atanh(targets)||² + ridge·N·||W||²      (tanh projection; identity: targets)

        ``targets`` [N, P] are where the projected vectors should land, e.g. a teacher's L2-normalised embeddings
        of the same texts: a distillation loss that scores the student against teacher vectors then starts from a
        student already in the teacher's space instead of from a random rotation of its own. Returns the cosine
        between projected vectors and targets, averaged over the rows (how well a linear map fits)."""
        if self.projection is None:
            raise ValueError("fit_projection needs a projection layer (load with projection_dim=...)")
        inverse = {"tanh": lambda y: np.arctanh(np.clip(y, -0.999, 0.999)), "identity": lambda y: y}
        if self.projection_activation not in inverse:
            raise ValueError(f"fit_projection needs a tanh or identity projection, not {self.projection_activation!r}")
        texts = check_texts(texts)
        targets = np.asarray(targets, dtype=np.float64)
        if targets.shape != (len(texts), self.projection.out_features):
            raise ValueError(f"targets must be [{len(texts)}, {self.projection.out_features}], got {targets.shape}")
        pooled = self.encode(texts, batch_size=batch_size, num_threads=num_threads, projected=False).astype(np.float64)
        goal = inverse[self.projection_activation](targets)  # [N, P], pre-activation targets
        with_bias = self.projection.bias is not None
        design = np.hstack([pooled, np.ones((len(texts), 1))]) if with_bias else pooled  # [N, H(+1)]
        gram = design.T @ design + ridge * len(texts) * np.eye(design.shape[1])
        solution = np.linalg.solve(gram, design.T @ goal)  # [H(+1), P]
        weight = torch.as_tensor(solution[: pooled.shape[1]].T, dtype=self.projection.weight.dtype)  # [P, H]
        self.projection.weight.copy_(weight.to(self.projection.weight.device))
        if with_bias:
            self.projection.bias.copy_(torch.as_tensor(solution[-1], dtype=self.projection.bias.dtype))
        projected = self.activation(torch.as_tensor(design @ solution))  # [N, P]
        return float(F.cosine_similarity(projected, torch.as_tensor(targets), dim=1).mean())

    def encode(self, texts: list[str], batch_size: int = 128, normalize: bool = False, num_threads: int | None = None,
               progress: bool = False, projected: bool = True) -> np.ndarray:
        """Embeddings [N, D] float32 in input order; `normalize` L2-normalises each row (cosine = dot product).

        `projected=False`: the pooled transformer vectors [N, H], before the projection (what it is fitted on)."""
        texts = check_texts(texts)
        if self.is_static:
            return self._encode_static(texts, normalize, num_threads, projected)
        dim = self.dim if projected else self.transformer.config.hidden_size
        embed = self.forward if projected else self.pool
        embeddings = np.zeros((len(texts), dim), dtype=np.float32)
        batches = length_sorted_batches([len(text) for text in texts], batch_size)
        bar = Progress(len(batches), "encode", progress)
        device = self.device
        try:
            with torch_threads(num_threads), inference(self):
                for batch in batches:
                    features = self.tokenize([texts[i] for i in batch])
                    features = {name: value.to(device) for name, value in features.items()}
                    batch_embeddings = embed(features)  # [b, D] (or [b, H] unprojected)
                    if normalize:
                        batch_embeddings = F.normalize(batch_embeddings, p=2, dim=-1)
                    embeddings[batch] = batch_embeddings.float().cpu().numpy()
                    bar.update()
        finally:
            bar.close()
        return embeddings

    def _encode_static(self, texts: list[str], normalize: bool, num_threads: int | None,
                       projected: bool) -> np.ndarray:
        """``encode`` of a static model, the same vectors without padding: the tokenizer's batch call gives each
        text's ids, and one ``embedding_bag`` takes every text's mean row. Padded batches of a token table spend
        most of their time building and masking the padding (4x slower than Model2Vec's own encode here)."""
        chunk = 8192  # texts per tokenizer call: bounds the id tensor, still one Rust batch
        embeddings = np.zeros((len(texts), self.dim if projected else self.transformer.config.hidden_size),
                              dtype=np.float32)
        with torch_threads(num_threads), inference(self):
            for start in range(0, len(texts), chunk):
                part = texts[start:start + chunk]
                if self.do_lower_case:
                    part = [text.lower() for text in part]
                ids = self.tokenizer(part, truncation=True, max_length=self.max_length, add_special_tokens=False,
                                     return_attention_mask=False)["input_ids"]
                lengths = torch.tensor([len(row) for row in ids])  # [b]
                flat = torch.tensor([token for row in ids for token in row], dtype=torch.long)  # [sum of lengths]
                offsets = torch.cumsum(lengths, 0) - lengths  # [b]: where each text's ids start in flat
                table = self.transformer.get_input_embeddings().weight  # [V, H]
                vectors = F.embedding_bag(flat.to(table.device), table, offsets.to(table.device), mode="mean")
                if projected and self.projection is not None:
                    vectors = self.activation(self.projection(vectors))  # [b, P]
                if normalize:
                    vectors = F.normalize(vectors, p=2, dim=-1)
                embeddings[start:start + len(part)] = vectors.float().cpu().numpy()
        return embeddings

    def save(self, path: str | Path) -> None:
        """Write a sentence-transformers directory (+ raydistill_model.json) that reproduces `encode`'s vectors.

        The pooling config uses the legacy boolean flags and modules.json the `sentence_transformers.models.*`
        names because every sentence-transformers release (2.x to 6.x) reads those."""
        directory = Path(path)
        directory.mkdir(parents=True, exist_ok=True)
        if self.is_static:
            self._save_static(directory)
            return
        self.transformer.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        atomic_write_json(directory / "sentence_bert_config.json",
                          {"max_seq_length": self.max_length, "do_lower_case": self.do_lower_case})

        pooling_config = {
            "word_embedding_dimension": self.transformer.config.hidden_size,
            "pooling_mode_cls_token": self.pooling == "cls", "pooling_mode_mean_tokens": self.pooling == "mean",
            "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
        }
        (directory / "1_Pooling").mkdir(exist_ok=True)
        atomic_write_json(directory / "1_Pooling" / "config.json", pooling_config)

        modules = [("", "Transformer"), ("1_Pooling", "Pooling")]
        if self.projection is not None:
            dense_dir = directory / f"{len(modules)}_Dense"
            dense_dir.mkdir(exist_ok=True)
            atomic_write_json(dense_dir / "config.json", {
                "in_features": self.projection.in_features, "out_features": self.projection.out_features,
                "bias": self.projection.bias is not None,
                "activation_function": activation_import_path(self.projection_activation),
            })
            tensors = {f"linear.{key}": value.detach().cpu().contiguous()
                       for key, value in self.projection.state_dict().items()}
            save_safetensors(tensors, str(dense_dir / "model.safetensors"))
            modules.append((dense_dir.name, "Dense"))
        if self.normalize_in_sentence_transformers:
            normalize_dir = directory / f"{len(modules)}_Normalize"
            normalize_dir.mkdir(exist_ok=True)
            modules.append((normalize_dir.name, "Normalize"))
        atomic_write_json(directory / "modules.json", [
            {"idx": index, "name": str(index), "path": subdir, "type": f"sentence_transformers.models.{kind}"}
            for index, (subdir, kind) in enumerate(modules)
        ])
        atomic_write_json(directory / "config_sentence_transformers.json", sentence_transformers_config())
        write_metadata(directory, self.metadata, {
            "kind": "bi_encoder", "pooling": self.pooling, "dim": self.dim,
            "projection_dim": self.projection.out_features if self.projection is not None else None,
            "projection_activation": self.projection_activation if self.projection is not None else None,
            "max_length": self.max_length, "model_type": self.transformer.config.model_type,
            "parameters": sum(p.numel() for p in self.parameters()), "source": self.source,
        })

    def _save_static(self, directory: Path) -> None:
        """The static directory (static_embedding.py's format), the projection folded into the table."""
        table = self.transformer.embeddings.weight.detach().cpu().float()  # [V, D]
        folded = None
        if self.projection is not None:
            if self.projection_activation != "identity":
                raise ValueError(
                    f"a static model with a {self.projection_activation} projection cannot be saved as a static "
                    "model: only a linear projection folds into the token table (build it with "
                    "projection_activation='identity')")
            weight = self.projection.weight.detach().cpu().float()  # [P, D]
            # mean_t(E[x_t]) Wᵀ + b = mean_t(E[x_t] Wᵀ + b): the mean's weights sum to 1, so the bias folds too
            table = table @ weight.T  # [V, P]
            if self.projection.bias is not None:
                table = table + self.projection.bias.detach().cpu().float()
            folded = {"in_features": self.projection.in_features, "out_features": self.projection.out_features}
        write_static_directory(directory, table, self.tokenizer, max_length=self.max_length,
                               normalize=self.normalize_in_sentence_transformers,
                               config={"tokenizer_name": self.metadata.get("derived_from") or self.source})
        atomic_write_json(directory / "config_sentence_transformers.json", sentence_transformers_config())
        write_metadata(directory, self.metadata, {
            "kind": "bi_encoder", "pooling": "mean", "dim": int(table.shape[1]), "projection_dim": None,
            "folded_projection": folded, "max_length": self.max_length, "model_type": "static",
            "parameters": int(table.numel()), "source": self.source,
        })
