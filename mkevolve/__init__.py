"""mkevolve: modular kernel evolution for PyTorch modules."""

__version__ = "0.1.0"
