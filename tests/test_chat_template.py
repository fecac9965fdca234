"""A model's chat template is untrusted code: whatever it does, a render is bounded in time and output,
stopped by a cancel flag, and its fault is one line (`chatcli.engine.text.template`), for both
tokenizers (`FolderTokenizer`, `TransformersTokenizer`)."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from chatcli.engine import ChatTemplateError, PromptCancelled
from chatcli.engine.text import template
from chatcli.engine.text.tokenize import FolderTokenizer, TransformersTokenizer
from tests.tiny import CHATML, build_tokenizer

HI = [{"role": "user", "content": "hi"}]
LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"

# what a hostile or broken template does, and a piece of the one line that must name it
FAULTS = {
    "raises": ("{{ raise_exception('Conversation roles must alternate') }}", "roles must alternate"),
    "includes": ("x\n{% include 'secret.txt' %}", "at line 2"),
    "probes": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "'__class__'"),
    "recurses": ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "RecursionError"),
    "repeats": ("{{ 'x' * 20000000000 }}", "20,000,000,000"),
    "powers": ("{{ 2 ** 10000000000 }}", "bits"),
    "undefined": ("{{ nothing.here }}", "undefined"),
}


@pytest.fixture(scope="module")
def hf_tokenizer():
    return build_tokenizer()


@pytest.fixture(params=["folder", "transformers"])
def tokenizer_with(request, hf_tokenizer, tmp_path):
    """A function: chat template source → that template's tokenizer, of each kind."""

    def make(source: str):
        if request.param == "folder":
            hf_tokenizer.save_pretrained(tmp_path)
            (tmp_path / "chat_template.jinja").write_text(source, encoding="utf-8")
            return FolderTokenizer(tmp_path)
        hf_tokenizer.chat_template = source
        return TransformersTokenizer(hf_tokenizer)

    yield make
    hf_tokenizer.chat_template = CHATML


def one_line_error(tokenizer, messages=HI, **kwargs) -> str:
    with pytest.raises(ChatTemplateError) as caught:
        tokenizer.encode_chat(messages, **kwargs)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("the chat template ") and len(message) < 300, message
    return message


@pytest.mark.parametrize("fault", FAULTS)
def test_a_failing_template_is_one_line_naming_its_fault(tokenizer_with, fault):
    source, named = FAULTS[fault]
    assert named in one_line_error(tokenizer_with(source))


def test_a_template_that_does_not_parse_is_one_line(tmp_path, hf_tokenizer):
    hf_tokenizer.save_pretrained(tmp_path)
    (tmp_path / "chat_template.jinja").write_text("hi\n{% for m in messages %}", encoding="utf-8")
    with pytest.raises(ChatTemplateError, match="does not parse at line 2"):
        FolderTokenizer(tmp_path)


@pytest.mark.parametrize(
    "source",
    [LOOPS, "{% set s = 'ab' * 100000 %}{% for c in s %}{% for d in s %}{% endfor %}{% endfor %}"],
    ids=["ranges", "characters"],
)
def test_a_template_that_loops_stops_at_the_time_limit(tokenizer_with, monkeypatch, source):
    monkeypatch.setattr(template, "TEMPLATE_TIME_LIMIT_S", 0.5)
    t0 = time.monotonic()
    assert "took longer than 0.5 s" in one_line_error(tokenizer_with(source))
    assert time.monotonic() - t0 < 3


def test_a_template_that_writes_without_end_stops_at_the_output_limit(tokenizer_with, monkeypatch):
    monkeypatch.setattr(template, "TEMPLATE_OUTPUT_LIMIT", 100_000)
    source = "{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}"
    assert "wrote more than 100,000 characters" in one_line_error(tokenizer_with(source))


def test_a_cancel_stops_a_looping_render_at_once(tokenizer_with):
    tokenizer = tokenizer_with(LOOPS)
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    t0 = time.monotonic()
    with pytest.raises(PromptCancelled):
        tokenizer.encode_chat(HI, cancel=cancel)
    assert time.monotonic() - t0 < 1.0  # the 0.2 s wait, then a watchdog tick or two


def test_the_watchdog_never_strikes_after_a_render_returned(tokenizer_with, monkeypatch):
    """Renders of many lengths, each past its deadline at once, with the threads switching often: each
    either returns its text or fails as the template's fault (the shot landing anywhere, at its end
    too), and no stray exception lands afterwards in the caller's code."""
    monkeypatch.setattr(template, "TEMPLATE_TIME_LIMIT_S", 0.0)
    monkeypatch.setattr(template, "TICK_S", 0.0005)
    tokenizer = tokenizer_with("{% for i in range(messages[0]['content'] | int) %}{{ i % 7 }}{% endfor %}")
    outcomes = []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        for n in range(300):
            try:
                tokenizer.encode_chat([{"role": "user", "content": str(n * 10)}])
                outcomes.append("rendered")
            except ChatTemplateError:
                outcomes.append("stopped")
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.3:  # bytecode steps where a late shot would land
            pass
    finally:
        sys.setswitchinterval(interval)
    assert outcomes.count("stopped") > 10 and outcomes.count("rendered") > 10


def test_a_normal_template_renders_as_transformers_does(tokenizer_with, hf_tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, *HI, {"role": "assistant", "content": "ok"}, *HI]
    tokenizer = tokenizer_with(CHATML)
    expected = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert tokenizer.encode_chat(messages) == list(expected)


# -- through the engine ---------------------------------------------------------


@pytest.fixture
def looping_engine(tiny_lean):
    hf = tiny_lean.tokenizer.tokenizer
    hf.chat_template = LOOPS
    yield tiny_lean
    hf.chat_template = CHATML


def test_fit_prompt_cancelled_while_the_template_loops(looping_engine):
    from chatcli.engine import SamplingParams

    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    t0 = time.monotonic()
    with pytest.raises(PromptCancelled):
        looping_engine.fit_prompt(HI, SamplingParams(max_tokens=4), cancel)
    assert time.monotonic() - t0 < 1.0


def test_a_turn_cancelled_while_the_template_loops_ends_cancelled(looping_engine):
    from chatcli.engine import Finished, Prefilled, SamplingParams

    session = looping_engine.new_session()
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    t0 = time.monotonic()
    events = list(looping_engine.generate(HI, session, SamplingParams(max_tokens=4), cancel))
    assert time.monotonic() - t0 < 1.0
    assert isinstance(events[0], Prefilled) and events[0].prompt_tokens is None
    assert isinstance(events[-1], Finished) and events[-1].finish_reason == "cancelled" and events[-1].reply == ""
    assert len(session.cache) == 0


def test_fit_prompt_drops_exchanges_that_write_past_the_output_limit(tiny_lean, monkeypatch):
    """A conversation whose whole text passes the output limit is one that does not fit: its newest
    exchanges are kept, as for one longer than the context."""
    from chatcli.engine import SamplingParams

    messages = [{"role": "system", "content": "S"}]
    for i in range(30):
        messages += [{"role": "user", "content": f"q{i} " * 20}, {"role": "assistant", "content": "a " * 20}]
    messages.append({"role": "user", "content": "last"})
    monkeypatch.setattr(template, "TEMPLATE_OUTPUT_LIMIT", 600)
    ids, dropped = tiny_lean.fit_prompt(messages, SamplingParams(max_tokens=4))
    assert dropped > 0 and tiny_lean.tokenizer.decode(ids).rstrip().endswith("last\nassistant")


def test_a_failing_template_is_one_line_in_the_one_shot(tiny_model_dir, tmp_path):
    """Through the front end too: the template's fault on stderr in one line, exit 1, no traceback."""
    import os
    import shutil
    import subprocess

    folder = shutil.copytree(tiny_model_dir, tmp_path / "raising")
    (folder / "chat_template.jinja").write_text(FAULTS["raises"][0], encoding="utf-8")
    env = {**os.environ, "CHATCLI_CONFIG": str(tmp_path / "config.toml"), "CHATCLI_DATA_DIR": str(tmp_path / "data")}
    argv = [sys.executable, "-m", "chatcli", "-m", str(folder), "--device", "cpu", "-p", "hi", "--no-save"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("chatcli: error: the chat template failed") and "roles must alternate" in line, line
