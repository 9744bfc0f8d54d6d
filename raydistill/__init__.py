"""raydistill: distil large sentence encoders into small, fast ones on Ray."""

__version__ = "0.1.0"
