"""The error the builtin kernel generator raises for anything it cannot turn into Triton."""


class UnsupportedSubproblem(Exception):
    """The subproblem uses an op or pattern the builtin generator has no template for; the message names it."""


class UnsupportedInMode(UnsupportedSubproblem):
    """Only one module mode is out of reach (dropout in training mode): the other still gets kernels."""


class UnsupportedOps(UnsupportedSubproblem):
    """Ops or modules with no template: every one in the subproblem, so one answer names them all."""

    def __init__(self, ops: list[str]):
        self.ops = tuple(ops)
        super().__init__(f"no kernel template for: {', '.join(self.ops)}")
