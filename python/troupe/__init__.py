"""troupe from Python: the recipe (DeepSeek-V4 / V4.1 tokenizer, prompt encoders, stream parser)
in :mod:`troupe.recipe` and the simulated cluster in :mod:`troupe.sim` (docs/python.md)."""

from . import recipe, sim
from ._core import __version__

__all__ = ["__version__", "recipe", "sim"]
