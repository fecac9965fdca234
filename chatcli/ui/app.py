"""The Textual app: themes, quitting, and loading the engine off the UI thread.

`run_tui(start)` is the entry point `chatcli` calls in a terminal. The window opens at
once; the model loads in a background thread that posts `LoadStatus`, then
`EngineReady` or `LoadFailed`, to the chat screen.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace

from textual.app import App
from textual.binding import Binding

from chatcli.errors import one_line
from chatcli.ui import themes
from chatcli.ui.messages import EngineReady, LoadFailed, LoadStatus, ModelLoaded, ToolsReady
from chatcli.ui.persist import PromptHistory, remember_theme
from chatcli.ui.screens.chat import ChatScreen


def open_store():
    """(the conversation Store, None) or (None, the one-line reason it cannot be used)."""
    from chatcli.chat.store import Store, StoreError

    try:
        return Store(), None
    except StoreError as exc:
        return None, str(exc)


class ChatApp(App):
    TITLE = "chatcli"
    BINDINGS = [
        Binding("ctrl+q", "quit_clean", "Quit", priority=True),
        Binding("ctrl+c", "interrupt", "Stop / Quit", show=False, priority=True),
    ]
    ENABLE_COMMAND_PALETTE = False

    def __init__(
        self,
        start,
        engine_factory: Callable | None = None,
        history: PromptHistory | None = None,
        remember: bool = True,
        model_factory: Callable | None = None,
    ) -> None:
        self.shipped = themes.shipped_themes()
        super().__init__(css_path=list(self.shipped.values()))
        self.start = start
        # The model runs in a generation process of its own (`ProcessEngine`): drawing never slows its decode loop.
        self.engine_factory = engine_factory or (lambda status=None: start.load_engine(status, process=True))
        # /model NAME: model_factory(name, status) -> engine (default: the start options with that model)
        self.model_factory = model_factory or (
            lambda name, status: replace(start, model=name).load_engine(status, process=True)
        )
        self.history = history
        self.remember = remember  # write /theme choices to the config file
        self.chat_theme = ""
        self.register_theme(themes.high_contrast_palette())
        self.chat_screen: ChatScreen | None = None
        self.hub = None  # chat.mcp.Hub: the --mcp servers

    # -- themes ----------------------------------------------------------------

    def theme_names(self) -> list[str]:
        builtin = sorted(n for n in self.available_themes if not n.startswith("chatcli-"))
        return list(self.shipped) + [n for n in builtin if n not in self.shipped]

    def set_chat_theme(self, name: str, remember: bool = False) -> str | None:
        """Switch theme; return an error line (and change nothing) when the name is unknown."""
        if name not in self.theme_names():
            return f"unknown theme {name!r}; themes: {', '.join(self.theme_names())}"
        for shipped in self.shipped:
            self.remove_class(f"-theme-{shipped}")
        if name in self.shipped:
            self.theme = themes.base_theme(self.shipped[name])
            self.add_class(f"-theme-{name}")
        else:
            self.theme = name
        self.chat_theme = name
        if remember and self.remember:
            try:
                remember_theme(name)
            except OSError as exc:
                self.notify(f"could not save the theme in the config file: {exc}", severity="warning")
        return None

    # -- start-up ----------------------------------------------------------------

    def on_mount(self) -> None:
        start = self.start
        wanted = start.theme or start.config.theme or themes.DEFAULT_THEME
        error = self.set_chat_theme(wanted)
        if error:
            self.set_chat_theme(themes.DEFAULT_THEME)
        system = start.system if start.system is not None else start.config.system
        store, store_error = open_store()
        self.chat_screen = ChatScreen(
            start.params,
            system,
            self.history,
            store=store,
            resume=(start.continue_last, start.conversation),
            budget=start.cache_budget_bytes,
            system_given=start.system_given,
        )
        self.push_screen(self.chat_screen)
        if error:
            self.notify(error, severity="error")
        if store_error:
            self.notify(f"{store_error}. Conversations are not saved.", title="Not saved", severity="error", timeout=10)
        self.start_load(self.chat_screen)
        if start.mcp:
            self.start_tools(self.chat_screen)

    def start_load(self, screen: ChatScreen) -> None:
        """Load the engine (connect to the --api server) for `screen`: `EngineReady` or `LoadFailed`
        comes. A daemon thread, not a worker: a model load cannot be cancelled, and quitting during
        it must not wait for it to finish."""
        threading.Thread(target=self._load, args=(screen,), name="chatcli-load", daemon=True).start()

    def start_tools(self, screen: ChatScreen) -> None:
        """Start the --mcp servers (beside the model's load): `ToolsReady` comes once all started or failed."""
        from chatcli.chat.mcp import Hub

        self.hub = hub = Hub(self.start.mcp).start()
        screen.tools_starting = True

        def wait() -> None:
            failed = hub.wait()
            screen.post_message(ToolsReady(hub, list(failed.values())))

        threading.Thread(target=wait, name="chatcli-mcp-start", daemon=True).start()

    def close_tools(self) -> None:
        """The --mcp servers stop (their processes end with their sessions)."""
        if self.hub is not None:
            self.hub.close(timeout=3)
            self.hub = None

    def _load(self, screen: ChatScreen) -> None:
        """Load thread: never touches a widget, only posts messages."""
        from chatcli.engine import release_cpu_threads

        try:
            engine = self.engine_factory(status=lambda *step: screen.post_message(LoadStatus(*step)))
        except Exception as exc:  # noqa: BLE001 - LoadError, or anything else: one line, the app keeps running
            screen.post_message(LoadFailed(one_line(exc)))
            return
        finally:
            release_cpu_threads()  # turns run in other threads: see engine/runners/threads.py
        screen.post_message(EngineReady(engine))

    def load_model(self, name: str, screen: ChatScreen) -> None:
        """`/model NAME`: load it in a daemon thread (as at start), then post `ModelLoaded`."""

        def run() -> None:
            from chatcli.engine import release_cpu_threads

            try:
                engine = self.model_factory(name, lambda *step: screen.post_message(LoadStatus(*step)))
            except Exception as exc:  # noqa: BLE001 - one line; the current model keeps answering
                screen.post_message(ModelLoaded(name, None, one_line(exc)))
                return
            finally:
                release_cpu_threads()
            screen.post_message(ModelLoaded(name, engine))

        threading.Thread(target=run, name="chatcli-model", daemon=True).start()

    # -- quitting ----------------------------------------------------------------

    def action_interrupt(self) -> None:
        """Ctrl+C, as in llama-cli and ollama: the first stops a streaming reply (and keeps it, as
        Esc does); with no reply streaming it quits."""
        screen = self.chat_screen
        if screen is not None and screen.busy and screen.cancel is not None:
            screen.action_stop()
            self.notify("Reply stopped. Ctrl+C again quits.", timeout=3)
            return
        self.action_quit_clean()

    def action_quit_clean(self) -> None:
        """Quit at any moment: cancel a running reply (it stops within one step), then exit."""
        if self.chat_screen is not None:
            self.chat_screen.stop_all()
        self.close_tools()
        self.exit(0)


def run_tui(start, terminal: list | None = None) -> int:
    """Run the TUI until the user quits; the exit code. `terminal`: the settings
    `typeahead.hold_typeahead` found, given back at the end."""
    from chatcli.ui.typeahead import restore

    app = ChatApp(start)
    try:
        app.run()
    finally:
        restore(terminal)
    return app.return_code or 0
