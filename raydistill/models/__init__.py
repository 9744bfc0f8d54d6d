"""Pure torch + transformers models: BiEncoder, CrossEncoder and the offline model registry.

The registry names (`resolve_model`, `ModelNotAvailableError`, `PRESETS`, `describe_presets`) are imported on
first use, so `from raydistill.models import BiEncoder` works even where the registry module is absent."""

from raydistill.models.bi_encoder import BiEncoder
from raydistill.models.cross_encoder import CrossEncoder

REGISTRY_NAMES = ("resolve_model", "ModelNotAvailableError", "PRESETS", "describe_presets")

__all__ = ["BiEncoder", "CrossEncoder", *REGISTRY_NAMES]


def __getattr__(name: str):
    if name in REGISTRY_NAMES:
        from raydistill.models import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'raydistill.models' has no attribute {name!r}")
