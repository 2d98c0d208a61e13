"""linnet.torch: run Linnet models on PyTorch."""
