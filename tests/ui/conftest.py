from __future__ import annotations

import asyncio
import time

import pytest

from chatcli.options import StartOptions
from chatcli.ui.app import ChatApp
from chatcli.ui.persist import PromptHistory
from tests.ui.fake import FakeEngine


@pytest.fixture
def isolated_dirs(tmp_path, user_dirs_untouched):
    """The test's own folder, where tests/conftest.py points the data dir (`data/`) and config file."""
    return tmp_path


def make_app(engine=None, start: StartOptions | None = None, history: PromptHistory | None = None, **kwargs) -> ChatApp:
    engine = engine if engine is not None else FakeEngine()

    def factory(status=None):
        if status:
            status("Loading fake-model")
        if isinstance(engine, Exception):
            raise engine
        return engine

    return ChatApp(start or StartOptions(), engine_factory=factory, history=history, **kwargs)


async def wait_for(pilot, condition, timeout: float = 20.0) -> None:
    """Let the app run until `condition()` holds (the timeout only guards against a hang)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await pilot.pause(0.01)


async def ready(pilot):
    app = pilot.app
    await wait_for(pilot, lambda: app.chat_screen is not None and app.chat_screen.engine is not None)
    return app.chat_screen


async def send(pilot, text: str, wait: bool = True):
    screen = pilot.app.chat_screen
    before = screen.turns_done
    screen.prompt.load_text(text)
    await pilot.press("enter")
    if wait:
        await wait_for(pilot, lambda: screen.turns_done > before and not screen.busy)
    await pilot.pause()


def press_now(app, key: str, char: str | None = None) -> None:
    """A key from the terminal, without waiting for the app to go idle (pilot.press does)."""
    from textual import events

    app._driver.send_message(events.Key(key, char))


async def command(pilot, text: str):
    screen = pilot.app.chat_screen
    screen.prompt.load_text(text)
    await pilot.press("enter")
    await pilot.pause()
    return screen.pane.notes()[-1] if screen.pane.notes() else None


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Run `async def` tests in a fresh event loop (no asyncio plugin needed)."""
    if asyncio.iscoroutinefunction(pyfuncitem.obj):
        args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
        asyncio.run(pyfuncitem.obj(**args))
        return True
    return None
