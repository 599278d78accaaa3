"""The `gpudefrag` command line. Each area registers its commands from its own module (see main.py)."""
