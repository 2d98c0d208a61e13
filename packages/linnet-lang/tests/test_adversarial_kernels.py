"""The adversarial suite, kernel side (issue 38, items 3 and 11): tile kernels that index
out of bounds or race between programs, whatever the data, are coded errors from `linnet
check` (E0548, E0549) and from emission at a call's own shapes, never a launch that writes
someone else's memory; right kernels (the std library's, the spec's, the "last program"
pattern with `atomic_add`) still check. The sampler's first case has odd sizes, so that a
grid or mask that assumes whole tiles shows. Launches (Triton's interpreter, guarded memory)
are in linnet-runtime-torch's test_kernel_checks_run.py.

Case classes: crashes (wild stores: E0548 where a process died), silent wrong results (loads
past a row, races: E0548, E0549), and no false errors on right kernels.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from linnet.lang import LinnetError, Program, check_program, check_text, lower
from linnet.lang.check.kernel_access import case_faults, kernel_access_errors
from linnet.lang.check.kernel_cases import SOFTMAX_EXAMPLE, bound_ops, sample_cases, std_program
from linnet.lang.check.kernel_instances import with_kernels
from linnet.lang.check.tile_lowering import lower_kernel
from linnet.lang.emit.torch import emit_torch
from linnet.lang.ir.accesses import access_faults
from test_kernel_scratch import TOTAL


def op_of(
    kernel: str,
    generics: str,
    binding: str,
    params: str = "x: Tensor[N; f32]",
    result: str = "Tensor[N; f32]",
    body: str = "let y[i] = x[i] * 2.0",
    where: str = "",
) -> str:
    """``kernel`` and a public op `o<generics>` bound to it with ``binding``."""
    return (
        f"{kernel}\n\npub op o<{generics}>({params}) -> {result} kernel {binding}"
        f"{' where ' + where if where else ''} {{\n    {body}\n    return y\n}}\n"
    )


ONE_D = "kernel k<N: Dim, B: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid((N + B - 1) / B) {"
ROWS = (
    "kernel k<R: Dim, C: Dim, B: Dim>(x: Tensor[R, C; f32]) -> y: Tensor[R, C; f32] "
    "grid(R) where B >= C {"
)
ROW_OP = dict(
    generics="R: Dim, C: Dim",
    binding="k<R, C, 64>",
    params="x: Tensor[R, C; f32]",
    result="Tensor[R, C; f32]",
    body="let y[r, c] = x[r, c] * 2.0",
)

# (source, code, what the message names): each passed `linnet check` before.
WRONG = {
    # item 11: stores past the end of the result, the process killed on a launch
    "unmasked store, last partial tile": (
        op_of(
            ONE_D + "\n    let cols = program_id(0) * B + iota<i32>(B)\n"
            "    store(y[cols], load(x[cols], cols < N, 0.0) * 2.0)\n}",
            "N: Dim",
            "k<N, 16>",
        ),
        "E0548",
        "`store` writes y[",
    ),
    "store one past the end (mask off by one)": (
        op_of(
            ONE_D + "\n    let cols = program_id(0) * B + iota<i32>(B)\n"
            "    store(y[cols], load(x[cols], cols < N, 0.0), cols <= N)\n}",
            "N: Dim",
            "k<N, 4>",
            body="let y[i] = x[i]",
        ),
        "E0548",
        "`store` writes y[",
    ),
    "store before the start": (
        op_of(
            ONE_D + "\n    let cols = program_id(0) * B + iota<i32>(B)\n"
            "    store(y[cols - 1], load(x[cols], cols < N, 0.0), cols < N)\n}",
            "N: Dim",
            "k<N, 4>",
        ),
        "E0548",
        "y[-1]",
    ),
    "store a scalar into the next program's row": (
        op_of(
            "kernel k<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N) {\n"
            "    let i = program_id(0)\n    store(y[i + 1], load(x[i]))\n}",
            "N: Dim",
            "k<N>",
            body="let y[i] = x[i]",
        ),
        "E0548",
        "axis 0 has",
    ),
    "a 2-D store masked by rows only": (
        op_of(
            "kernel k<R: Dim, C: Dim, BR: Dim, BC: Dim>(x: Tensor[R, C; f32]) -> "
            "y: Tensor[R, C; f32] grid((R + BR - 1) / BR, (C + BC - 1) / BC) {\n"
            "    let rows = program_id(0) * BR + iota<i32>(BR)\n"
            "    let cols = program_id(1) * BC + iota<i32>(BC)\n"
            "    let m[i, j] = rows[i] < R && cols[j] < C\n"
            "    let keep[i, j] = rows[i] < R && cols[j] >= 0\n"
            "    store(y[rows, cols], load(x[rows, cols], m, 0.0), keep)\n}",
            "R: Dim, C: Dim",
            "k<R, C, 4, 8>",
            params="x: Tensor[R, C; f32]",
            result="Tensor[R, C; f32]",
            body="let y[r, c] = x[r, c]",
        ),
        "E0548",
        "axis 1",
    ),
    "a loop's last tile stored unmasked": (
        op_of(
            "kernel k<N: Dim, B: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(1) {\n"
            "    for t in 0..(N + B - 1) / B {\n"
            "        let cols = t * B + iota<i32>(B)\n"
            "        store(y[cols], load(x[cols], cols < N, 0.0))\n    }\n}",
            "N: Dim",
            "k<N, 4>",
            body="let y[i] = x[i]",
        ),
        "E0548",
        " at t = ",
    ),
    "a count past its scratch buffer": (
        op_of(
            "kernel k<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N) "
            "scratch(seen: Tensor[1; i32]) {\n    let i = program_id(0)\n"
            "    let before = atomic_add(seen[i], 1)\n    store(y[i], load(x[i]))\n}",
            "N: Dim",
            "k<N>",
            body="let y[i] = x[i]",
        ),
        "E0548",
        "`atomic_add` adds to seen[",
    ),
    # item 3 (c): each row read a whole tile wide, into the next row and past the last
    "unmasked load past each row": (
        op_of(
            ROWS + "\n    let row = program_id(0)\n    let cols = iota<i32>(B)\n"
            "    let v = load(x[row, cols])\n    store(y[row, cols], v * 2.0, cols < C)\n}",
            **ROW_OP,
        ),
        "E0548",
        "`load` reads x[",
    ),
    "a load whose mask is off by one": (
        op_of(
            ROWS + "\n    let row = program_id(0)\n    let cols = iota<i32>(B)\n"
            "    let v = load(x[row, cols], cols <= C, 0.0)\n"
            "    store(y[row, cols], v * 2.0, cols < C)\n}",
            **ROW_OP,
        ),
        "E0548",
        "axis 1 has",
    ),
    # item 3 (b): programs that read what another stores, right only in order
    "a program reads the store of the one before": (
        op_of(
            "kernel k<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N) "
            "scratch(t: Tensor[N; f32]) {\n    let i = program_id(0)\n    let v = load(x[i])\n"
            "    store(t[i], v)\n    store(y[i], v + load(t[i - 1], i > 0, 0.0))\n}",
            "N: Dim",
            "k<N>",
            body="let y[i] = x[i] + select(i > 0, x[max(i - 1, 0)], 0.0)",
        ),
        "E0549",
        "races with the `store` of program",
    ),
    "a program reads what the next one overwrites": (
        op_of(
            "kernel k<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N) "
            "scratch(t: Tensor[N; f32]) {\n    let i = program_id(0)\n"
            "    let old = load(t[i + 1], i + 1 < N, 0.0)\n    store(t[i], load(x[i]))\n"
            "    store(y[i], old)\n}",
            "N: Dim",
            "k<N>",
            body="let y[i] = x[i] * 0.0",
        ),
        "E0549",
        "`load` of t[",
    ),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_a_wrong_kernel_is_a_coded_error_from_check(name: str) -> None:
    source, code, named = WRONG[name]
    with pytest.raises(LinnetError) as info:
        check_text(source)
    [diag] = info.value.diagnostics
    assert diag.code == code and named in diag.message, diag.message
    assert "in program (" in diag.message and "kernel `k`" in diag.message
    # At the access, naming the op's generics that show it; rendering never raises.
    assert diag.span is not None and diag.span.source.text[diag.span.start :].startswith(
        ("load(", "store(", "atomic_add(")
    )
    assert "for op `o`'s" in diag.label and diag.help
    assert str(info.value).count("error[") == 1


RIGHT = {
    "the spec's softmax": SOFTMAX_EXAMPLE,
    "the last program reads the others' partial sums after its count": TOTAL,
    "a program reads back its own scratch": op_of(
        "kernel k<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N) "
        "scratch(t: Tensor[N; f32]) {\n    let i = program_id(0)\n    store(t[i], load(x[i]))\n"
        "    store(y[i], load(t[i]) * 2.0)\n}",
        "N: Dim",
        "k<N>",
    ),
    "a 2-D tile masked on both axes": op_of(
        "kernel k<R: Dim, C: Dim, BR: Dim, BC: Dim>(x: Tensor[R, C; f32]) -> "
        "y: Tensor[R, C; f32] grid((R + BR - 1) / BR, (C + BC - 1) / BC) {\n"
        "    let rows = program_id(0) * BR + iota<i32>(BR)\n"
        "    let cols = program_id(1) * BC + iota<i32>(BC)\n"
        "    let m[i, j] = rows[i] < R && cols[j] < C\n"
        "    store(y[rows, cols], load(x[rows, cols], m, 0.0) * 2.0, m)\n}",
        "R: Dim, C: Dim",
        "k<R, C, 4, 8>",
        params="x: Tensor[R, C; f32]",
        result="Tensor[R, C; f32]",
        body="let y[r, c] = x[r, c] * 2.0",
    ),
    # An index read from data: out of range or not depends on it (linnet kernels runs it).
    "a store at an index from data": op_of(
        "kernel k<N: Dim>(x: Tensor[N; f32], at: Tensor[N; i32]) -> y: Tensor[N; f32] "
        "grid(N) {\n    let i = program_id(0)\n    store(y[load(at[i])], load(x[i]))\n}",
        "N: Dim",
        "k<N>",
        params="x: Tensor[N; f32], at: Tensor[N; i32]",
        body="let y[i] = x[i] + 0.0 * (at[i] as f32)",
    ),
}


@pytest.mark.parametrize("name", sorted(RIGHT))
def test_a_right_kernel_still_checks(name: str) -> None:
    assert check_program(Program.from_text(RIGHT[name])) == []


def test_every_std_kernel_is_free_of_access_faults_on_its_first_cases() -> None:
    """No false error: each bound op of the std library on its first sampled case (odd
    sizes, partial tiles), both kernels of a chain; ints' scalars given a value."""
    program = std_program()
    looked = 0
    for op in bound_ops(program):
        for case in sample_cases(program, op, 1, 0, 48):
            assert case_faults(program, op, case) == [], (op.qualified_name, case)
            looked += 1
    assert looked >= 25


def test_the_first_sampled_case_has_odd_sizes_where_the_clauses_allow() -> None:
    """Item 3 (a): a grid that rounds down (grid(N / B)) drops the last partial tile only
    where N is no multiple of B; the first case of every op is odd in each dim."""
    program = check_text(
        op_of(
            "kernel k<N: Dim, B: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N / B) {\n"
            "    let cols = program_id(0) * B + iota<i32>(B)\n"
            "    store(y[cols], load(x[cols], cols < N, 0.0) * 2.0, cols < N)\n}",
            "N: Dim",
            "k<N, 16>",
        )
    )
    [op] = bound_ops(program)
    for seed in range(6):
        for count in (1, 3):
            first = sample_cases(program, op, count, seed)[0]
            assert first.generics["N"] % 2 == 1, (seed, first)
    # Where a clause needs an even size, the first case is drawn like the others.
    even = check_text(
        op_of(
            ROWS + "\n    let row = program_id(0)\n    let cols = iota<i32>(B)\n"
            "    store(y[row, cols], load(x[row, cols], cols < C, 0.0), cols < C)\n}",
            **{**ROW_OP, "where": "C % 2 == 0", "body": "let y[r, c] = x[r, c]"},
        )
    )
    [op] = bound_ops(even)
    assert all(c.generics["C"] % 2 == 0 for c in sample_cases(even, op, 3, 0))


# A kernel wrong only for shapes the check's samples never reach (C >= 64: sizes up to 48):
# emission, at the call's own shapes, refuses it before anything runs.
LATE = (
    op_of(
        "kernel k<R: Dim, C: Dim, B: Dim>(x: Tensor[R, C; f32]) -> y: Tensor[R, C; f32] grid(R)\n"
        "where B >= C {\n    let row = program_id(0)\n    let cols = iota<i32>(B)\n"
        "    store(y[row, cols], load(x[row, cols], cols < C, 0.0) * 2.0)\n}",
        "R: Dim, C: Dim",
        "k<R, C, 128>",
        params="x: Tensor[R, C; f32]",
        result="Tensor[R, C; f32]",
        body="let y[r, c] = x[r, c] * 2.0",
        where="C >= 64",
    )
    + """
model M<R: Dim, C: Dim> {
    entry run(x: Tensor[R, C; f32]) -> Tensor[R, C; f32] { return o(x) }
}
"""
)


def test_emission_refuses_a_kernel_wrong_at_the_calls_own_shapes() -> None:
    program = check_text(LATE)  # no case of at most 48 reaches C >= 64: it checks
    graph = lower(program, "run", {"x": [3, 100]}, {"R": 3, "C": 100})
    sources = {m.source.name: m.source.text for m in program.modules.values()}
    with pytest.raises(LinnetError) as info:
        emit_torch(with_kernels(graph, program), sources, numerics="fast")
    [diag] = info.value.diagnostics
    assert diag.code == "E0548" and "`store` writes y[0, 100]" in diag.message
    assert "R = 3, C = 100, B = 128" in diag.label and "`main::o` at" in diag.label
    # Under numerics exact no kernel is written: nothing to refuse.
    emit_torch(with_kernels(graph, program), sources, numerics="exact")
    # JAX (Pallas) is emitted by the same code.
    from linnet.lang.emit.jax import emit_jax

    with pytest.raises(LinnetError) as info:
        emit_jax(with_kernels(graph, program), sources, numerics="fast")
    assert info.value.diagnostics[0].code == "E0548"


def test_linnet_check_exits_1_on_a_wild_store(tmp_path: Path) -> None:
    """Item 11: the file that killed `linnet kernels` and the user's program with SIGABRT
    fails `linnet check` with E0548 instead."""
    path = tmp_path / "wild.linnet"
    path.write_text(WRONG["unmasked store, last partial tile"][0])
    done = subprocess.run(
        [sys.executable, "-m", "linnet.lang.cli", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "error[E0548]" in done.stdout + done.stderr
    assert "Traceback" not in done.stderr


def checked(source: str) -> Program:
    """``source`` checked but for its kernels' accesses (the pass is run by hand)."""
    program = Program.from_text(source)
    assert check_program(program, kernel_accesses=False) == []
    return program


def test_the_pass_names_the_lane_program_and_loop() -> None:
    program = checked(
        op_of(
            "kernel k<N: Dim, B: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(1) {\n"
            "    for t in 0..(N + B - 1) / B {\n"
            "        let cols = t * B + iota<i32>(B)\n"
            "        store(y[cols], load(x[cols], cols < N, 0.0), cols < N)\n    }\n}",
            "N: Dim",
            "k<N, 4>",
            body="let y[i] = x[i]",
        )
    )
    k = lower_kernel(program, "main::k", {"N": 7, "B": 4})
    assert access_faults(k) == []
    # The same steps, each mask dropped: the last tile's lane 3 reads x[7] and writes y[7].
    for s in k.walk():
        s.attributes.pop("mask", None)
    load, store = access_faults(k)
    assert (load.op, load.tensor, store.op, store.tensor) == ("load", "x", "store", "y")
    assert (store.element, store.program, store.loops, store.lane) == (
        (7,),
        (0,),
        (("t", 1),),
        (3,),
    )
    assert store.code == "E0548" and "at t = 1 (lane [3])" in store.describe()


def test_a_large_grid_and_loop_are_sampled_with_their_ends() -> None:
    """A grid of thousands of programs: the pass looks at both ends (the partial tile is at
    the last program) in a bounded time."""
    program = checked(WRONG["unmasked store, last partial tile"][0])
    k = lower_kernel(program, "main::k", {"N": 100_001, "B": 16})
    [fault] = access_faults(k)
    assert fault.program == (6250,) and fault.element == (100_001,)


def test_check_program_can_leave_accesses_to_linnet_kernels() -> None:
    program = Program.from_text(WRONG["unmasked load past each row"][0])
    assert check_program(program, kernel_accesses=False) == []
    assert [d.code for d in kernel_access_errors(program)] == ["E0548"]


def test_the_pass_computes_indices_as_numpy_does() -> None:
    """The pass's tiles (elements kept over the axes they vary along) against NumPy:
    broadcasts, reshapes, transposes, reductions, masks kept as factors."""
    import itertools

    import numpy as np
    from linnet.lang.ir.accesses import Tile, _and, _live, _map, _reduce, _reshape, _transpose

    def tile(a: np.ndarray) -> Tile:
        return Tile(a.shape, _live(a.shape), a.reshape(-1).tolist())

    def array(t: Tile) -> np.ndarray:
        return np.array(t.over(tuple(range(len(t.shape)))), dtype=object).reshape(t.shape)

    rng = np.random.default_rng(0)
    for shape in [(2, 3), (1, 4), (3, 1, 2), (2, 3, 4)]:
        a = rng.integers(-5, 5, shape)
        for perm in itertools.permutations(range(len(shape))):
            assert (array(_transpose(tile(a), perm)) == a.transpose(perm)).all()
        for axes in ([0], [len(shape) - 1], list(range(len(shape)))):
            want = a.sum(axis=tuple(axes))
            got = _reduce(tile(a), "sum", axes, want.shape)
            assert got is not None and (array(got) == want).all()
        flat = (int(np.prod(shape)),)
        assert (array(_reshape(tile(a), flat)) == a.reshape(flat)).all()
    rows, cols = np.arange(4).reshape(4, 1), np.arange(8).reshape(1, 8)
    lt = _map(lambda x, y: x < y, (4, 8), [tile(rows), tile(np.array(3))])
    both = _and((4, 8), lt, _map(lambda x, y: x >= y, (4, 8), [tile(cols), tile(np.array(5))]))
    assert both.factors and (array(both) == ((rows < 3) & (cols >= 5))).all()
    wide = both.broadcast((2, 4, 8))
    assert (array(wide) == np.broadcast_to((rows < 3) & (cols >= 5), (2, 4, 8))).all()
    spread = _map(lambda x, y: x * 10 + y, (4, 8), [tile(rows), tile(cols)])
    assert (array(spread) == rows * 10 + cols).all()


@pytest.mark.parametrize(
    "body",
    [
        # a tile of 2^24 lanes: not computed (left to `linnet kernels`), not a minute of Python
        "    let i = program_id(0) + iota<i32>(16777216)\n"
        "    store(y[i], load(x[i], i < N, 0.0), i < N)\n",
        # three nested loops of a thousand, each carrying an index: the pass stops in time
        "    let at = program_id(0)\n"
        "    for a in 0..1000 {\n        for b in 0..1000 {\n            for c in 0..1000 {\n"
        "                at = (at + 1) % N\n            }\n        }\n    }\n"
        "    store(y[at], load(x[at]))\n",
    ],
    ids=["a tile of 2^24 lanes", "three nested loops carrying an index"],
)
def test_a_hostile_kernel_is_checked_in_bounded_time(body: str) -> None:
    import time

    source = op_of(
        "kernel k<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N) {\n" + body + "}",
        "N: Dim",
        "k<N>",
        body="let y[i] = x[i]",
    )
    start = time.perf_counter()
    assert check_program(Program.from_text(source)) == []
    assert time.perf_counter() - start < 60
