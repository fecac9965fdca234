"""The header: the model (its name, device, weights, the chat template where it is not the model's own,
and the kernel's build, or a server's model and where it is) and the settings, on one line at every width."""

from __future__ import annotations

from chatcli.ui.format import ENGINE_RANKS, PART
from chatcli.ui.widgets.line import FittedLine


class InfoBar(FittedLine):
    """The header: the model and the settings, one line at every width (the least important parts go
    first where they do not fit)."""

    DEFAULT_CSS = "InfoBar { dock: top; background: $primary 25%; }"

    def __init__(self) -> None:
        super().__init__(name_first=True)


def engine_parts(engine) -> list[tuple[str, int]]:
    """The header's model, each part with its rank (`fit_line`): its name, device and weights, the chat
    template where it is not the model's own (`template built-in gemma`, `template raw`), and on the CPU
    the compiled kernel's build that runs it (avx512, avxvnni, avx2, neon) or why it is off; a server's
    model and where it is."""
    weights = getattr(engine, "weights", None)
    if weights is None:  # a server: its model and where it is
        return [(engine.name, 0), (engine.backend, ENGINE_RANKS["backend"])]
    kernel = getattr(getattr(engine, "runner", None), "kernel", None)
    parts = [(engine.name, 0), (engine.device, ENGINE_RANKS["device"]), (weights, ENGINE_RANKS["weights"])]
    template = getattr(engine, "template", None)
    if template and template != "model's own":
        parts.append((f"template {template}", ENGINE_RANKS["template"]))
    return parts + ([(f"kernel {kernel}", ENGINE_RANKS["kernel"])] if kernel else [])


def engine_label(engine) -> str:
    return PART.join(text for text, _rank in engine_parts(engine))
