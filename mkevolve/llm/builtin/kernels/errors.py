"""The error the builtin kernel generator raises for anything it cannot turn into Triton."""


class UnsupportedSubproblem(Exception):
    """The subproblem uses an op or pattern the builtin generator has no template for; the message names it."""


class UnsupportedInMode(UnsupportedSubproblem):
    """Only one module mode is out of reach (dropout in training mode): the other still gets kernels."""
