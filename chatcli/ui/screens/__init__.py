"""Screens of the TUI."""
