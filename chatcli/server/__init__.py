"""`chatcli serve`: the engine behind OpenAI's, Anthropic's and Ollama's HTTP APIs, streaming.

`app.create_app(engine)` builds the ASGI app, `cli.serve_command` is the command.
"""
