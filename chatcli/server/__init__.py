"""`chatcli serve`: the engine behind an OpenAI-compatible HTTP API with SSE streaming.

`app.create_app(engine)` builds the ASGI app, `cli.serve_command` is the command.
"""
