"""The generation process: the engine in a process of its own, for a front end that draws (the TUI).

`proxy.ProcessEngine` is the front end's side (the `ChatEngine` API and the session calls), `host.py`
the process's, `pipe.py` what goes between them.
"""
