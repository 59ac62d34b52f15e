"""Hermes loads a directory plugin by importing this file (as
hermes_plugins.mobile) and calling its register(ctx)."""

from .adapter import register  # noqa: F401
