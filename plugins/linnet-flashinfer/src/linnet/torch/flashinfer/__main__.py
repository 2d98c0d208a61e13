"""``python -m linnet.torch.flashinfer``: where FlashInfer caches its kernels, and warming it.

python -m linnet.torch.flashinfer             # versions and the JIT cache folder
python -m linnet.torch.flashinfer --warm      # compile the kernels ahead (needs a GPU)
python -m linnet.torch.flashinfer --warm --head-dims 64,128 --dtypes bf16,f16
"""

from __future__ import annotations

import argparse
import os
import sys

from . import __version__, cache_dir, flashinfer_version, warm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m linnet.torch.flashinfer",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument(
        "--warm", action="store_true", help="JIT-compile (or load) the decode kernels now"
    )
    parser.add_argument(
        "--head-dims", default="64,128", help="head dims to warm, comma-separated (default 64,128)"
    )
    parser.add_argument("--dtypes", default="bf16", help="bf16 and/or f16 (default bf16)")
    parser.add_argument(
        "--cuda-cores",
        action="store_true",
        help="warm the CUDA-core kernel instead of the tensor-core one",
    )
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)

    print(f"linnet-flashinfer {__version__}")
    print(f"flashinfer-python {flashinfer_version() or 'not installed'}")
    print(f"FLASHINFER_WORKSPACE_BASE={os.environ.get('FLASHINFER_WORKSPACE_BASE', '(unset: ~)')}")
    print(f"JIT cache: {cache_dir() or '-'}")
    if not args.warm:
        return 0
    if flashinfer_version() is None:
        print(
            "flashinfer-python is not installed: pip install 'linnet-flashinfer[cuda]'",
            file=sys.stderr,
        )
        return 1
    head_dims = [int(d) for d in args.head_dims.split(",") if d]
    dtypes = [d for d in args.dtypes.split(",") if d]
    warm(head_dims, dtypes, use_tensor_cores=not args.cuda_cores, device=args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
