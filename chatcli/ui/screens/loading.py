"""The engine's arrival on the chat screen: the first model's load (or the `--api` server's
connection, tried again on the next send when it failed), `/model NAME`'s switch, and the loading
line that says where it stands.

A mixin of `ChatScreen`, on the screen's own state (`ConversationScreen`): the app loads in a
thread of its own and posts `LoadStatus`, then `EngineReady` or `LoadFailed` (`ModelLoaded` for
`/model`); these handlers put the engine to work, or say in one line why not, and nothing typed
is lost: prompts queued while it loaded go back into the prompt. An engine that answers no more (the
one `/model` replaced, the last at quit) is let go of: a generation process ends (`let_go`).
"""

from __future__ import annotations

import threading

from chatcli.errors import counted, shown
from chatcli.ui.messages import EngineReady, LoadFailed, LoadStatus, ModelLoaded
from chatcli.ui.widgets.chat_pane import LoadingLine


def unnamed(error: str, name: str) -> str:
    """A load error without the model's name where it starts with it ("NAME: …", "could not load model
    NAME: …", as the loader says them): /model NAME's line names it once."""
    for head in (f"could not load model {name}: ", f"{name}: "):
        error = error.removeprefix(head)
    return error


class EngineLoading:
    def on_load_status(self, message: LoadStatus) -> None:
        self.load_status = message.line()
        if self.loading_line is not None:
            self.loading_line.status.update(self.load_status)

    def on_load_failed(self, message: LoadFailed) -> None:
        self.load_error = message.error
        self.drop_loading()
        what = "use the --api server" if self.remote else "load the model"
        self.note(f"Could not {what}: {message.error}", error=True)
        if self.queue:  # back in the prompt, nothing lost: Enter tries again
            texts = [widget.text for widget in self.queue]
            self.drop_queue()
            self.prompt.restore("\n\n".join([*texts, self.prompt.text] if self.prompt.text else texts))
            self.note(f"Not sent: {counted(len(texts), 'prompt')} put back in the prompt.", error=True)
        title = "Connection failed" if self.remote else "Load failed"
        self.app.notify(shown(message.error), title=title, severity="error", timeout=10, markup=False)
        self.refresh_info()

    def reconnect(self) -> None:
        """The --api server failed before: try it again (the next send waits for it, queued)."""
        self.load_error = None
        self.load_status = f"Connecting to {self.app.start.api}"
        self.loading_line = LoadingLine(self.load_status)
        self.pane.mount(self.loading_line)
        self.refresh_info()
        self.app.start_load(self)

    def load_model(self, name: str) -> None:
        """`/model NAME`: the app loads it in the background; `ModelLoaded` comes when it is done."""
        self.switching = name
        self.load_status = f"Loading {name}"
        self.loading_line = LoadingLine(self.load_status)
        self.pane.mount(self.loading_line)
        self.app.load_model(name, self)

    def drop_loading(self) -> None:
        if self.loading_line is not None:
            self.loading_line.remove()
            self.loading_line = None

    def on_engine_ready(self, message: EngineReady) -> None:
        self.drop_loading()
        self._answer_with(message.engine)
        self._next_in_queue()

    def _answer_with(self, engine) -> None:
        """`engine` answers from now on, with a pool of its own (another model's caches are no use)."""
        self.engine = engine
        self.chats.start_pool(engine)
        self.session = self.chats.session_for(self.conversation)
        self.show_cache()
        self.refresh_pool()
        self.refresh_info()
        if getattr(engine, "note", ""):  # the loader's one line: e.g. a quantized GGUF run dequantized
            self.note(f"Note: {engine.note}")

    def on_model_loaded(self, message: ModelLoaded) -> None:
        """`/model NAME` is done: the new engine answers from now on (every conversation's cache is
        the old model's, so the pool starts empty), and the open conversation remembers it."""
        self.switching = None
        self.drop_loading()
        if message.engine is None:
            still = f"still answering with {self.engine.name}" if self.engine is not None else "no model is loaded"
            self.note(f"/model {message.name}: {unnamed(message.error, message.name)} ({still})", error=True)
            return
        old, self.load_error = self.engine, None  # a first model that failed to load is replaced too
        self.panels.reset()  # "This turn" was the old model's
        self._answer_with(message.engine)
        self.chats.set_model(self.conversation)
        was = f"was {old.name}" if old is not None else "the first failed to load"
        let_go(old)  # its generation process ends, in the background
        self.note(f"now answering with {self.engine.name} ({was}); the next turn prefills")
        self._next_in_queue()


def let_go(engine, wait: bool = False) -> None:
    """`engine` answers no more: where it runs in a generation process (`close`), that process ends, in a
    thread of its own unless `wait` (quitting: no process outlives the app)."""
    close = getattr(engine, "close", None)
    if close is None:
        return
    if wait:
        close()
    else:
        threading.Thread(target=close, name="chatcli-let-go", daemon=True).start()
