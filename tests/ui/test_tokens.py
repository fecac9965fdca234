"""The token inspector (F4, /tokens, /top-logprobs N) on the real engine (the tiny random Llama)."""

import math

import numpy as np

from chatcli.engine.events import Prefilled, Token
from chatcli.engine.sample.sampling import SamplingParams
from chatcli.options import StartOptions
from chatcli.ui.widgets.tokens import Piece, TokenInspector, shade
from tests.ui.conftest import command, make_app, ready, send
from tests.ui.fake import FakeEngine


def start():
    return StartOptions(params=SamplingParams(temperature=0, max_tokens=6))


def replies(screen) -> list[Piece]:
    return [p for p in screen.tokens.pieces if p.kind == "reply"]


async def test_the_inspector_shows_the_turns_tokens_and_their_alternatives(tiny_engine):
    app = make_app(tiny_engine, start=start())
    async with app.run_test(size=(110, 40)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "Hello")  # before the inspector: no probabilities recorded
        await pilot.press("f4")
        assert screen.tokens.display
        stats = screen.last_stats
        assert [p.kind for p in screen.tokens.pieces].count("prefilled") == stats.prefill_tokens
        assert all(p.logprob is None for p in replies(screen)) and not screen.tokens.recorded
        assert "no probabilities" in screen.tokens.detail().plain

        await send(pilot, "And again")
        stats = screen.last_stats
        pieces = screen.tokens.pieces
        assert [p.kind for p in pieces].count("cached") == stats.cached_tokens > 0  # the first turn's, from the cache
        assert len(replies(screen)) == stats.completion_tokens == 6
        for piece in replies(screen):
            assert piece.logprob <= 0 and len(piece.top) == 5
            assert piece.top[0][0] == piece.token_id  # greedy: the pick is the most likely
            assert piece.text == tiny_engine.tokenizer.decode([piece.token_id], skip_special_tokens=False)
        first = screen.tokens.selected
        assert pieces[first].kind == "reply"
        screen.tokens.focus()
        await pilot.press("right", "right")
        assert screen.tokens.selected == first + 2
        line = screen.tokens.detail().plain
        assert f"id {pieces[first + 2].token_id}" in line and "p = " in line and line.count("·") == 5
        screen.prompt.focus()

        await command(pilot, "/top-logprobs 2")
        await send(pilot, "Once more")
        assert all(len(p.top) == 2 for p in replies(screen))
        await command(pilot, "/top-logprobs 99")
        assert "/top-logprobs takes N in [0, 20]" in screen.pane.children[-1].render().plain
        await command(pilot, "/tokens")
        assert not screen.tokens.display


async def test_probabilities_match_the_engines_events(tiny_engine):
    app = make_app(tiny_engine, start=start())
    async with app.run_test(size=(110, 40)) as pilot:
        screen = await ready(pilot)
        await command(pilot, "/tokens")
        await send(pilot, "Hello")
        session = tiny_engine.new_session()
        params = SamplingParams(temperature=0, max_tokens=6, logprobs=5)
        events = [e for e in tiny_engine.generate(screen.conversation.for_template()[:-1], session, params)]
        want = [e.logprob for e in events if getattr(e, "token_id", -1) >= 0]
        assert np.allclose([p.logprob for p in replies(screen)], want, atol=1e-5)


def test_a_long_reply_renders_and_moves():
    inspector = TokenInspector()
    pieces = [Piece(i, f"t{i} ", "reply", math.log(0.5 + (i % 5) / 10), [(i, f"t{i}", -0.1)]) for i in range(1000)]
    inspector.pieces, inspector.selected, inspector.recorded = pieces, 0, True
    text = inspector.render_text()
    assert "reply 1000 tokens" in text.plain and text.plain.count("t999 ") == 1
    inspector.selected = 998
    inspector.pieces = pieces
    assert "#998 id 998" in inspector.detail().plain
    assert shade(0.95) != shade(0.01)


async def test_the_selected_token_stays_in_sight_and_a_switch_clears_it():
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await ready(pilot)
        await send(pilot, "hello")
        await pilot.press("f4")
        inspector = screen.tokens
        prompt = [Piece(i, f"word{i} ", "prefilled") for i in range(800)]  # a long prompt: many screenfuls
        reply = [Piece(900 + i, f"r{i} ", "reply", -0.1) for i in range(5)]
        inspector.show_turn(prompt + reply, recorded=True)
        await pilot.pause()
        await pilot.pause()
        assert inspector.selected == 800 and "id 900 'r0 '" in str(inspector.head.render())  # the line stays on top
        scroller = inspector.scroller
        top = scroller.scroll_y
        assert top > 0 and scroller.max_scroll_y > 0  # scrolled down to the reply, past the prompt
        scroller.scroll_to(y=0, animate=False)
        inspector.display = False  # filled while hidden (not laid out), then shown: scrolled once it is
        await pilot.pause()
        inspector.show_turn(prompt + reply, recorded=True)
        await pilot.pause()
        inspector.display = True
        await pilot.pause()
        await pilot.pause()
        assert scroller.scroll_y == top
        inspector.focus()
        await pilot.press("home")
        await pilot.pause()
        await pilot.pause()
        assert inspector.selected == 0 and scroller.scroll_y == 0
        await pilot.press("end")  # the inspector's own End (the chat's is for the prompt)
        assert inspector.selected == len(prompt + reply) - 1
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert "No turn in this conversation yet" in str(inspector.head.render()) and inspector.pieces == []
        await pilot.press("f4", "f4")  # hidden and shown again: still this conversation's (none)
        assert inspector.pieces == []


class ServerLike(FakeEngine):
    """As `RemoteEngine` streams: text without token ids (-1); `logprobs`: with each chunk's log p, as a
    server that returns them would."""

    keeps_cache = False

    def __init__(self, logprobs: bool = False) -> None:
        super().__init__()
        self.logprobs = logprobs

    def generate(self, messages, session, params=None, cancel=None):
        for event in super().generate(messages, session, params, cancel):
            if isinstance(event, Token):
                logprob = math.log(0.5) if self.logprobs else None
                event = Token(-1, event.text, event.completion_tokens, event.decode_tok_s, event.elapsed_s, logprob)
            elif isinstance(event, Prefilled):
                event = Prefilled(None, None, None, event.prefill_s, 0)
            yield event


async def test_with_api_the_inspector_says_what_it_needs_after_three_turns():
    app = make_app(ServerLike(), start=StartOptions(api="http://127.0.0.1:9/v1"))
    async with app.run_test(size=(140, 45)) as pilot:
        screen = await ready(pilot)
        for text in ("one", "two", "three"):
            await send(pilot, text)
        await pilot.press("f4")
        said = screen.tokens.parts()[0].plain
        assert "No turn in this conversation yet" not in said  # three turns came
        assert "in-process engine" in said and "logprobs" in said


async def test_with_api_the_inspector_shows_a_servers_tokens_with_their_logprobs():
    app = make_app(ServerLike(logprobs=True), start=StartOptions(api="http://127.0.0.1:9/v1"))
    async with app.run_test(size=(140, 45)) as pilot:
        screen = await ready(pilot)
        await pilot.press("f4")
        await send(pilot, "hello")
        assert [p.text for p in replies(screen)] == ["You", " said:", " **hello**"]
        assert all(math.isclose(math.exp(p.logprob), 0.5) for p in replies(screen)) and screen.tokens.recorded
        assert "p = 0.500" in screen.tokens.detail().plain
