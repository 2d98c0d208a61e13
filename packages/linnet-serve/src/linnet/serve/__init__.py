"""linnet.serve: serve Linnet models to many users."""

__version__ = "0.1.0"
