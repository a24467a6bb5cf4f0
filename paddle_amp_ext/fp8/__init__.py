"""FP8 on Paddle: exact formats, a readiness verdict per recipe, and a CPU rehearsal.

- :mod:`.formats`: float32 -> e4m3fn / e5m2 as CUDA's saturating conversion rounds.
- :mod:`.readiness`: which FP8 recipe this GPU, CUDA, cuBLAS and Paddle can run, and why not.
"""

from __future__ import annotations

from .formats import E4M3FN, E5M2, Fp8Format, quantize
from .readiness import RECIPES, Fp8Software, RecipeVerdict, fp8_readiness, probe_software

__all__ = ["E4M3FN", "E5M2", "RECIPES", "Fp8Format", "Fp8Software", "RecipeVerdict", "fp8_readiness",
           "probe_software", "quantize"]
