"""What each slash command does on the chat screen (the parsing lives in `chatcli.chat.commands`)."""

from __future__ import annotations

from chatcli.chat.commands import CommandError, apply_setting, help_lines, parse
from chatcli.engine.params import setting_of
from chatcli.ui.format import settings_lines, stats_lines

BUSY = "a reply is streaming: press Esc to stop it first"


class SlashCommands:
    """Mixed into ChatScreen: `run_command(text)` and one `cmd_<name>` per command."""

    async def run_command(self, text: str) -> None:
        try:
            command = parse(text)
        except CommandError as exc:
            self.pane.add_note(str(exc), error=True)
            return
        handler = getattr(self, "cmd_" + command.name.replace("-", "_"), None)
        if command.setting is not None:
            self._set(command)
        elif handler is not None:
            await handler(command.arg)
        self.pane.follow()

    def _note(self, text: str, error: bool = False) -> None:
        self.pane.add_note(text, error=error)

    def _set(self, command) -> None:
        try:
            self.params = apply_setting(self.params, command)
        except ValueError as exc:
            self._note(f"/{command.name}: {exc} (unchanged)", error=True)
            return
        field, value = command.setting
        setting = setting_of(field)
        self._note(f"{setting.name} = {setting.show(value)}")
        self.refresh_info()

    async def cmd_help(self, _arg: str) -> None:
        rows = help_lines()
        width = max(len(usage) for usage, _ in rows)
        lines = [f"{usage:<{width}}  {desc}" for usage, desc in rows]
        keys = (
            "Enter send · Shift+Enter/Ctrl+J newline · ↑/↓ history · Tab complete · PgUp/PgDn scroll · Esc stop"
            " · F2 panels · F3 conversations · Ctrl+N new conversation · Ctrl+Q quit"
        )
        self._note("\n".join(lines + ["", keys]))

    async def cmd_system(self, arg: str) -> None:
        if not arg:
            current = self.conversation.system
            self._note(f"system prompt: {current}" if current else "no system prompt (set one with /system TEXT)")
            return
        self.conversation.system = arg
        self.save_system()
        self._note(f"system prompt set: {arg}")

    async def cmd_settings(self, _arg: str) -> None:
        model = getattr(self.engine, "name", None) or "(loading)"
        self._note("\n".join(settings_lines(self.params, self.conversation.system, self.app.chat_theme, model)))

    async def cmd_stats(self, _arg: str) -> None:
        if self.last_stats is None:
            self._note("no turn yet", error=True)
            return
        self._note("\n".join(stats_lines(self.last_stats)))

    async def cmd_clear(self, _arg: str) -> None:
        """A new, empty conversation with the current system prompt; the old one stays in the sidebar."""
        if self.busy:
            self._note(BUSY, error=True)
            return
        for widget in list(self.queue):
            widget.remove()
        self.queue.clear()
        await self.new_conversation(self.conversation.system)
        self._note("new conversation")

    async def cmd_retry(self, _arg: str) -> None:
        if self.busy:
            self._note(BUSY, error=True)
            return
        if self.engine is None:
            self._note("the model is not loaded yet", error=True)
            return
        popped = self.conversation.pop_reply()
        if popped is None:
            self._note("nothing to retry", error=True)
            return
        await self._remove_widgets_of([popped])
        self.forget_last(1)
        self.begin_turn()

    async def cmd_undo(self, _arg: str) -> None:
        if self.busy:
            self._note(BUSY, error=True)
            return
        removed = self.conversation.undo()
        if not removed:
            self._note("nothing to undo", error=True)
            return
        await self._remove_widgets_of(removed)
        self.forget_last(len(removed))
        kept = self.crop_cache()
        self._note(f"removed the last exchange ({len(removed)} messages); cache keeps {kept} tokens")

    def crop_cache(self) -> int:
        """Crop the session's cache to what the (shorter) conversation still shares with it."""
        if self.session is None or self.engine is None:
            return 0
        from chatcli.engine.engine import common_prefix

        cache = self.session.cache
        messages = self.conversation.for_template()
        try:
            target = self.engine.tokenizer.encode_chat(messages) if messages else []
        except Exception:  # noqa: BLE001 - a template that rejects an empty chat: start over
            target = []
        cache.crop(common_prefix(cache.ids, target))
        self.panels.set_context(len(cache), self.engine.context_limit)
        return len(cache)

    async def _remove_widgets_of(self, messages: list) -> None:
        doomed = [w for w in self.pane.children if any(getattr(w, "message", None) is m for m in messages)]
        for widget in doomed:
            await widget.remove()

    async def cmd_theme(self, arg: str) -> None:
        app = self.app
        if not arg:
            names = app.theme_names()
            self._note("themes: " + ", ".join(f"[{n}]" if n == app.chat_theme else n for n in names))
            return
        error = app.set_chat_theme(arg, remember=True)
        if error:
            self._note(error, error=True)
        else:
            self._note(f"theme = {arg}")

    async def cmd_quit(self, _arg: str) -> None:
        self.app.action_quit_clean()
