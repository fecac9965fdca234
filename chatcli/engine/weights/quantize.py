"""`--quantize int8`: dynamic int8 on CPU (int8 weights, int8 activations per call).

Weights are quantized once, at conversion (`layouts.pack_int8`), symmetric per output
row, after SmoothQuant moved half the range of the MLP down projection's outlier input
channels into its weight (`down_smoothing`: silu(gate) * up has a few channels far larger
than the rest, which one activation scale would lose). The compiled kernel (`native`)
quantizes activations per row, prefill included.

Where the kernel cannot run, the torch lean runner uses torch's fbgemm/x86 kernels over the
same int8 weights for decode steps only (one row: its activation scale is exact per token),
and prefills on the dense weights: `Int8Dense`. On CPUs without VNNI, `reduce_range` keeps
activations to 7 bits, which avoids the int16 saturation of AVX2's u8×s8 instructions (and
costs some accuracy); with VNNI the full 8 bits are used. `quantize_hf_model` is a quantized
copy of a transformers model for the HF runner.
"""

from __future__ import annotations

import warnings

import torch


class QuantizeError(ValueError):
    """The requested quantization is not available here; the message says why."""


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
            self._prepack(torch.quantize_per_channel(w, scales.double(), zero_points, 0, torch.qint8))

    @classmethod
    def from_int8(cls, q: torch.Tensor, scale: torch.Tensor) -> Int8Dense:
        """Over weights quantized already: `q [out, in]` int8, `scale [out]` (a lean int8 file's)."""
        self = cls.__new__(cls)
        zero_points = torch.zeros(q.shape[0], dtype=torch.long)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            qweight = torch._make_per_channel_quantized_tensor(q.contiguous(), scale.double(), zero_points, 0)
            self._prepack(qweight)
        return self

    def _prepack(self, qweight: torch.Tensor) -> None:  # [out, in] qint8
        pick_engine()
        self.packed = torch.ops.quantized.linear_prepack(qweight, None)
        self.nbytes = qweight.numel() + 8 * qweight.shape[0]

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


# Calibration for the smoothing below: prose, a list, code and numbers, unlike the bench's
# perplexity text, so the quality check does not measure the text it was calibrated on.
CALIBRATION_TEXT = """\
<|im_start|>user
Can you explain how a bicycle stays upright, and give me a short Python example that sorts a list?<|im_end|>
<|im_start|>assistant
A moving bicycle stays upright mostly because the rider steers into the direction of a fall, which moves the
wheels back under the centre of mass. The front fork's geometry helps: the contact patch trails behind the
steering axis, so the wheel turns into a lean by itself.

1. Speed makes small corrections enough.
2. Gyroscopic effects from the wheels are real but small.
3. At walking pace, balance needs larger steering movements.

```python
def sort_scores(scores: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(scores.items(), key=lambda item: item[1], reverse=True)

print(sort_scores({"ada": 91.5, "bob": 78.0, "cy": 88.25}))
```

In 1817, Karl Drais rode his two-wheeled running machine 14 km in about an hour.<|im_end|>
"""


def calibration_ids(tokenizer) -> list[int]:
    return tokenizer.encode(CALIBRATION_TEXT)


SMOOTH_ALPHA = 0.5  # SmoothQuant's migration strength: half the outlier range moves into the weight


def down_smoothing(model, ids: list[int], alpha: float = SMOOTH_ALPHA) -> list[torch.Tensor]:
    """Per layer, SmoothQuant scales `s [F]` for the MLP's down projection (Xiao et al., 2023).

    The down projection's inputs, silu(gate) * up, have a few channels far larger than the
    rest, and one per-tensor activation scale then leaves the others with a bit or two. With
    `s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)`, measured on `ids` through the model,
    `X / s` and `W * s` give the same product with both ranges flattened.
    """
    maxima: dict[int, torch.Tensor] = {}
    hooks = []
    layers = model.model.layers
    for i, block in enumerate(layers):

        def record(_module, args, i=i):
            seen = args[0].detach().abs().flatten(0, -2).amax(0).float()  # [F]
            maxima[i] = torch.maximum(maxima[i], seen) if i in maxima else seen

        hooks.append(block.mlp.down_proj.register_forward_pre_hook(record))
    try:
        with torch.inference_mode():
            model(torch.tensor([ids], device=model.device))
    finally:
        for hook in hooks:
            hook.remove()
    scales = []
    for i, block in enumerate(layers):
        w_max = block.mlp.down_proj.weight.detach().abs().amax(0).float()  # [F]
        s = maxima[i].clamp_min(1e-5).pow(alpha) / w_max.clamp_min(1e-5).pow(1 - alpha)
        scales.append(s.clamp_min(1e-5).to(block.mlp.down_proj.weight.dtype))
    return scales
