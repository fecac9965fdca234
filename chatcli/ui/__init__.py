"""The Textual TUI. Import `chatcli.ui.app.run_tui` lazily: this package imports Textual."""
