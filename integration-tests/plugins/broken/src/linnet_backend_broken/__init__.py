"""A backend whose module fails to import: discovery must skip it, and the host live on."""

raise ImportError("linnet_backend_broken needs libmissing.so, which is not installed")
