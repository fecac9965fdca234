"""The token inspector on the chat screen (F4, `/tokens`): the last turn's prompt and reply tokens, each
reply token with its probability and the `top_logprobs` most likely alternatives where the turn recorded
them. A mixin of `ChatScreen`, on its turn's `_prompt_ids`, `_reply_tokens` and `_tokens_of` (the
conversation they belong to)."""

from __future__ import annotations

from chatcli.ui.widgets.tokens import NO_TURN, TEXT_ONLY, token_namer, turn_pieces


class TokenInspector:
    def action_toggle_tokens(self) -> None:
        self.tokens.display = not self.tokens.display
        if self.tokens.display:
            self.show_tokens()
            self.note(
                f"Token inspector on: replies record their probabilities and the {self.top_logprobs} most likely "
                "alternatives (/top-logprobs N); F4 or /tokens hides it. Focus it (click) for ← →."
                + (" With --api, a reply's tokens show where the server returns their logprobs." if self.remote else "")
            )

    def show_tokens(self) -> None:
        """The last turn's tokens in the inspector (names decoded now, not while the reply streamed);
        none where that turn was in another conversation (/switch since)."""
        if self._tokens_of != self.conversation.id:
            self.tokens.show_turn([], False)
            return
        decode = token_namer(getattr(self.engine, "tokenizer", None), self._prompt_ids[0], self._reply_tokens)
        pieces = turn_pieces(*self._prompt_ids, self._reply_tokens, decode)
        recorded = any(t.logprob is not None for t in self._reply_tokens)
        text_only = self.engine is not None and not self.engine.keeps_cache  # a server sent the reply as text
        self.tokens.show_turn(pieces, recorded, empty=TEXT_ONLY if text_only else NO_TURN)
