"""The TUI over HTTP: the same screen on a remote engine (a real `chatcli serve` on a loopback port,
or a server that fails on purpose) as on the in-process one."""

from __future__ import annotations

import re

import pytest

from chatcli.engine.load.sources import embedded_gguf
from chatcli.engine.params import SamplingParams
from chatcli.engine.remote import RemoteEngine
from chatcli.options import StartOptions
from chatcli.ui.widgets.chat_pane import ReplyBox, UserMessage
from tests.faults import fault_app
from tests.servers import ALIAS, Server, slow_endless
from tests.ui.conftest import command, make_app, ready, send, wait_for
from tests.ui.fake import FakeEngine

GREEDY = StartOptions(params=SamplingParams(temperature=0, max_tokens=12))


@pytest.fixture
def faults():
    server = Server(fault_app()).start()
    yield server
    server.stop()


async def replies(engine, prompts) -> list[tuple[str, str, str]]:
    """Each reply's text, how it ended and the prompt panel's line, as the TUI shows them."""
    app = make_app(engine, GREEDY)
    out = []
    async with app.run_test(size=(110, 36)) as pilot:
        screen = await ready(pilot)
        for prompt in prompts:
            await send(pilot, prompt)
            last = screen.conversation.messages[-1]
            out.append((last.content, last.finish_reason, screen.panels.values["prompt"]))
    return out


async def test_the_tui_over_http_gives_the_in_process_replies_and_the_servers_cache_hits(tiny_lean, serve):
    prompts = ["What is the capital of France?", "And of Spain?"]
    here = await replies(tiny_lean, prompts)
    server = serve(tiny_lean)
    there = await replies(RemoteEngine(server.url).connect(), prompts)
    assert [r[:2] for r in there] == [r[:2] for r in here]
    assert there[1][2] == here[1][2]  # "N cached + M new": the server's usage says what the engine did here


async def test_backend_and_models_say_what_answers(tiny_lean, serve):
    server = serve(tiny_lean)
    app = make_app(RemoteEngine(server.url).connect(), GREEDY)
    async with app.run_test(size=(110, 36)) as pilot:
        await ready(pilot)
        backend = await command(pilot, "/backend")
        limit = tiny_lean.context_limit
        assert backend.text == f"backend: {server.url}/v1 · model {tiny_lean.name} · context {limit}"
        await command(pilot, "/models")
        notes = pilot.app.chat_screen.pane.notes
        await wait_for(pilot, lambda: notes()[-1].text == f"models: [{tiny_lean.name}], {ALIAS}")


async def test_model_over_the_api_refuses_a_name_the_server_does_not_serve(tiny_lean, serve):
    """/model NAME with --api: a name the server does not list is refused at once, the model answering
    keeps answering; one it lists (an alias) is switched to."""
    server = serve(tiny_lean)
    start = StartOptions(api=server.url, params=SamplingParams(temperature=0, max_tokens=12))
    app = make_app(RemoteEngine(server.url).connect(), start)
    async with app.run_test(size=(110, 36)) as pilot:
        screen = await ready(pilot)
        await command(pilot, "/model nosuch-model")
        refused = f"/model nosuch-model: {server.url}/v1/models lists no model 'nosuch-model'"
        await wait_for(pilot, lambda: screen.pane.notes()[-1].text.startswith(refused))
        assert f"still answering with {tiny_lean.name}" in screen.pane.notes()[-1].text
        assert screen.engine.name == tiny_lean.name
        await command(pilot, f"/model {ALIAS}")
        await wait_for(pilot, lambda: screen.engine.name == ALIAS)


async def test_the_in_process_backend_says_so(tiny_lean):
    app = make_app(tiny_lean)
    async with app.run_test() as pilot:
        screen = await ready(pilot)
        assert (await command(pilot, "/backend")).text.startswith("backend: in-process (LeanRunner) · model ")
        await command(pilot, "/models")  # the one loaded, and what else /model takes here: the models on disk
        loaded = re.compile(rf"loaded +\[{re.escape(tiny_lean.name)}\]")
        await wait_for(pilot, lambda: loaded.match(screen.pane.notes()[-1].text))
        if embedded_gguf() is not None:  # the embedded model is on disk, by its name
            assert re.search(r"^on disk +default\b", screen.pane.notes()[-1].text, re.M)


async def test_esc_stops_a_remote_reply_and_the_server_stops_generating(tiny_lean, serve):
    server = serve(slow_endless(tiny_lean))
    app = make_app(RemoteEngine(server.url).connect(), StartOptions(params=SamplingParams(max_tokens=500)))
    async with app.run_test(size=(110, 36)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "go on", wait=False)
        await wait_for(pilot, lambda: screen.live.tokens >= 3)
        await pilot.press("escape")
        await wait_for(pilot, lambda: screen.turns_done == 1)
        assert screen.conversation.messages[-1].finish_reason == "cancelled"
        assert server.worker.wait_idle(30)
        assert server.worker.history[-1]["finish_reason"] == "cancelled"
        assert server.worker.history[-1]["completion_tokens"] < 500
        stats = (await command(pilot, "/stats")).text
        assert "prompt tokens      n/a" in stats  # a stopped stream has no usage: not known, not 0


async def test_panels_show_the_servers_drafts_and_no_local_pool(tiny_lean, serve):
    server = serve(tiny_lean)
    params = SamplingParams(temperature=0, max_tokens=24, lookup=4)
    app = make_app(RemoteEngine(server.url).connect(), StartOptions(params=params))
    async with app.run_test(size=(110, 36)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "Repeat after me: one two three four, one two three four, one two three four")
        stats = screen.last_stats
        assert stats.draft_tokens == server.worker.history[-1]["draft_tokens"] > 0  # read from the usage
        drafts = screen.panels.values["drafts"]
        assert drafts == (f"{stats.accepted_tokens} of {stats.draft_tokens} kept" if stats.draft_tokens else "n/a")
        assert screen.panels.values["resident"] == "on the server" and screen.panels.values["pool"] == "n/a"


async def test_a_refused_request_is_an_inline_error_and_the_prompt_gets_its_text_back(faults):
    app = make_app(RemoteEngine(faults.url + "/unavailable", model="m"), GREEDY)
    async with app.run_test(size=(110, 36)) as pilot:
        screen = await ready(pilot)
        screen.prompt.load_text("my long question")
        await pilot.press("enter")
        await wait_for(pilot, lambda: not screen.busy and screen.pane.notes())
        assert "answered 503: The server is loading the model; retry after 30 s" in screen.pane.notes()[-1].text
        assert screen.prompt.text == "my long question"  # Enter sends it again
        assert screen.conversation.messages == [] and not screen.pane.query(UserMessage)
        assert app.is_running


async def test_a_stream_cut_mid_reply_keeps_the_text_and_marks_it(faults):
    app = make_app(RemoteEngine(faults.url + "/cut").connect(), GREEDY)
    async with app.run_test(size=(110, 36)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "hi")
        last = screen.conversation.messages[-1]
        assert (last.content, last.finish_reason) == ("Hello world", "error")
        note = str(screen.pane.query(ReplyBox).last().note.render())
        assert "⚠ cut off: the server's stream ended mid-reply (" in note and note.count("cut") == 1
        assert screen.panels.values["kv"] == "n/a" and screen.panels.values["prefill"] == "n/a"


async def test_a_server_that_cannot_be_reached_at_start_is_an_inline_line_and_nothing_typed_is_lost():
    from chatcli.engine.remote import RemoteError

    app = make_app(RemoteError("cannot connect to http://gpu-box:8000/v1: refused"), StartOptions(api="http://gpu-box"))
    async with app.run_test(size=(110, 36)) as pilot:
        screen = await ready_or_failed(pilot)
        note = screen.pane.notes()[-1].text
        assert note == "Could not use the --api server: cannot connect to http://gpu-box:8000/v1: refused"
        assert "no server" in str(screen.info.render())
        screen.prompt.load_text("still here")
        await pilot.press("enter")  # tries the server again: still down
        await wait_for(pilot, lambda: screen.load_error is not None and screen.pane.notes()[-1].text.startswith("Not"))
        assert screen.pane.notes()[-1].text == "Not sent: 1 prompt put back in the prompt."
        assert screen.prompt.text == "still here" and screen.conversation.messages == []
        assert not screen.pane.query(UserMessage)


async def test_a_server_down_at_start_is_tried_again_on_the_next_send():
    from chatcli.engine.remote import RemoteError
    from chatcli.ui.app import ChatApp

    engine, tries = FakeEngine(), []

    def factory(status=None):  # down at start, up by the first send
        tries.append(1)
        if len(tries) == 1:
            raise RemoteError("cannot connect to http://gpu-box:8000/v1: refused")
        return engine

    app = ChatApp(StartOptions(api="http://gpu-box"), engine_factory=factory)
    async with app.run_test(size=(110, 36)) as pilot:
        screen = await ready_or_failed(pilot)
        await send(pilot, "hello")
        assert len(tries) == 2 and screen.engine is engine and screen.load_error is None
        assert [m.role for m in screen.conversation.messages] == ["user", "assistant"]
        assert "no server" not in str(screen.info.render())


async def ready_or_failed(pilot):
    app = pilot.app
    await wait_for(pilot, lambda: app.chat_screen is not None and app.chat_screen.load_error is not None)
    return app.chat_screen


async def test_the_inspector_shows_a_chatcli_servers_tokens_and_their_alternatives(tiny_lean, serve):
    """F4 with --api on chatcli's own server: the reply's tokens come with their logprobs and the 5
    alternatives, named by their text as the in-process inspector names them; a token's line names no id."""
    from chatcli.engine.events import Token

    server = serve(tiny_lean)
    app = make_app(RemoteEngine(server.url).connect(), GREEDY)
    name = lambda i: tiny_lean.tokenizer.decode([i], skip_special_tokens=False)  # noqa: E731
    events = tiny_lean.generate(
        [{"role": "user", "content": "Hello"}], tiny_lean.new_session(), GREEDY.params.with_(logprobs=5)
    )
    want = [
        (name(t.token_id), [name(i) for i, _lp in t.top_logprobs])
        for t in events
        if isinstance(t, Token) and t.token_id >= 0
    ]
    async with app.run_test(size=(140, 45)) as pilot:
        screen = await ready(pilot)
        await pilot.press("f4")
        await send(pilot, "Hello")
        pieces = [p for p in screen.tokens.pieces if p.kind == "reply"]
        assert [(p.text, [text for _i, text, _lp in p.top]) for p in pieces] == want
        assert screen.tokens.recorded and all(p.logprob <= 0 for p in pieces)
        line = screen.tokens.detail().plain
        assert "p = " in line and line.count("·") == 5 and "id -1" not in line
        head = screen.tokens.parts()[0].plain
        assert head.startswith(f"prompt tokens: the server's, not sent · reply {len(want)} tokens")  # not "prompt 0"
