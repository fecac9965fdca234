"""The header names the compiled kernel's build that runs the model (avx512, avx2, neon) or why it is
off; a GPU's model and a server's name none."""

from types import SimpleNamespace

import pytest

from chatcli.engine.runners import kernels
from tests.ui.conftest import make_app, ready
from tests.ui.fake import FakeEngine


def engine_with(kernel: str | None, device: str = "cpu") -> FakeEngine:
    engine = FakeEngine()
    engine.runner = SimpleNamespace(device=device, dtype="float32", kernel=kernel)
    engine.device = device
    return engine


@pytest.mark.parametrize(
    ("kernel", "shown"),
    [
        ("avx2", "fake-model · cpu · float32 · kernel avx2 │"),
        ("off (CHATCLI_KERNEL=off)", "fake-model · cpu · float32 · kernel off (CHATCLI_KERNEL=off) │"),
        (None, "fake-model · cpu · float32 │"),  # off the CPU, or an engine that does not say
    ],
)
async def test_the_header_names_the_kernel(kernel, shown):
    app = make_app(engine_with(kernel))
    async with app.run_test(size=(160, 30)) as pilot:
        screen = await ready(pilot)
        assert shown in str(screen.info.render())


async def test_the_header_on_the_tiny_engine(tiny_engine):
    app = make_app(tiny_engine)
    async with app.run_test(size=(160, 30)) as pilot:
        screen = await ready(pilot)
        header = str(screen.info.render())
        native = type(tiny_engine.runner).__name__ == "NativeRunner"
        want = f"kernel {kernels.build_name()}" if native else "kernel off ("
        assert want in header and (not native or kernels.build_name() in kernels.BUILDS)


async def test_the_header_names_the_weights_and_a_load_note_is_shown():
    """A quantized GGUF run dequantized (issue 51): the header says `float32-panels`, and the loader's
    one line about why is a note in the chat."""
    engine = engine_with("avx2")
    engine.weights = "float32-panels"
    engine.note = "big.gguf is Q4_K_M, but its blocks are not read here (…): it runs dequantized, as float32-panels"
    app = make_app(engine)
    async with app.run_test(size=(160, 30)) as pilot:
        screen = await ready(pilot)
        assert "fake-model · cpu · float32-panels · kernel avx2" in str(screen.info.render())
        assert screen.pane.notes()[-1].text == f"Note: {engine.note}"
