"""Jupyter kernels in disposable, locked-down containers."""

__version__ = "0.1.0"
