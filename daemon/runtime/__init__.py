"""Runtimes: execute an imported graph on a backend over a statically planned arena."""
from .model import Model, load  # noqa: F401
