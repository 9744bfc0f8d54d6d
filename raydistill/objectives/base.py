"""What every objective returns, and how it reads its inputs.

Every loss of ``raydistill.objectives`` is an ``nn.Module`` called as

    output = loss_module(features, labels)      # features: dict[str, Tensor]; labels: Tensor | None
    output.loss.backward()                      # a scalar with gradients to the student
    output.parts                                # {"con": 3.1, "gen": 3.4, ...} plain floats for logging

Inputs are embeddings or logits, never text or models: the caller runs the student (with gradients) and the
teacher / reference passes (without), so the losses stay pure torch and know nothing of Ray or tokenizers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

__all__ = ["LossOutput", "check_dim", "check_same_rows", "frozen", "take", "take_optional"]


@dataclass
class LossOutput:
    """``loss``: the scalar to back-propagate. ``parts``: its named components as floats (logged, never
    back-propagated), e.g. ConGen's ``{"con": ..., "gen": ...}``."""

    loss: Tensor
    parts: dict[str, float] = field(default_factory=dict)


def take(features: dict[str, Tensor], key: str, owner: str, *, aliases: tuple[str, ...] = (), ndim: int = 2) -> Tensor:
    """``features[key]`` (or the first alias present) as a tensor of ``ndim`` dims, else an error that names the
    loss, the missing key and the keys that were given."""
    if not isinstance(features, dict):
        raise TypeError(f"{owner}: features must be a dict of tensors, got {type(features).__name__}")
    for name in (key, *aliases):
        if name in features:
            value = features[name]
            if not isinstance(value, Tensor):
                raise TypeError(f"{owner}: features[{name!r}] must be a torch.Tensor, got {type(value).__name__}")
            if value.dim() != ndim:
                raise ValueError(f"{owner}: features[{name!r}] must have {ndim} dims, got shape {tuple(value.shape)}")
            return value
    wanted = " or ".join(repr(n) for n in (key, *aliases))
    raise KeyError(f"{owner}: features has no {wanted}; given: {sorted(features)}")


def take_optional(features: dict[str, Tensor], key: str, owner: str, *, ndim: int = 2) -> Tensor | None:
    return take(features, key, owner, ndim=ndim) if key in features else None


def frozen(tensor: Tensor) -> Tensor:
    """A teacher / reference input, detached whatever the caller did: a caller that forgot ``no_grad`` would
    silently train the teacher side too (the target would chase the prediction)."""
    return tensor.detach()


def check_same_rows(owner: str, **tensors: Tensor) -> int:
    rows = {name: t.shape[0] for name, t in tensors.items()}
    if len(set(rows.values())) != 1:
        raise ValueError(f"{owner}: inputs must have the same batch size, got {rows}")
    batch = next(iter(rows.values()))
    if batch == 0:
        raise ValueError(f"{owner}: empty batch")
    return batch


def check_dim(owner: str, expected: int, hint: str = "", **tensors: Tensor) -> None:
    for name, tensor in tensors.items():
        if tensor.shape[-1] != expected:
            raise ValueError(f"{owner}: {name} has dim {tensor.shape[-1]}, expected {expected}{hint}")


def validate_temperature(owner: str, name: str, value: float) -> float:
    value = float(value)
    if not value > 0:
        raise ValueError(f"{owner}: {name} must be > 0, got {value}")
    return value
