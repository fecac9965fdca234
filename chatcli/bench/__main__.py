"""`python -m chatcli.bench`: the bench on its own."""

import typer

from chatcli.bench import bench_command

typer.run(bench_command)
