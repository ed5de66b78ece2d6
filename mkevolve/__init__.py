"""mkevolve: modular kernel evolution for PyTorch modules."""

__version__ = "0.1.0"


def __getattr__(name):
    """`mkevolve.integrate(model, solutions, inputs)` without importing torch at `import mkevolve`: the
    function lives in mkevolve.integration, loaded on first use."""
    if name == "integrate":
        from mkevolve.integration import integrate

        return integrate
    raise AttributeError(f"module 'mkevolve' has no attribute {name!r}")
