"""Reading safetensors checkpoints' headers: names, shapes and dtypes, without their data.

Pure Python so that `linnet graph --weights` and the checker bind dims from a checkpoint
without torch, and so that every runtime resolves checkpoints the same way. A checkpoint
is one safetensors file, a list of them, a Hugging Face directory (its
``model.safetensors.index.json``, else every ``*.safetensors`` in it) or an index file.
A truncated or corrupt file, a missing shard or an index that disagrees with its shards is
a Linnet error (all of them, in one report), never a traceback.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import linnet.lang.tensors.dtypes as DT
from linnet.lang.diagnostics.core import Diagnostic, LinnetError, coded_error
from linnet.lang.weights.unpacking import Unpacking, unpacking_of

SAFETENSORS_DTYPES = {
    "F64": "f64",
    "F32": "f32",
    "F16": "f16",
    "BF16": "bf16",
    "I64": "i64",
    "I32": "i32",
    "I16": "i16",
    "I8": "i8",
    "U8": "u8",
    "BOOL": "bool",
}
DTYPE_BYTES = DT.BYTES
# The rest of the dtypes the safetensors format defines (safetensors 0.8's `Dtype`), with
# their bits per element: a valid file of these is read for its header and reported as
# unsupported (E0723), not as corrupt, until quantised weights exist.
UNSUPPORTED_DTYPES = {
    "F8_E4M3": (8, "float8 e4m3"),
    "F8_E5M2": (8, "float8 e5m2"),
    "F8_E4M3FNUZ": (8, "float8 e4m3fnuz"),
    "F8_E5M2FNUZ": (8, "float8 e5m2fnuz"),
    "F8_E8M0": (8, "float8 e8m0 (a scale format)"),
    "F6_E2M3": (6, "float6 e2m3"),
    "F6_E3M2": (6, "float6 e3m2"),
    "F4": (4, "float4 e2m1"),
    "U16": (16, "uint16"),
    "U32": (32, "uint32"),
    "U64": (64, "uint64"),
    "C64": (64, "complex64"),
}
INDEX_NAME = "model.safetensors.index.json"
# An index of a 405B model is about 100 KB; anything past this is not an index.
MAX_INDEX_BYTES = 64 * 1024 * 1024


class TensorInfo(tuple):
    """``(shape, dtype)`` of one checkpoint tensor, with the file it is in as ``.shard``.

    It unpacks like the plain pair that ``lower(weights=...)`` takes.

    >>> info = TensorInfo((4, 8), "f32", "model-00001-of-00002.safetensors")
    >>> shape, dtype = info
    >>> shape, dtype, info.shard
    ((4, 8), 'f32', 'model-00001-of-00002.safetensors')
    """

    shard: str

    def __new__(cls, shape: tuple[int, ...], dtype: str, shard: str = "") -> TensorInfo:
        self = super().__new__(cls, (tuple(shape), dtype))
        self.shard = shard
        return self

    def __getnewargs__(self) -> tuple:
        return (self[0], self[1], self.shard)


def shard_of(info: Any) -> str:
    """`` (in `shard`)`` for a :class:`TensorInfo` from a sharded checkpoint, else ``""``."""
    shard = getattr(info, "shard", "")
    return f" (in `{shard}`)" if shard else ""


def _corrupt(path: str | Path, why: str) -> LinnetError:
    return LinnetError(
        Diagnostic(
            "E0650",
            f"`{path}` is not a readable safetensors file: {why}",
            help="the file may be truncated or not a safetensors file; download or save it again",
        )
    )


def safetensors_header(path: str | Path) -> tuple[dict, int]:
    """The JSON header of a safetensors file and the offset where its data starts.

    >>> safetensors_header("missing.safetensors")   # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    linnet.lang.diagnostics.core.LinnetError: error[E0651]: ...
    """
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise _corrupt(path, f"only {len(head)} bytes")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8 or n > 100_000_000:
                raise _corrupt(path, f"its header claims {n} bytes but the file has {size}")
            header = json.loads(f.read(n))
    except FileNotFoundError:
        raise LinnetError(
            Diagnostic("E0651", f"weights file `{path}` not found", help="check the path")
        ) from None
    except RecursionError:
        raise _corrupt(path, "its header nests too deeply to be a safetensors header") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _corrupt(path, f"its header is not JSON ({exc})") from None
    except IsADirectoryError:
        raise LinnetError(
            Diagnostic("E0639", f"`{path}` is a directory", help="pass it as the weights directory")
        ) from None
    except OSError as exc:
        raise LinnetError(Diagnostic("E0651", f"cannot read `{path}`: {exc}")) from None
    if not isinstance(header, dict):
        raise _corrupt(path, "its header is not a JSON object")
    data_size = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, stop = info["data_offsets"]
            bits = dtype_bits(info["dtype"])
            count = 1
            for d in info["shape"]:
                if isinstance(d, bool) or not isinstance(d, int) or d < 0:
                    raise ValueError
                count *= d
            if not (isinstance(start, int) and isinstance(stop, int)) or start < 0:
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise _corrupt(path, f"tensor `{name}` has a malformed entry") from None
        if bits is None:
            raise _corrupt(
                path,
                f"tensor `{name}` has dtype {json.dumps(info['dtype'])[:40]}, "
                "which the safetensors format does not define",
            )
        if count * bits % 8:
            raise _corrupt(path, f"tensor `{name}` ({info['dtype']}) does not end on a byte")
        if stop > data_size or stop - start != count * bits // 8:
            raise _corrupt(path, f"tensor `{name}` lies outside the file (truncated?)")
    return header, 8 + n


def dtype_bits(name: Any) -> int | None:
    """Bits per element of a safetensors dtype name, read or not; None for a name the
    format does not define.

    >>> dtype_bits("BF16"), dtype_bits("F8_E4M3"), dtype_bits("F4"), dtype_bits("F7")
    (16, 8, 4, None)
    """
    if not isinstance(name, str):
        return None
    if name in SAFETENSORS_DTYPES:
        return 8 * DTYPE_BYTES[SAFETENSORS_DTYPES[name]]
    return UNSUPPORTED_DTYPES[name][0] if name in UNSUPPORTED_DTYPES else None


def safetensors_shapes(path: str | Path | Sequence[str | Path]) -> dict[str, tuple]:
    """Map each tensor name to ``(shape, dtype)`` using Linnet dtype names.

    ``path`` is anything :func:`resolve_checkpoint` takes (a file, a directory, an index or
    a list of files); each value is a :class:`TensorInfo` naming its shard.
    """
    return checkpoint_shapes(resolve_checkpoint(path))


# ---------------------------------------------------------------- checkpoints


@dataclass(frozen=True)
class Checkpoint:
    """Where a checkpoint's tensors are: its shard files, and its index if it has one.

    ``directory`` is where its ``config.json`` would be (None for a list of files in
    several directories); ``weight_map`` is the index's tensor-to-shard map.
    """

    files: tuple[Path, ...]
    directory: Path | None = None
    index: Path | None = None
    weight_map: dict[str, str] | None = None

    @property
    def config_path(self) -> Path | None:
        """The checkpoint's ``config.json``, if its directory has one."""
        if self.directory is None:
            return None
        path = self.directory / "config.json"
        return path if path.is_file() else None


def resolve_checkpoint(weights: str | Path | Sequence[str | Path]) -> Checkpoint:
    """The files of a checkpoint given as a file, a directory, an index JSON or a list.

    A directory uses its ``model.safetensors.index.json`` when it has one, else every
    ``*.safetensors`` file in it. Nothing but the index is read here; the shards' headers
    are read by :func:`checkpoint_shapes`.

    >>> resolve_checkpoint("no/such/dir")   # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    linnet.lang.diagnostics.core.LinnetError: error[E0651]: ...
    """
    if isinstance(weights, str | os.PathLike):
        path = Path(weights)
        if path.is_dir():
            index = path / INDEX_NAME
            if index.is_file():
                return read_index(index)
            found = sorted(p for p in path.glob("*.safetensors") if p.is_file())
            if not found:
                raise coded_error(
                    "E0639",
                    f"directory `{path}` has no `{INDEX_NAME}` and no `*.safetensors` files",
                    help="pass the directory a checkpoint was saved or downloaded to "
                    "(Hugging Face's `save_pretrained` writes safetensors files)",
                )
            return Checkpoint(tuple(found), path)
        if path.suffix == ".json":
            if not path.is_file():
                raise coded_error(
                    "E0651", f"weights index `{path}` not found", help="check the path"
                )
            return read_index(path)
        if not path.exists():
            raise coded_error("E0651", f"weights file `{path}` not found", help="check the path")
        return Checkpoint((path,), path.parent)
    if (
        isinstance(weights, list | tuple)
        and weights
        and all(isinstance(w, str | os.PathLike) for w in weights)
    ):
        files = tuple(Path(w) for w in weights)
        missing = [f for f in files if not f.is_file()]
        if missing:
            raise LinnetError(
                [
                    Diagnostic("E0651", f"weights file `{f}` not found", help="check the path")
                    for f in missing
                ]
            )
        dirs = {f.resolve().parent for f in files}
        return Checkpoint(files, files[0].parent if len(dirs) == 1 else None)
    raise coded_error(
        "E0639",
        f"weights must be a safetensors file, a checkpoint directory, an "
        f"index JSON or a non-empty list of files, not {_describe(weights)}",
        help="e.g. weights='Llama-3.2-1B/' or weights=['a.safetensors', 'b.safetensors']",
    )


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def read_index(index: Path) -> Checkpoint:
    """A checkpoint from a ``model.safetensors.index.json``: its ``weight_map``'s shards.

    Shards must be plain file names beside the index; a shard the index names but that is
    not there is E0635 (every missing shard in one report).
    """

    def bad(why: str) -> LinnetError:
        return coded_error(
            "E0634",
            f"`{index}` is not a safetensors index: {why}",
            help="an index is a JSON object whose `weight_map` maps each tensor "
            "name to a shard file beside it; download or save it again",
        )

    try:
        if index.stat().st_size > MAX_INDEX_BYTES:
            raise bad(f"it has {index.stat().st_size} bytes, more than an index ever needs")
        data = json.loads(index.read_bytes())
    except RecursionError:
        raise bad("it nests too deeply") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad(f"not JSON ({exc})") from None
    except OSError as exc:
        raise coded_error("E0651", f"cannot read `{index}`: {exc}") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise bad("it has no `weight_map` object")
    shards: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        if (
            not isinstance(shard, str)
            or not shard
            or shard != Path(shard).name
            or shard in (".", "..")
        ):
            raise bad(f"tensor `{name}` maps to {shard!r}, not a file name beside the index")
        shards.setdefault(shard, []).append(name)
    missing = [s for s in shards if not (index.parent / s).is_file()]
    if missing:
        diags = []
        for s in missing:
            names = shards[s]
            shown = ", ".join(f"`{n}`" for n in names[:3]) + (
                f" and {len(names) - 3} more" if len(names) > 3 else ""
            )
            diags.append(
                Diagnostic(
                    "E0635",
                    f"shard `{s}` is missing from `{index.parent}`",
                    help=f"`{index.name}` puts {len(names)} tensor{'s' if len(names) != 1 else ''} "
                    f"in it ({shown}); download or copy the shard again",
                )
            )
        raise LinnetError(diags)
    return Checkpoint(
        tuple(index.parent / s for s in shards), index.parent, index, dict(weight_map)
    )


def unsupported_dtype(file: str, dtype: str, names: list[str]) -> Diagnostic:
    """E0723: a valid safetensors file holds tensors of a dtype Linnet does not load (float8,
    float4, unsigned wider than 8 bits, complex): one diagnostic per file and dtype."""
    shown = ", ".join(f"`{n}`" for n in names[:3]) + (
        f" and {len(names) - 3} more" if len(names) > 3 else ""
    )
    return Diagnostic(
        "E0723",
        f"`{file}` holds {len(names)} tensor{'s' if len(names) != 1 else ''} of dtype "
        f"{dtype} ({UNSUPPORTED_DTYPES[dtype][1]}), which Linnet does not load: {shown}",
        help="a float8 e4m3 weight loads (dequantised) with its scale beside it "
        "(`<name>_scale` or `<name>_scale_inv`, as fp8 checkpoints save them); other "
        "non-native weights are not supported yet: load a bf16, f16 or f32 checkpoint of "
        "the model (the same model's unquantised release, or the weights dequantised and "
        "saved again)",
    )


def checkpoint_shapes(ckpt: Checkpoint) -> dict[str, tuple]:
    """Every tensor of ``ckpt`` as a :class:`TensorInfo`, its headers read and validated.

    Each shard's header is checked (E0650), and against the index when there is one: a
    shard holding a tensor the index does not list (or lists in another shard) is E0636,
    a tensor the index lists but its shard lacks E0637, a tensor in two files E0638, a
    tensor of a dtype the format defines but Linnet does not load (float8...) E0723. Every
    problem in every shard is reported in one error.
    """
    diags: list[Diagnostic] = []
    out: dict[str, TensorInfo] = {}
    where: dict[str, str] = {}
    unreadable: set[str] = set()
    unsupported: dict[tuple[str, str], list[str]] = {}
    raw: dict[str, tuple[tuple[int, ...], str, str]] = {}
    for path in ckpt.files:
        try:
            header, _ = safetensors_header(path)
        except LinnetError as err:
            diags.extend(err.diagnostics)
            unreadable.add(path.name)
            continue
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if name in where:
                diags.append(
                    Diagnostic(
                        "E0638",
                        f"tensor `{name}` is in both `{where[name]}` and `{path.name}`",
                        help="a checkpoint holds each tensor once; remove one of the files",
                    )
                )
                continue
            if ckpt.weight_map is not None and ckpt.weight_map.get(name) != path.name:
                listed = ckpt.weight_map.get(name)
                diags.append(
                    Diagnostic(
                        "E0636",
                        f"shard `{path.name}` holds tensor `{name}`, which `"
                        f"{ckpt.index.name if ckpt.index else INDEX_NAME}` "
                        + (f"puts in `{listed}`" if listed else "does not list"),
                        help="the index and its shards come from different saves; download or "
                        "save the checkpoint again",
                    )
                )
                continue
            where[name] = path.name
            raw[name] = (tuple(info["shape"]), info["dtype"], path.name)
            if info["dtype"] not in SAFETENSORS_DTYPES:
                unsupported.setdefault((str(path), info["dtype"]), []).append(name)
                continue
            out[name] = TensorInfo(
                tuple(info["shape"]),
                SAFETENSORS_DTYPES[info["dtype"]],
                path.name if len(ckpt.files) > 1 else "",
            )
    # Float8 weights with their scales and GPTQ / AWQ packed weights load dequantised
    # (weights/unpacking.py): each is a float tensor of the checkpoint's float type; their
    # scales, zeros and group indices are not parameters.
    unpack, problems = unpacking_of({n: (s, dt) for n, (s, dt, _) in raw.items()}, ckpt.config_path)
    diags.extend(problems)
    for name in unpack.dropped | set(unpack.int4):
        out.pop(name, None)
    for name in [*unpack.fp8, *unpack.int4]:
        shape, _, file = raw[name]
        if name in unpack.int4:
            shape = unpack.int4[name].shape
        out[unpack.name(name)] = TensorInfo(
            shape, unpack.dtype(name), file if len(ckpt.files) > 1 else ""
        )
    unsupported = {
        k: kept
        for k, names in unsupported.items()
        if (kept := [n for n in names if n not in unpack.fp8])
    }
    diags.extend(
        unsupported_dtype(file, dtype, names) for (file, dtype), names in unsupported.items()
    )
    if ckpt.weight_map is not None:
        absent = [
            n
            for n, s in ckpt.weight_map.items()
            if n not in out
            and n not in where
            and s not in unreadable
            and not any(f"`{n}`" in d.message for d in diags)
        ]
        for name in absent[:20]:
            diags.append(
                Diagnostic(
                    "E0637",
                    f"`{ckpt.index.name if ckpt.index else INDEX_NAME}` puts tensor "
                    f"`{name}` in `{ckpt.weight_map[name]}`, but that shard does not hold it",
                    help="the index and its shards come from different saves; download or save "
                    "the checkpoint again",
                )
            )
        if len(absent) > 20:
            diags.append(
                Diagnostic(
                    "E0637",
                    f"... and {len(absent) - 20} more tensors the "
                    "index lists that their shards do not hold",
                )
            )
    if diags:
        raise LinnetError(diags)
    return dict(out)


def checkpoint_unpacking(ckpt: Checkpoint) -> Unpacking:
    """:func:`unpacking_of` a safetensors checkpoint (headers only; ``checkpoint_shapes``
    validated them first and reported any problem): the readers' plan."""
    tensors: dict[str, tuple[tuple[int, ...], str]] = {}
    for path in ckpt.files:
        header, _ = safetensors_header(path)
        for name, info in header.items():
            if name != "__metadata__":
                tensors[name] = (tuple(info["shape"]), info["dtype"])
    return unpacking_of(tensors, ckpt.config_path)[0]
