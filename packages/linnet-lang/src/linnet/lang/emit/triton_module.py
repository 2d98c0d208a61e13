"""The text a generated PyTorch module that launches Triton kernels starts with
(:data:`HEADER`: result allocation, programmatic dependent launch, L2 prefetch, the custom-op
library and scratch buffers), the readiness check each launcher runs (:data:`READY`), and the
table of launch functions (:func:`runs_table`). :mod:`.triton` writes the kernels and their
launchers; :mod:`.torch` puts these around them.

>>> print(runs_table(["a", "b"]))
# Per kernel instance: [calls that launched it, calls that ran the op's body].
RUNS = {'a': [0, 0], 'b': [0, 0]}
"""

from __future__ import annotations

from linnet.lang.emit import tile_edges, tiles

# The module's own part: imported only where a kernel is launched.
HEADER = (
    '''import contextlib
import os
import types

try:
    import triton
    import triton.language as tl
    TRITON = True
except ImportError:  # no Triton: every bound op runs its body; `@triton.jit` does nothing
    triton = types.SimpleNamespace(jit=lambda fn: fn)
    tl = types.SimpleNamespace(constexpr=int)  # the kernels' annotations
    TRITON = False

# Triton's interpreter runs kernels on CPU tensors; it must be chosen before the kernels
# below are decorated, so it is read once, here.
INTERPRET = os.environ.get('TRITON_INTERPRET') == '1'

# Kernel checkers (linnet.torch.testing) set POISON: results then start as NaN (integers:
# their smallest value) instead of torch.empty's leftovers, so an unstored lane shows.
POISON = False


def new_result(shape, dtype, device):
    if not POISON:
        return torch.empty(shape, dtype=dtype, device=device)
    fill = float('nan') if dtype.is_floating_point else torch.iinfo(dtype).min \
        if dtype != torch.bool else True
    return torch.full(shape, fill, dtype=dtype, device=device)

# Programmatic dependent launch (CUDA, compute capability 9.0 and later, and a Triton with
# `gdc_wait`): a kernel may be scheduled while the one before it in the stream drains, and
# waits on the device, in its first lines, for that one to finish (PDL_PROLOGUE in
# emit/triton.py). It hides a launch behind the kernel before it, which is what a decode
# step of hundreds of short kernels pays for. LINNET_PDL: 0 off; 1 each kernel lets the next
# be scheduled at its start ("early"); 2 (the default) after its main work, before its first
# store ("late"); 3 early for a grid of at most one program an SM, late for larger ones (a
# large grid's last wave frees SMs one by one, and an early next kernel crowds onto them);
# 4 late and 5 early, each kernel first prefetching into L2 what its first steps load
# (PREFETCH in emit/triton.py). Not while torch.compile traces a launch (inductor launches
# the kernel then), nor interpreted.
_PDL_MODE = os.environ.get('LINNET_PDL', '2')
if _PDL_MODE not in ('0', '1', '2', '3', '4', '5'):
    import warnings
    warnings.warn(f'LINNET_PDL={_PDL_MODE!r} is not 0 to 5; using 2', stacklevel=1)
    _PDL_MODE = '2'
PDL = int(_PDL_MODE) if TRITON and not INTERPRET and hasattr(
    getattr(getattr(tl, 'extra', None), 'cuda', None), 'gdc_wait') else 0
PDL_LAUNCH = {0: {}, 1: {'launch_pdl': True}, 2: {'launch_pdl': True}}
_PDL_DEVICES = {}


def pdl_launch(device, programs):
    """How a kernel of ``programs`` programs launched on ``device`` now uses programmatic
    dependent launch: 0 not, 1 early, 2 late (PDL's mode; 3 picks by ``programs``; 4 is late
    and 5 early, prefetching), on compute capability 9.0 and later, not under torch.compile."""
    if not PDL or device.type != 'cuda' or torch.compiler.is_compiling():
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _PDL_DEVICES:
        props = torch.cuda.get_device_properties(index)
        _PDL_DEVICES[index] = props.multi_processor_count if props.major >= 9 else 0
    sms = _PDL_DEVICES[index]
    if not sms:
        return 0
    if PDL == 3:
        return 1 if programs <= sms else 2
    return {4: 2, 5: 1}.get(PDL, PDL)


def prefetching(pdl):
    """1 where a kernel launched under ``pdl`` (pdl_launch's answer) first prefetches what it
    will load (PDL modes 4 and 5), else 0."""
    return 1 if pdl and PDL >= 4 else 0


# A dot of two 16-bit float tiles into f32 (the tensor cores' 16-bit rate). Triton's
# interpreter multiplies a bf16 dot's raw bits (it holds bf16 as uint16 and hands those to
# np.matmul: results off by 1e10), so interpreted the tiles are widened to f32 first, which
# gives the same products (each exact in f32) summed in another order.
if INTERPRET:
    @triton.jit
    def dot16(a, b):
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision='ieee',
                      out_dtype=tl.float32)
else:
    @triton.jit
    def dot16(a, b):
        return tl.dot(a, b, out_dtype=tl.float32)


# An L2 prefetch of the 128-byte lines under `pointers` where `mask` holds (PDL modes 4 and
# 5: the PREFETCH block in emit/triton.py): the lane whose address starts a line issues one
# `prefetch.global.L2`; no register is loaded and nothing waits on it. The kernel's own loads
# fetch a line the prefetch missed (a tile that starts inside a line).
@triton.jit
def prefetch_l2(pointers, mask):
    tl.inline_asm_elementwise(
        '{ .reg .pred %lp, %lq; .reg .b64 %lt; and.b64 %lt, $1, 127; '
        'setp.eq.b64 %lq, %lt, 0; setp.ne.b32 %lp, $2, 0; and.pred %lp, %lp, %lq; '
        '@%lp prefetch.global.L2 [$1]; mov.u32 $0, 0; }',
        '=r,l,r', [pointers, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)

# torch.compile sees each launch as a custom op, so compiled code does not break its graph
# there: a triton_op whose body launches through wrap_triton. The interpreter's kernels cannot
# be wrapped (pytorch#152868): there the op is opaque and calls the kernel directly.
wrap_triton = torch.library.wrap_triton if TRITON and not INTERPRET else (lambda fn: fn)
# Run eagerly (no torch.compile tracing it), a launch through wrap_triton dispatches a
# higher-order op: torch's own note puts that at up to a millisecond of host time, and each
# launch leaves an entry in torch's kernel side table for good. A launcher's eager branch runs
# under `direct()`, where wrap_triton gives the kernel itself, as triton_op's own eager path
# does; torch.compile, tracing the op, still sees wrap_triton's launch.
try:
    from torch._library.triton import set_wrap_triton_enabled
except ImportError:  # a torch without the switch: eager launches go through wrap_triton
    set_wrap_triton_enabled = None


def direct():
    if set_wrap_triton_enabled is None:
        return contextlib.nullcontext()
    return set_wrap_triton_enabled(False)


_LIBRARY = object()  # alive as long as this module's ops: its id names their library
LIBRARY = f'linnet_{id(_LIBRARY):x}'
'''
    + tile_edges.TRITON_HEADER
)

READY = '''def kernels_ready(key, *tensors):
    """Whether a bound op launches kernel `key` on these tensors (Triton importable, and the
    tensors on CUDA, or on the CPU under TRITON_INTERPRET=1); counts the answer in RUNS.
    Compiled code does not count: torch.compile would guard on the counter's value and
    recompile at every call (compiled graphs show the launch as a custom op instead)."""
    ready = TRITON and (all(t.is_cuda for t in tensors) or INTERPRET and not any(
        t.is_cuda for t in tensors))
    if not torch.compiler.is_compiling():
        RUNS[key][0 if ready else 1] += 1
    return ready


def kernel_op(name, run, fake, mutates=(), opaque=False):
    """`run` (a kernel's launch) as a custom op in this module's library: what torch.compile
    sees in place of the launch; `fake` gives its results' shapes without running it;
    `mutates` names the arguments it writes in place (states it stores into). `opaque`
    (a kernel with scratch buffers, which torch.compile cannot trace): a custom op that
    runs the launch as it is (the kernel itself, see `direct`), not a triton_op."""
    if not TRITON:
        return run
    if INTERPRET or opaque:
        def launch(*tensors):  # compiled code calls it at run time: the kernel itself
            with direct():
                return run(*tensors)

        schema = torch.library.infer_schema(run, mutates_args=mutates)
        op = torch.library.custom_op(f'{LIBRARY}::{name}', launch, mutates_args=mutates,
                                     schema=schema)
        op.register_fake(fake)
        return op
    return torch.library.triton_op(f'{LIBRARY}::{name}', run, mutates_args=mutates)


_SCRATCH = {}


def scratch(key, name, shape, dtype, device):
    """Scratch buffer `name` of kernel instance `key` on `device`: made zeroed at the first
    launch there (before a CUDA graph captures one) and kept, so that its counters start
    each launch at 0, as the kernel leaves them. Launches of one instance run in stream order
    on one device; a buffer is never shared between instances."""
    at = (key, name, str(device))
    buffer = _SCRATCH.get(at)
    if buffer is None:
        buffer = _SCRATCH[at] = torch.zeros(shape, dtype=dtype, device=device)
    return buffer


def rows_in_place(x, shape):
    """`x` as a kernel parameter of `shape` reads it: `x` itself where it has that shape and
    a contiguous last axis (read through its own strides, `strides_as`: one half of a joined
    product, a slice of rows), else a contiguous copy, so that each row is still read in
    wide coalesced loads."""
    if tuple(x.shape) == shape and (not shape or x.stride(-1) == 1 or shape[-1] <= 1):
        return x
    return x.contiguous()


def strides_as(x, shape, contiguous):
    """The strides a kernel reads `x` with as a parameter of `shape`: its own where it has
    that shape, else `contiguous` (a contiguous tensor read as another shape: a state whose
    first two axes a store into it takes as one)."""
    return tuple(x.stride()) if tuple(x.shape) == shape else contiguous


def check_inplace(state, name, kernel):
    """A state that kernel `kernel` stores into (`name`) must be contiguous: it is written
    where it is, with the strides the kernel was written for."""
    if not state.is_contiguous():
        raise ValueError(f'kernel `{kernel}` stores into `{name}`, which is not contiguous '
                         f'(strides {tuple(state.stride())}); states are allocated '
                         'contiguous: pass the state itself, not a view of it')'''


def runs_table(keys: list[str]) -> str:
    """``RUNS``: per kernel instance, [calls that launched it, calls that ran the body]."""
    return tiles.runs_table(keys, "calls")
