"""FP8 on Paddle: exact formats, a readiness verdict per recipe, and a CPU rehearsal.

- :mod:`.formats`: float32 -> e4m3fn / e5m2 as CUDA's saturating conversion rounds.
- :mod:`.blocks`: that rounding per block in one compiled pass, with the saturated/flushed counts and the amax.
- :mod:`.readiness`: which FP8 recipe this GPU, CUDA, cuBLAS and Paddle can run, and why not.
- :mod:`.kernels`: Paddle's FP8 kernels emulated with the CUDA sources' arithmetic.
- :mod:`.helpers`: the bfloat16 helpers PaddleFormers' fp8_utils calls that a CPU lacks.
- :mod:`.emulation`: :func:`fp8_emulation`, installing the emulations for a ``with`` block.
- :mod:`.linear`: :func:`fp8_linears`, any model's ``nn.Linear`` layers as FP8 linears under a recipe.
- :mod:`.stats`: :class:`Fp8Stats`, what FP8 loses per layer, tensor and step (a bounded window of steps).
- :mod:`.reduction`: one tensor's records reduced to the worst of them, one record at a time.
- :mod:`.advice`: :func:`diagnose` (the doctor) and :func:`advise_fp8` (``fp8_exclude_layers``).
- :mod:`.script`: :func:`run_script_fp8`, a training script run with FP8 rehearsed (``doctor --fp8``).
"""

from __future__ import annotations

from .advice import advise_fp8, diagnose
from .blocks import Quantized, block_amax, quantize_blocks
from .emulation import fp8_emulation
from .formats import E4M3FN, E5M2, Fp8Format, quantize
from .linear import Fp8Recipe, fp8_linears
from .readiness import RECIPES, Fp8Software, RecipeVerdict, fp8_readiness, probe_software
from .script import Fp8ScriptRun, run_script_fp8
from .stats import Fp8Stats, QuantRecord

__all__ = ["E4M3FN", "E5M2", "RECIPES", "Fp8Format", "Fp8Recipe", "Fp8ScriptRun", "Fp8Software", "Fp8Stats",
           "QuantRecord", "Quantized", "RecipeVerdict", "advise_fp8", "block_amax", "diagnose", "fp8_emulation",
           "fp8_linears", "fp8_readiness", "probe_software", "quantize", "quantize_blocks", "run_script_fp8"]
