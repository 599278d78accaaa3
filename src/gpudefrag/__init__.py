"""gpudefrag: give GPU clusters their whole nodes back."""

__version__ = "0.1.0"
