"""`python -m chatcli.bench`: the bench on its own."""

from chatcli.bench import bench_command

bench_command(prog_name="python -m chatcli.bench")
