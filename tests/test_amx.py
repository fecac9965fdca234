"""AMX's tiles for a prompt's chunk (project_amx.h): a K-quant model gives the same bits whether its rows
run 16 at a time on AMX, on VNNI, or one at a time, in every layer (the CPU must have amx_int8)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from tests.gguf_models import Q4_K_M, tiny
from tests.gguf_runs import direct_runner

pytest.importorskip("gguf")


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_prompt_on_amx_gives_the_bits_of_vnni_and_of_single_steps(amx, tmp_path, family):
    runner = direct_runner(tiny(family, True), Q4_K_M, tmp_path)
    ids = [int(i) for i in np.random.default_rng(3).integers(3, 500, size=40)]
    on_amx = runner.verify(ids, runner.new_cache())  # [40, V]: two passes of 16 rows on AMX, 8 on VNNI
    amx.chatcli_amx(ctypes.c_int32(0))
    on_vnni = runner.verify(ids, runner.new_cache())
    cache = runner.new_cache()
    single = np.stack([runner.forward([t], cache) for t in ids])
    assert np.array_equal(on_amx, on_vnni)
    assert np.array_equal(on_amx, single)
