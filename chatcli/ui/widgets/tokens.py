"""The token inspector: the last turn's prompt and reply split into tokens (F4, `/tokens`).

Prompt tokens are marked as read from the KV cache (dim) or prefilled this turn (underlined);
reply tokens are coloured by their probability under the distribution each was drawn from
(`Token.logprob`); a control token (the template's markers, `<start_of_image>`: never printed in a
reply) is shown by its text, framed ⟨…⟩. Left / right (the inspector focused: click it or Tab) select a token; the
line under the counts names its id, its probability and the most likely alternatives
(`/top-logprobs N`, 5 by default), and the view scrolls to keep the selected token in sight (a
long prompt comes before the reply: the reply's first token is selected, and shown, at once).
The whole view is one `rich.text.Text`, rebuilt when the turn or the selection changes, never
per token while a reply streams, so a 1,000-token reply costs one build per key press.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Static

from chatcli.errors import shown

# probability → style of a reply token (the first bound it reaches), likely to unlikely
SHADES = ((0.9, "on dark_green"), (0.5, "on green4"), (0.2, "black on yellow3"), (0.05, "black on dark_orange"))
UNLIKELY = "white on red3"


def shade(p: float) -> str:
    return next((style for bound, style in SHADES if p >= bound), UNLIKELY)


@dataclass
class Piece:
    """One token: its id and text; a reply token also its log p and alternatives ((id, text, log p))."""

    token_id: int
    text: str
    kind: str  # "cached" | "prefilled" | "reply"
    logprob: float | None = None
    top: list[tuple[int, str, float]] = field(default_factory=list)
    control: bool = False  # a control token: its text is never printed (the tokenizer skips it)


def turn_pieces(prompt_ids: list[int], cached: int, reply_tokens: list, decode=None) -> list[Piece]:
    """A turn's pieces: its prompt ids (the first `cached` read from the KV cache), then its reply's
    `Token`s; named by `decode` (the tokenizer's) where there is one, else by a reply token's text and
    its alternatives' (`Token.top_texts`: a server's tokens have no id here, -1)."""

    def name(token_id: int, fallback: str = "") -> str:
        return decode([token_id], skip_special_tokens=False) if decode and token_id >= 0 else fallback

    def control(token_id: int, text: str) -> bool:  # a text the reply's decode leaves out
        return bool(decode and token_id >= 0 and text and not decode([token_id], skip_special_tokens=True))

    pieces = [Piece(t, name(t), "cached" if i < cached else "prefilled") for i, t in enumerate(prompt_ids)]
    for t in reply_tokens:
        texts = t.top_texts or [""] * len(t.top_logprobs or ())
        top = [(i, name(i, text), lp) for (i, lp), text in zip(t.top_logprobs or (), texts, strict=True)]
        pieces.append(Piece(t.token_id, name(t.token_id, t.text), "reply", t.logprob, top))
    for piece in pieces:
        piece.control = control(piece.token_id, piece.text)
    return pieces


def token_namer(tokenizer, prompt_ids: list[int], reply_tokens: list):
    """The `decode` that `turn_pieces` names ids with: the tokenizer's, or where it names many ids in one
    call (`decode_each`: a generation process's, each call a round trip over its pipe) a lookup in the
    names of this turn's ids, asked for at once: spelled, and as a reply prints them (a control token's
    is empty). None: no tokenizer (a server's turn)."""
    decode = getattr(tokenizer, "decode", None)
    each = getattr(tokenizer, "decode_each", None)
    if each is None:
        return decode
    ids = {*prompt_ids, *(t.token_id for t in reply_tokens)}
    ids.update(i for t in reply_tokens for i, _ in t.top_logprobs or ())
    wanted = sorted(i for i in ids if i >= 0)
    spelled = dict(zip(wanted, each(wanted), strict=True))
    printed = dict(zip(wanted, each(wanted, skip_special_tokens=True), strict=True))
    return lambda token_ids, skip_special_tokens=True: (printed if skip_special_tokens else spelled)[token_ids[0]]


NO_TURN = "No turn in this conversation yet: send a prompt, then its tokens show here."
TEXT_ONLY = (
    "The --api server sent this turn as text, without its tokens: the inspector shows the tokens of the "
    "in-process engine (chatcli without --api), or a server's, with their logprobs, where it returns them."
)


def _visible(text: str) -> str:
    return shown(text).replace("\n", "⏎\n").replace("\t", "⇥") or "∅"


class TokenInspector(Vertical, can_focus=True):
    """The counts and the selected token's line on top, fixed; the tokens below, scrolled to keep
    the selected one in sight."""

    DEFAULT_CSS = """
    TokenInspector { height: auto; max-height: 16; border-top: solid $primary; padding: 0 1; }
    TokenInspector:focus { border-top: solid $accent; }
    TokenInspector > .token-head { height: auto; }
    TokenInspector > VerticalScroll { height: auto; max-height: 10; }
    """
    BINDINGS = [
        Binding("left", "move(-1)", "Previous token", show=False),
        Binding("right", "move(1)", "Next token", show=False),
        Binding("home", "move(-1000000)", show=False),
        Binding("end", "move(1000000)", show=False),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.pieces: list[Piece] = []
        self.selected: int | None = None  # index into pieces (a reply token once there is one)
        self.recorded = False  # the reply's logprobs were computed (the inspector was on for it)
        self.empty = NO_TURN  # what it says without pieces
        self.head = Static("", classes="token-head")
        self.view = Static("")
        self.scroller = VerticalScroll(self.view, can_focus=False)

    def compose(self) -> ComposeResult:
        yield self.head
        yield self.scroller

    def on_mount(self) -> None:
        self.rebuild()

    def show_turn(self, pieces: list[Piece], recorded: bool, empty: str = NO_TURN) -> None:
        """`pieces` of a turn; `empty`: what the inspector says where there are none."""
        self.pieces, self.recorded, self.empty = pieces, recorded, empty
        replies = [i for i, p in enumerate(pieces) if p.kind == "reply"]
        self.selected = replies[0] if replies else (len(pieces) - 1 if pieces else None)
        self.rebuild()

    def action_move(self, step: int) -> None:
        if self.selected is None or not self.pieces:
            return
        self.selected = max(0, min(len(self.pieces) - 1, self.selected + step))
        self.rebuild()

    def rebuild(self) -> None:
        if not self.is_mounted:
            return
        head, body = self.parts()
        self.head.update(head)
        self.view.update(body)
        self.call_after_refresh(self.show_selected)

    def on_resize(self) -> None:  # shown (F4) or resized: where the selected token's row is has moved
        self.call_after_refresh(self.show_selected)

    def show_selected(self) -> None:
        """Scroll the tokens so the selected one's row is in sight (nothing while not laid out)."""
        width = self.scroller.scrollable_content_region.width
        if self.selected is not None and width > 0:
            row = len(self.tokens_text(self.selected + 1).wrap(self.app.console, width))
            self.scroller.scroll_to(y=max(0, row - 3), animate=False)

    def render_text(self) -> Text:
        """The whole view as one text: the head, then the tokens."""
        head, body = self.parts()
        return Text.assemble(head, "\n", body)

    def parts(self) -> tuple[Text, Text]:
        """(the counts and the selected token's line, the tokens)."""
        if not self.pieces:
            return Text(self.empty, style="dim"), Text()
        counts = {k: sum(p.kind == k for p in self.pieces) for k in ("cached", "prefilled", "reply")}
        prompt = (
            f"prompt {counts['cached'] + counts['prefilled']} tokens ({counts['cached']} cached, dim; "
            f"{counts['prefilled']} prefilled, underlined)"
        )
        if all(p.token_id < 0 for p in self.pieces):  # a server's turn: it sends the reply's tokens, not the prompt's
            prompt = "prompt tokens: the server's, not sent"
        head = Text(f"{prompt} · reply {counts['reply']} tokens\n", style="bold")
        return Text.assemble(head, self.detail()), self.tokens_text()

    def tokens_text(self, upto: int | None = None) -> Text:
        """The tokens (the first `upto` of them), each styled by its kind or probability."""
        body = Text()
        for i, piece in enumerate(self.pieces[:upto]):
            style = {"cached": "dim", "prefilled": "underline"}.get(piece.kind, "")
            if piece.kind == "reply" and piece.logprob is not None:
                style = shade(math.exp(piece.logprob))
            if i == self.selected:
                style += " reverse"
            shown_text = f"⟨{_visible(piece.text)}⟩" if piece.control else _visible(piece.text)
            body.append(shown_text, style=style.strip() or None)
        return body

    def detail(self) -> Text:
        if self.selected is None:
            return Text("")
        piece = self.pieces[self.selected]
        kind = f"{piece.kind}, control: never printed" if piece.control else piece.kind
        named = f"id {piece.token_id} " if piece.token_id >= 0 else ""  # a server's token: its text only
        line = Text(f"#{self.selected} {named}{piece.text!r} ({kind})", style="bold")
        if piece.kind == "reply" and piece.logprob is not None:
            line.append(f"  p = {math.exp(piece.logprob):.3f}")
            for _id, text, lp in piece.top:
                line.append("  ·  ")
                line.append(f"{text!r} {math.exp(lp):.3f}", style=shade(math.exp(lp)))
        elif piece.kind == "reply" and not self.recorded:
            line.append("  (no probabilities: this reply came before the inspector was on)", style="dim")
        return line
