"""Widgets of the chat screen."""
