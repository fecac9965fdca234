from chatcli.server.cli import main

main()
