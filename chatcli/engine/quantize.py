"""`--quantize int8`: dynamic int8 on CPU (int8 weights, int8 activations per call).

Weights are quantized once, symmetric per output channel, and packed for torch's
fbgemm/x86 kernels; each call quantizes the activations per tensor and multiplies in
int8 with int32 accumulation. This is what pays on CPUs without fast bf16: decode
reads a quarter of the fp32 weight bytes. On CPUs without VNNI, `reduce_range` keeps
activations to 7 bits, which avoids the int16 saturation of AVX2's u8×s8 instructions
(and costs some accuracy); with VNNI the full 8 bits are used.

The lean runner quantizes every projection but the MLP's down projection, whose inputs
(silu(gate) * up) have outlier channels that per-tensor activations lose; the output
head is quantized too. Two entry points: `Int8Dense`, a projection for the lean runner, and
`quantize_hf_model`, a quantized copy of a transformers model for the HF runner.
"""

from __future__ import annotations

import warnings

import torch

QUANTIZE_CHOICES = ("int8",)


class QuantizeError(ValueError):
    """The requested quantization is not available here; the message says why."""


def check_quantize(quantize: str | None, device: str) -> None:
    if quantize is None:
        return
    if quantize not in QUANTIZE_CHOICES:
        raise QuantizeError(f"--quantize must be one of {', '.join(QUANTIZE_CHOICES)}, got {quantize!r}")
    if device != "cpu":
        raise QuantizeError(f"--quantize int8 runs on the CPU only (the model is on {device}); use --device cpu")
    pick_engine()


def pick_engine() -> str:
    engines = torch.backends.quantized.supported_engines
    for name in ("x86", "fbgemm"):
        if name in engines:
            if torch.backends.quantized.engine != name:
                torch.backends.quantized.engine = name
            return name
    raise QuantizeError("--quantize int8: this torch build has no x86/fbgemm int8 kernels")


def needs_reduce_range() -> bool:
    """7-bit activations unless the CPU has VNNI: AVX2/AVX-512 without it multiply u8×s8 into a
    saturating int16 (fbgemm's reason to default to reduce_range); VNNI accumulates in int32."""
    from chatcli.engine.cpu import has_vnni

    return not has_vnni()


REDUCE_RANGE = needs_reduce_range()  # 7-bit activations cost about 6 % perplexity on SmolLM2-135M


class Int8Dense:
    """`x [S, in] -> [S, out]` with an int8 weight, per-channel scales, int8 dynamic activations."""

    def __init__(self, weight: torch.Tensor) -> None:  # weight: [out, in] float
        w = weight.detach().float()
        scales = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-8)  # [out]
        zero_points = torch.zeros(w.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # torch marks quantized tensors deprecated; the kernels are current
            warnings.simplefilter("ignore")
            qweight = torch.quantize_per_channel(w, scales.double(), zero_points, 0, torch.qint8)  # [out, in]
            self.packed = torch.ops.quantized.linear_prepack(qweight, None)
        self.nbytes = w.numel() + 8 * w.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self.packed, REDUCE_RANGE)


def quantize_hf_model(model):
    """A dynamically quantized copy of a transformers model (every nn.Linear, the output head included)."""
    import copy

    pick_engine()
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)
