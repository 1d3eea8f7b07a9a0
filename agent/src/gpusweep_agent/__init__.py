"""The gpusweep node agent. Standard library only; it must never import Django."""

__version__ = "0.1.0"
