"""The decomposer's one error: a module or request it cannot handle, with a message a reply can carry."""

from __future__ import annotations


class UnsupportedModule(Exception):
    """The builtin decomposer cannot handle this module or request; the message says what stops it."""
