"""Long explanations of Linnet's error codes, printed by ``linnet explain E0301``.

Every code the compiler, the CLI and the readers raise has an entry: a one-line summary,
a short paragraph on why it happens, and a small wrong example with its fix. Codes about
configs, inputs, weights and files show the ``linnet`` or Python call instead of source.

Codes are grouped by their hundreds:

* ``E00xx`` reading and lexing source files
* ``E01xx`` syntax (the parser)
* ``E02xx`` names, modules and imports
* ``E03xx`` statements, index notation and element types
* ``E04xx`` types, calls and returns
* ``E05xx`` kernels and gradients
* ``E06xx`` blocks and models, lowering, configs, inputs and weights
* ``E09xx`` serialised graphs, and internal errors (E0920-E0929: the graph verifier)

``tests/test_diagnostics_golden.py`` checks that every code used in the package has an
entry here, and that the Linnet examples fail (and pass) as they say.

>>> EXPLANATIONS["E0301"].splitlines()[0]
'An index variable is used for an axis of a different size.'
"""

from __future__ import annotations

EXPLANATIONS: dict[str, str] = {
    # ------------------------------------------------------------ E00xx: files and lexing
    "E0001": """\
A source file cannot be read.

The file passed to `linnet` (or a module it `use`s) does not exist, is not readable, or is
not UTF-8 text.

Wrong:

    $ linnet check modle.linnet

Fixed:

    $ linnet check model.linnet
""",
    "E0002": """\
A character that is not part of Linnet's syntax.

The lexer found a character no token starts with, such as `$`, `?` or a `#` meant as a
comment. Linnet comments start with `//` (or are wrapped in `/* ... */`).

Wrong:

    pub fn double(x: f32) -> f32 {
        return x * 2.0  # twice
    }

Fixed:

    pub fn double(x: f32) -> f32 {
        return x * 2.0  // twice
    }
""",
    "E0003": """\
A block comment is never closed.

A `/*` comment runs to the matching `*/`; without one, the rest of the file is a comment.

Wrong:

    /* Doubles its argument.
    pub fn double(x: f32) -> f32 {
        return x * 2.0
    }

Fixed:

    /* Doubles its argument. */
    pub fn double(x: f32) -> f32 {
        return x * 2.0
    }
""",
    "E0004": """\
A string literal is never closed.

A string starts with `"` and must end with `"` on the same line. (Linnet has no string
values either: see E0116.)

Wrong:

    pub fn double(x: f32) -> f32 {
        let name = "double
        return x * 2.0
    }

Fixed:

    pub fn double(x: f32) -> f32 {
        return x * 2.0
    }
""",
    # ------------------------------------------------------------ E01xx: syntax
    "E0100": """\
The parser expected one token and found another.

The message says what was expected (`=`, `)`, `]`, `:`, ...) and what was found. The
missing token is usually just before the place marked.

Wrong:

    pub fn double(x: f32) -> f32 {
        let y x * 2.0
        return y
    }

Fixed:

    pub fn double(x: f32) -> f32 {
        let y = x * 2.0
        return y
    }
""",
    "E0101": """\
A keyword is used as a name.

Words such as `state`, `param`, `model`, `block`, `config`, `entry`, `kernel`, `op`, `in`
and `grad` are reserved. Pick another name, for example with a trailing underscore.

Wrong:

    pub op scale<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let state[n] = x[n] * 2.0
        return state
    }

Fixed:

    pub op scale<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let state_[n] = x[n] * 2.0
        return state_
    }
""",
    "E0102": """\
Something other than an item at the top level of a module.

A module holds `use`, `op`, `fn`, `kernel`, `block`, `model` and `const` items; statements
live inside bodies. Functions are declared with `fn` (or `op`), not `def`.

Wrong:

    def double(x: f32) -> f32 {
        return x * 2.0
    }

Fixed:

    pub fn double(x: f32) -> f32 {
        return x * 2.0
    }
""",
    "E0103": """\
A generic parameter of an unknown kind.

A generic is either a dimension (`Dim`) or an element type (`DType`).

Wrong:

    pub op scale<N: Int>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = x[n] * 2.0
        return y
    }

Fixed:

    pub op scale<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = x[n] * 2.0
        return y
    }
""",
    "E0104": """\
A function's body does not start with `{`.

After the parameters come the results (`-> Tensor[...]`), optionally a kernel binding and a
`where` clause, then the body in braces. A missing `{` or a malformed result type ends up
here.

Wrong:

    pub fn double(x: f32) -> f32
        return x * 2.0
    }

Fixed:

    pub fn double(x: f32) -> f32 {
        return x * 2.0
    }
""",
    "E0105": """\
An `entry` outside a `model`.

Entries are the functions a runtime calls, so only models have them. A block's methods are
`fn`s.

Wrong:

    block Scale<N: Dim> {
        param w: Tensor[N; f32]

        entry run(x: Tensor[N; f32]) -> Tensor[N; f32] {
            let y[n] = x[n] * self.w[n]
            return y
        }
    }

Fixed:

    block Scale<N: Dim> {
        param w: Tensor[N; f32]

        fn run(x: Tensor[N; f32]) -> Tensor[N; f32] {
            let y[n] = x[n] * self.w[n]
            return y
        }
    }
""",
    "E0106": """\
Something other than a member inside a `block` or `model`.

A block holds `param`, `state`, `block`, `config` and `fn` declarations (a model also
`entry`); each member starts with its kind.

Wrong:

    block Scale<D: Dim> {
        weight: Tensor[D; f32]
    }

Fixed:

    block Scale<D: Dim> {
        param weight: Tensor[D; f32]
    }
""",
    "E0107": """\
Only blocks can be repeated with `[...; N]`.

`[Layer<...>; N]` declares N sub-blocks with their own parameters. A stack of tensors is one
tensor with an extra axis.

Wrong:

    block Stack<D: Dim, L: Dim> {
        block weights: [Tensor[D; f32]; L]
    }

Fixed:

    block Stack<D: Dim, L: Dim> {
        param weights: Tensor[L, D; f32]
    }
""",
    "E0108": """\
A tensor type without an element type.

Tensor types list their dims, then `;` and the element type: `Tensor[R, C; f32]`.

Wrong:

    pub op scale<R: Dim, C: Dim>(x: Tensor[R, C]) -> Tensor[R, C; f32] {
        let y[r, c] = x[r, c] * 2.0
        return y
    }

Fixed:

    pub op scale<R: Dim, C: Dim>(x: Tensor[R, C; f32]) -> Tensor[R, C; f32] {
        let y[r, c] = x[r, c] * 2.0
        return y
    }
""",
    "E0109": """\
A statement continues after it should have ended.

A statement ends at the end of its line (or at `;`). Two statements on one line, or a stray
token after a complete expression, end up here.

Wrong:

    pub fn f(x: f32) -> f32 {
        let y = x * 2.0 let z = y + 1.0
        return z
    }

Fixed:

    pub fn f(x: f32) -> f32 {
        let y = x * 2.0
        let z = y + 1.0
        return z
    }
""",
    "E0110": """\
A `{` is never closed.

The file ended inside a body. The `{` marked is the one without its `}`.

Wrong:

    pub fn double(x: f32) -> f32 {
        return x * 2.0

Fixed:

    pub fn double(x: f32) -> f32 {
        return x * 2.0
    }
""",
    "E0111": """\
A `let` with a type annotation.

Types are inferred. In index notation the brackets name the result's indices, and an
index may carry its range: `let y[r: R] = ...`.

Wrong:

    pub fn double<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y: Tensor[N; f32] = x * 2.0
        return y
    }

Fixed:

    pub fn double<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y = x * 2.0
        return y
    }
""",
    "E0112": """\
Assignment to something that cannot be assigned.

`=` assigns to a variable declared with `let` (`h = ...`) or writes into a block's state
with indices (`self.cache[b, t, d] = ...`). Calls and other expressions are not places.

Wrong:

    pub fn f<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        exp(x) = x
        return x
    }

Fixed:

    pub fn f<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let e = exp(x)
        return e
    }
""",
    "E0113": """\
An index variable on the left of `let` is not a plain name.

`let y[r, c] = ...` names the result's axes; each is a plain name, optionally with a range.
Computed positions (shifts, offsets) belong on the right-hand side.

Wrong:

    pub op shift<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n + 1] = x[n]
        return y
    }

Fixed:

    pub op shift<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n: N] = select(n > 0, x[n - 1], 0.0)
        return y
    }
""",
    "E0114": """\
Comparisons are chained.

`a < b < c` does not mean "b is between a and c" in Linnet; join two comparisons with `&&`.

Wrong:

    pub op band<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = select(0.0 < x[n] < 1.0, x[n], 0.0)
        return y
    }

Fixed:

    pub op band<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = select(0.0 < x[n] && x[n] < 1.0, x[n], 0.0)
        return y
    }
""",
    "E0115": """\
A reduction with nothing to reduce.

`sum[c]`, `max[c]`, `min[c]`, `mean[c]` and `prod[c]` take the expression that follows them.

Wrong:

    pub op total<R: Dim, C: Dim>(x: Tensor[R, C; f32]) -> Tensor[R; f32] {
        let y[r] = sum[c]
        return y
    }

Fixed:

    pub op total<R: Dim, C: Dim>(x: Tensor[R, C; f32]) -> Tensor[R; f32] {
        let y[r] = sum[c] x[r, c]
        return y
    }
""",
    "E0116": """\
A string literal used as a value.

Linnet has no strings. Call the function you mean by name, or choose between behaviours
with a `config` bool or a generic.

Wrong:

    use std.nn.activation::{silu}

    pub op act<N: Dim, F: Dim>(x: Tensor[N, F; f32]) -> Tensor[N, F; f32] {
        let y = activation("silu", x)
        return y
    }

Fixed:

    use std.nn.activation::{silu}

    pub op act<N: Dim, F: Dim>(x: Tensor[N, F; f32]) -> Tensor[N, F; f32] {
        let y = silu(x)
        return y
    }
""",
    "E0117": """\
An expression was expected.

An expression is a name, a number, a call, an index, a reduction or an `if`. A line ending
in an operator, or an empty argument, ends up here.

Wrong:

    pub fn f(x: f32) -> f32 {
        let y = x * 2.0 +
        return y
    }

Fixed:

    pub fn f(x: f32) -> f32 {
        let y = x * 2.0 + 1.0
        return y
    }
""",
    "E0118": """\
Brackets, signs, types or blocks nest too deeply.

The parser reads nested code recursively, and so do the checker and lowering; past 64
levels of `(`, `[`, `{`, unary `-`/`!` or reductions a program is refused at the level
where the limit is reached, instead of running out of stack. Real models nest a dozen
levels at most: name the inner parts with `let`, and drop redundant brackets.

Wrong:

    >>> check_text("const C: i32 = " + "(" * 100 + "1" + ")" * 100)

Fixed:

    >>> check_text("const C: i32 = 1")
""",
    "E0119": """\
An expression is too deep: more than 128 operations inside one another.

A long chain like `a + b + c + ...` is flat text but a deep syntax tree (each `+` holds the
chain before it), which the checker walks recursively. Split it into `let` statements, or
sum over an axis with a reduction.

Wrong:

    >>> check_text("const C: i32 = " + " + ".join(["1"] * 200))

Fixed:

    >>> check_text("const A: i32 = " + " + ".join(["1"] * 100) + "\\n"
    ...            "const C: i32 = A + " + " + ".join(["1"] * 100))
""",
    "E0120": """\
An integer literal does not fit in 64 bits.

Integers in Linnet (sizes, indices, `i32`/`i64` constants) are at most 2^63 - 1 =
9223372036854775807. Write a large constant as a float.

Wrong:

    const BIG: f32 = 100000000000000000000

Fixed:

    const BIG: f32 = 1e20
""",
    # ------------------------------------------------------------ E02xx: names
    "E0200": """\
A `use` names a module that does not exist.

`use std.nn.linear::{...}` reads the std library shipped with linnet-lang; any other
`use a.b::{...}` reads `a/b.linnet` beside the file that uses it.

Wrong:

    use std.nn.linaer::{linear}

    pub fn two() -> f32 {
        return 2.0
    }

Fixed:

    use std.nn.linear::{linear}

    pub fn two() -> f32 {
        return 2.0
    }
""",
    "E0201": """\
A name that is not defined.

The name is not a local variable, an index variable, a generic, an item of this module or
an imported one. The help suggests close spellings. Reductions (`sum`, `max`, ...) are not
functions: they name the reduced index, `sum[i] x[i]`.

Wrong:

    pub op residual<N: Dim>(hidden: Tensor[N; f32], update: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = hiden[n] + update[n]
        return y
    }

Fixed:

    pub op residual<N: Dim>(hidden: Tensor[N; f32], update: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = hidden[n] + update[n]
        return y
    }
""",
    "E0202": """\
A `use` imports a name its module does not have.

The module exists but declares no item of that name. The help lists close names, or what
the module exports.

Wrong:

    use std.nn.activation::{relu}

    pub op act<N: Dim, F: Dim>(x: Tensor[N, F; f32]) -> Tensor[N, F; f32] {
        return relu(x)
    }

Fixed:

    use std.nn.activation::{silu}

    pub op act<N: Dim, F: Dim>(x: Tensor[N, F; f32]) -> Tensor[N, F; f32] {
        return silu(x)
    }
""",
    "E0203": """\
A `use` imports a private item.

Only items marked `pub` can be used from other modules.

Wrong:

    // helpers.linnet
    fn secret(x: f32) -> f32 {
        return x * 3.0
    }

    // model.linnet
    use helpers::{secret}

Fixed:

    // helpers.linnet
    pub fn secret(x: f32) -> f32 {
        return x * 3.0
    }

    // model.linnet
    use helpers::{secret}
""",
    "E0204": """\
`self` outside a block's method.

`self` is the block instance a method runs on; free `op`s and `fn`s have none. Pass the
tensors they need as parameters, or make the function a method.

Wrong:

    pub op scale<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = x[n] * self.weight[n]
        return y
    }

Fixed:

    pub op scale<N: Dim>(x: Tensor[N; f32], weight: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = x[n] * weight[n]
        return y
    }
""",
    "E0205": """\
Two items of a module have the same name.

Linnet has no overloading: each `op`, `fn`, `kernel`, `block`, `model` and `const` of a
module needs its own name.

Wrong:

    pub fn scale(x: f32) -> f32 {
        return x * 2.0
    }

    pub fn scale(x: f32, s: f32) -> f32 {
        return x * s
    }

Fixed:

    pub fn double(x: f32) -> f32 {
        return x * 2.0
    }

    pub fn scale(x: f32, s: f32) -> f32 {
        return x * s
    }
""",
    "E0206": """\
A constant is defined in terms of itself.

Constants are evaluated when they are used; `A = B` with `B = A` (or `A = A + 1`) has no
value. Give one of them a value that does not refer back.

Wrong:

    const A: i32 = B + 1
    const B: i32 = A * 2

Fixed:

    const A: i32 = 3
    const B: i32 = A * 2
""",
    "E0207": """\
A block contains itself.

A block's members are built when the block is: a member of the block's own type (directly,
or through other blocks) would need infinitely many parameters. Repeat a layer with an
array member instead.

Wrong:

    block Layer<D: Dim> {
        param w: Tensor[D; f32]
        block next: Layer<D>
    }

Fixed:

    block Layer<D: Dim> {
        param w: Tensor[D; f32]
    }

    block Stack<D: Dim, L: Dim> {
        block layers: [Layer<D>; L]
    }
""",
    "E0208": """\
A function calls itself, directly or through others.

Every call in Linnet is inlined when a model is lowered, so recursion would never end.
Repeat work with a `for` loop over a block array, or write the steps out.

Wrong:

    pub op twice<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        return twice(x)
    }

Fixed:

    pub op twice<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = 2.0 * x[n]
        return y
    }
""",
    "E0209": """\
A program nests too deeply to compile.

Calls inside calls (each call is inlined when lowering), blocks inside blocks, or
constants defined through constants went more than 64 levels deep (or, as a last line,
deeper than Python's stack allows). Flatten the program: name intermediate values with
`let`, and call fewer functions inside one another.

Wrong:

    >>> chain = [f"const C{i}: i32 = C{i + 1} + 1" for i in range(100)]
    >>> check_text("\\n".join(chain + ["const C100: i32 = 1"]))

Fixed:

    >>> check_text("const C0: i32 = 101")
""",
    # ------------------------------------------------------------ E03xx: index notation
    "E0301": """\
An index variable is used for an axis of a different size.

In index notation each index variable ranges over one dimension: the range written in the
brackets (`let y[r: R] = ...`), or the size of the first axis it indexes. Using it for an
axis of another size usually means two indices are swapped, as in `x[c, r]` for a
`Tensor[R, C]`.

Wrong:

    pub op double<R: Dim, C: Dim>(x: Tensor[R, C; f32]) -> Tensor[R, C; f32] {
        let y[r: R, c: C] = x[c, r] * 2.0
        return y
    }

Fixed:

    pub op double<R: Dim, C: Dim>(x: Tensor[R, C; f32]) -> Tensor[R, C; f32] {
        let y[r: R, c: C] = x[r, c] * 2.0
        return y
    }
""",
    "E0303": """\
A tensor is read or written with the wrong number of indices.

Every read `x[...]` and every state write gives one index per dimension.

Wrong:

    pub op row_sum<R: Dim, C: Dim>(x: Tensor[R, C; f32]) -> Tensor[R; f32] {
        let y[r] = sum[c] x[r]
        return y
    }

Fixed:

    pub op row_sum<R: Dim, C: Dim>(x: Tensor[R, C; f32]) -> Tensor[R; f32] {
        let y[r] = sum[c] x[r, c]
        return y
    }
""",
    "E0304": """\
A tensor inside index notation without indices.

On the right of `let y[...] =`, tensors are read element by element, so each needs its
indices. (A rank-0 tensor or a scalar needs none.)

Wrong:

    pub op add_bias<R: Dim, C: Dim>(x: Tensor[R, C; f32], b: Tensor[C; f32]) -> Tensor[R, C; f32] {
        let y[r, c] = x[r, c] + b
        return y
    }

Fixed:

    pub op add_bias<R: Dim, C: Dim>(x: Tensor[R, C; f32], b: Tensor[C; f32]) -> Tensor[R, C; f32] {
        let y[r, c] = x[r, c] + b[c]
        return y
    }
""",
    "E0305": """\
An index on the right-hand side is neither on the left nor reduced.

Every index variable of the value either names an axis of the result (`let y[r, c]`) or is
reduced (`sum[c] ...`); otherwise it is not clear what happens along it.

Wrong:

    pub op row_total<R: Dim, C: Dim>(x: Tensor[R, C; f32]) -> Tensor[R; f32] {
        let y[r] = x[r, c] * 2.0
        return y
    }

Fixed:

    pub op row_total<R: Dim, C: Dim>(x: Tensor[R, C; f32]) -> Tensor[R; f32] {
        let y[r] = sum[c] x[r, c] * 2.0
        return y
    }
""",
    "E0306": """\
A reduction reuses the name of an index variable.

The variable a reduction sums over is new; reusing one of the result's indices would make
`x[r, r]` ambiguous.

Wrong:

    pub op row_sum<R: Dim, C: Dim>(x: Tensor[R, C; f32]) -> Tensor[R; f32] {
        let y[r] = sum[r] x[r, r]
        return y
    }

Fixed:

    pub op row_sum<R: Dim, C: Dim>(x: Tensor[R, C; f32]) -> Tensor[R; f32] {
        let y[r] = sum[c] x[r, c]
        return y
    }
""",
    "E0307": """\
The range of an index variable cannot be inferred.

An index gets its range from the brackets (`let p[i: N]`, `sum[k: K]`) or from a plain use
as an index of a tensor whose shape is known. An index used only in arithmetic (`i as f32`)
or only on the result of a call has neither.

Wrong:

    pub op positions<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let p[i] = i as f32
        let y[n] = x[n] + p[n]
        return y
    }

Fixed:

    pub op positions<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let p[i: N] = i as f32
        let y[n] = x[n] + p[n]
        return y
    }
""",
    "E0308": """\
An index appears twice on the left of `let`.

Each axis of the result needs its own index variable. (To read a diagonal, use the same
index twice on the right instead.)

Wrong:

    pub op diag<N: Dim>(x: Tensor[N, N; f32]) -> Tensor[N, N; f32] {
        let y[i, i] = x[i, i]
        return y
    }

Fixed:

    pub op diag<N: Dim>(x: Tensor[N, N; f32]) -> Tensor[N; f32] {
        let y[i] = x[i, i]
        return y
    }
""",
    "E0309": """\
An index variable has the name of a variable.

Index variables and local variables share one namespace; an index named like a variable
would hide it.

Wrong:

    pub op scale<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let s = 2.0
        let y[s] = x[s] * s
        return y
    }

Fixed:

    pub op scale<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let s = 2.0
        let y[n] = x[n] * s
        return y
    }
""",
    "E0310": """\
A statement after `return`.

`return` ends a body; what follows never runs.

Wrong:

    pub fn double(x: f32) -> f32 {
        return x * 2.0
        let unused = x
    }

Fixed:

    pub fn double(x: f32) -> f32 {
        return x * 2.0
    }
""",
    "E0311": """\
A tensor is computed and then dropped.

An expression statement whose value is a tensor does nothing (outside kernels, where
`store(...)` is such a statement). Bind the value with `let`, or remove the line.

Wrong:

    use std.nn.activation::{silu}

    pub op act<N: Dim, F: Dim>(x: Tensor[N, F; f32]) -> Tensor[N, F; f32] {
        silu(x)
        return x
    }

Fixed:

    use std.nn.activation::{silu}

    pub op act<N: Dim, F: Dim>(x: Tensor[N, F; f32]) -> Tensor[N, F; f32] {
        let y = silu(x)
        return y
    }
""",
    "E0312": """\
Assignment to a name that is not a variable.

`h = ...` updates a variable declared earlier with `let h = ...`.

Wrong:

    pub fn twice(x: f32) -> f32 {
        h = x * 2.0
        return h
    }

Fixed:

    pub fn twice(x: f32) -> f32 {
        let h = x * 2.0
        return h
    }
""",
    "E0313": """\
An assignment changes a variable's type.

A variable keeps the shape and element type it was declared with, so that code after a
loop sees one type. Use a new name for a converted value.

Wrong:

    pub fn half<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; bf16] {
        let h = x * 0.5
        h = h as bf16
        return h
    }

Fixed:

    pub fn half<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; bf16] {
        let h = x * 0.5
        let out = h as bf16
        return out
    }
""",
    "E0320": """\
A loop's bounds are not known when lowering.

Outside kernels, `for i in a..b` is unrolled when an entry is lowered, so `a` and `b` must be
integers or dims, not values computed at run time.

Wrong:

    pub model Repeat<D: Dim> {
        entry forward(x: Tensor[D; f32], n: i32) -> Tensor[D; f32] {
            let h = x
            for i in 0..n {
                h = h * 2.0
            }
            return h
        }
    }

Fixed:

    pub model Repeat<D: Dim, K: Dim> {
        entry forward(x: Tensor[D; f32]) -> Tensor[D; f32] {
            let h = x
            for i in 0..K {
                h = h * 2.0
            }
            return h
        }
    }
""",
    "E0321": """\
A `for` loop over something that is not a range or repeated blocks.

`for` runs over a range (`for i in 0..N`) or over a member declared as repeated blocks
(`for layer in self.layers`). Tensors are processed whole, with index notation or with
reductions.

Wrong:

    pub fn total<N: Dim>(x: Tensor[N; f32]) -> f32 {
        let h = 0.0
        for v in x {
            h = h + v
        }
        return h
    }

Fixed:

    pub fn total<N: Dim>(x: Tensor[N; f32]) -> f32 {
        let h = sum[n] x[n]
        return h
    }
""",
    "E0330": """\
An index variable used where a compile-time value is needed.

Index variables stand for every position at once, so they can be used in element
expressions but not where one number is needed, such as the range of a reduction. Mask the
terms with `select` instead.

Wrong:

    pub op prefix_sum<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = sum[k: n] x[k]
        return y
    }

Fixed:

    pub op prefix_sum<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n: N] = sum[k: N] select(k <= n, x[k], 0.0)
        return y
    }
""",
    "E0331": """\
Repeated blocks indexed with more than one index.

`self.layers[i]` picks one block of `block layers: [Layer<...>; N]`.

Wrong:

    block Layer<D: Dim> {
        param w: Tensor[D; f32]

        fn forward(x: Tensor[D; f32]) -> Tensor[D; f32] {
            return x
        }
    }

    block Stack<D: Dim> {
        block layers: [Layer<D>; 4]

        fn first(x: Tensor[D; f32]) -> Tensor[D; f32] {
            return self.layers[0, 1](x)
        }
    }

Fixed:

    block Layer<D: Dim> {
        param w: Tensor[D; f32]

        fn forward(x: Tensor[D; f32]) -> Tensor[D; f32] {
            return x
        }
    }

    block Stack<D: Dim> {
        block layers: [Layer<D>; 4]

        fn first(x: Tensor[D; f32]) -> Tensor[D; f32] {
            return self.layers[0](x)
        }
    }
""",
    "E0332": """\
A repeated block's index is out of range.

`block layers: [Layer<...>; N]` has blocks `0` to `N - 1`.

Wrong:

    block Layer<D: Dim> {
        param w: Tensor[D; f32]

        fn forward(x: Tensor[D; f32]) -> Tensor[D; f32] {
            return x
        }
    }

    block Stack<D: Dim> {
        block layers: [Layer<D>; 2]

        fn last(x: Tensor[D; f32]) -> Tensor[D; f32] {
            return self.layers[2](x)
        }
    }

Fixed:

    block Layer<D: Dim> {
        param w: Tensor[D; f32]

        fn forward(x: Tensor[D; f32]) -> Tensor[D; f32] {
            return x
        }
    }

    block Stack<D: Dim> {
        block layers: [Layer<D>; 2]

        fn last(x: Tensor[D; f32]) -> Tensor[D; f32] {
            return self.layers[1](x)
        }
    }
""",
    "E0333": """\
A parenthesised list outside an index.

`(h, d)` is a composite index: inside `x[...]` it reads one axis of size H * D as two.
Linnet has no tuples; a function returns several values with `return a, b`.

Wrong:

    pub fn pair<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let t = (x, x)
        return x
    }

Fixed:

    pub fn pair<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let t = x
        return t
    }
""",
    "E0334": """\
A range outside a `for` loop.

`a..b` and `a..=b` only give the positions a `for` loop runs over. For a tensor of positions
use an index variable: `let p[i: N] = i`.

Wrong:

    pub fn positions<N: Dim>() -> Tensor[N; i32] {
        let p = 0..N
        return p
    }

Fixed:

    pub fn positions<N: Dim>() -> Tensor[N; i32] {
        let p[i: N] = i
        return p
    }
""",
    "E0335": """\
An expression the evaluator does not support.

This is an internal error: the parser produced an expression the checker has no rule for.
Please report it with the source that caused it.

Wrong:

    (no user code is expected to reach this error)

Fixed:

    (report it at the project's issue tracker)
""",
    "E0336": """\
An `if` condition that is not a compile-time bool.

`if` picks one branch for the whole computation, so its condition must be known when the
model is compiled: a `config` bool, a comparison of dims. Choose per element with
`select(cond, a, b)`.

Wrong:

    pub op first_four<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = if n < 4 { x[n] } else { 0.0 }
        return y
    }

Fixed:

    pub op first_four<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = select(n < 4, x[n], 0.0)
        return y
    }
""",
    "E0340": """\
A conditional member is used where it is absent.

A member declared with `if cond` exists only when the condition holds for the config being
lowered. Guard its uses with the same condition.

Wrong:

    pub model Tiny<D: Dim> {
        config tie: bool = true
        param head: Tensor[D, D; f32] if !tie
        param embed: Tensor[D, D; f32]

        entry forward(x: Tensor[D; f32]) -> Tensor[D; f32] {
            let y[o] = sum[i] self.head[o, i] * x[i]
            return y
        }
    }

Fixed:

    pub model Tiny<D: Dim> {
        config tie: bool = true
        param head: Tensor[D, D; f32] if !tie
        param embed: Tensor[D, D; f32]

        entry forward(x: Tensor[D; f32]) -> Tensor[D; f32] {
            let w = if tie { self.embed } else { self.head }
            let y[o] = sum[i] w[o, i] * x[i]
            return y
        }
    }
""",
    "E0341": """\
A block has no member of that name.

`self.name` reads a `param`, `state`, `block` or `config` member, or names a method. The
help suggests close names.

Wrong:

    use std.nn.linear::{Linear}

    block MLP<D: Dim, F: Dim> {
        block up: Linear<D, F, f32>
        block down: Linear<F, D, f32>

        fn forward<N: Dim>(x: Tensor[N, D; f32]) -> Tensor[N, D; f32] {
            return self.down(self.upp(x))
        }
    }

Fixed:

    use std.nn.linear::{Linear}

    block MLP<D: Dim, F: Dim> {
        block up: Linear<D, F, f32>
        block down: Linear<F, D, f32>

        fn forward<N: Dim>(x: Tensor[N, D; f32]) -> Tensor[N, D; f32] {
            return self.down(self.up(x))
        }
    }
""",
    "E0342": """\
A member read on something that is not a block.

Only blocks have members. Tensors have no fields: their shapes are in their types.

Wrong:

    pub op f<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        return x.weight
    }

Fixed:

    pub op f<N: Dim>(x: Tensor[N; f32], weight: Tensor[N; f32]) -> Tensor[N; f32] {
        return weight
    }
""",
    "E0350": """\
Arithmetic on constants fails.

Constants and dims are computed when the model is compiled; dividing by zero, or a
function outside its domain, stops compilation there.

Wrong:

    const HEADS = 8
    const HEAD_DIM = 64 / (HEADS - 8)

Fixed:

    const HEADS = 8
    const HEAD_DIM = 64 / HEADS
""",
    "E0351": """\
Arithmetic on something that is not a number or a tensor.

Operators and element functions take tensors and scalars. A block, a function or an element
type is not a value; call the block, or read one of its parameters.

Wrong:

    use std.nn.linear::{Linear}

    block Head<D: Dim> {
        block proj: Linear<D, D, f32>

        fn forward<N: Dim>(x: Tensor[N, D; f32]) -> Tensor[N, D; f32] {
            return self.proj * 2.0
        }
    }

Fixed:

    use std.nn.linear::{Linear}

    block Head<D: Dim> {
        block proj: Linear<D, D, f32>

        fn forward<N: Dim>(x: Tensor[N, D; f32]) -> Tensor[N, D; f32] {
            return self.proj(x) * 2.0
        }
    }
""",
    "E0352": """\
Two element types that do not mix implicitly.

Concrete types widen (`bf16 + f32` is f32, `bf16 + f16` is f32), but a generic `T` never
mixes with another type: `T` might be narrower or wider. Convert explicitly with `as`.

Wrong:

    pub op scale<N: Dim, T: DType>(x: Tensor[N; T], s: Tensor[N; f32]) -> Tensor[N; T] {
        let y[n] = x[n] * s[n]
        return y
    }

Fixed:

    pub op scale<N: Dim, T: DType>(x: Tensor[N; T], s: Tensor[N; f32]) -> Tensor[N; T] {
        let y[n] = ((x[n] as f32) * s[n]) as T
        return y
    }
""",
    "E0353": """\
A condition or mask that is not bool.

The first argument of `select` and the mask of a kernel's `load`/`store` are bool: compare
something. Numbers are not truthy.

Wrong:

    pub op relu<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = select(x[n], x[n], 0.0)
        return y
    }

Fixed:

    pub op relu<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = select(x[n] > 0.0, x[n], 0.0)
        return y
    }
""",
    "E0354": """\
`&&`, `||` or `!` on values that are not bool.

Logical operators take bools; compare numbers first.

Wrong:

    pub op both<N: Dim>(a: Tensor[N; f32], b: Tensor[N; f32]) -> Tensor[N; bool] {
        let y[n] = a[n] && b[n]
        return y
    }

Fixed:

    pub op both<N: Dim>(a: Tensor[N; f32], b: Tensor[N; f32]) -> Tensor[N; bool] {
        let y[n] = a[n] > 0.0 && b[n] > 0.0
        return y
    }
""",
    "E0355": """\
Arithmetic on bool tensors.

Bools compare (`==`, `!=`) and combine (`&&`, `||`), but do not add or multiply. Convert
them to a number first.

Wrong:

    pub op count_positive<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let pos[n] = x[n] > 0.0
        let y[n] = pos[n] + pos[n]
        return y
    }

Fixed:

    pub op count_positive<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let pos[n] = x[n] > 0.0
        let y[n] = (pos[n] as f32) + (pos[n] as f32)
        return y
    }
""",
    "E0356": """\
A floating-point function applied to integers or bools.

`exp`, `log`, `sqrt`, `rsqrt`, `sin`, `cos`, `tanh`, `sigmoid`, `erf`, `floor` and `pow`
need a float operand. Linnet does not convert silently: write `as f32`.

Wrong:

    pub op softmax_ids<N: Dim>(ids: Tensor[N; i32]) -> Tensor[N; f32] {
        let e[n] = exp(ids[n])
        let y[n] = e[n] / sum[m] e[m]
        return y
    }

Fixed:

    pub op softmax_ids<N: Dim>(ids: Tensor[N; i32]) -> Tensor[N; f32] {
        let e[n] = exp(ids[n] as f32)
        let y[n] = e[n] / sum[m] e[m]
        return y
    }
""",
    "E0357": """\
A constant is not known when lowering.

Lowering needs every constant that becomes a tensor to have a value. This is usually an
internal error; report it with the source and the lowering call.

Wrong:

    (no user code is expected to reach this error)

Fixed:

    (report it at the project's issue tracker)
""",
    "E0358": """\
A fractional number where an integer is needed.

A float literal written into an integer tensor or state would be truncated; Linnet asks for
an integer instead.

Wrong:

    block Counter<B: Dim> {
        state steps: Tensor[B; i32]

        fn reset() -> Tensor[B; i32] {
            self.steps[b] = 0.5
            return self.steps
        }
    }

Fixed:

    block Counter<B: Dim> {
        state steps: Tensor[B; i32]

        fn reset() -> Tensor[B; i32] {
            self.steps[b] = 0
            return self.steps
        }
    }
""",
    "E0360": """\
Whole-tensor arithmetic on tensors of different rank.

Outside index notation, operands of `+`, `*`, ... have the same rank (size-1 axes
broadcast). Index notation says how axes line up.

Wrong:

    pub fn add_bias<N: Dim, D: Dim>(x: Tensor[N, D; f32], b: Tensor[D; f32]) -> Tensor[N, D; f32] {
        return x + b
    }

Fixed:

    pub fn add_bias<N: Dim, D: Dim>(x: Tensor[N, D; f32], b: Tensor[D; f32]) -> Tensor[N, D; f32] {
        let y[n, d] = x[n, d] + b[d]
        return y
    }
""",
    "E0361": """\
Whole-tensor arithmetic on tensors of different shapes.

Outside index notation, operands have equal sizes axis by axis (or size 1). To transpose or
broadcast, use index notation.

Wrong:

    pub fn add<N: Dim, D: Dim>(x: Tensor[N, D; f32], y: Tensor[D, N; f32]) -> Tensor[N, D; f32] {
        return x + y
    }

Fixed:

    pub fn add<N: Dim, D: Dim>(x: Tensor[N, D; f32], y: Tensor[D, N; f32]) -> Tensor[N, D; f32] {
        let z[n, d] = x[n, d] + y[d, n]
        return z
    }
""",
    "E0362": """\
`as` applied to something that is not a number or a tensor.

`x as T` converts tensors and scalars. Blocks and functions have no element type.

Wrong:

    use std.nn.linear::{Linear}

    block Head<D: Dim> {
        block proj: Linear<D, D, f32>

        fn forward<N: Dim>(x: Tensor[N, D; f32]) -> Tensor[N, D; bf16] {
            return self.proj as bf16
        }
    }

Fixed:

    use std.nn.linear::{Linear}

    block Head<D: Dim> {
        block proj: Linear<D, D, f32>

        fn forward<N: Dim>(x: Tensor[N, D; f32]) -> Tensor[N, D; bf16] {
            return self.proj(x) as bf16
        }
    }
""",
    "E0370": """\
A whole-tensor function called inside index notation.

Inside `let y[...] = ...`, only element functions (`exp`, `max`, `select`, ...) apply per
element. Ops and fns take whole tensors: call them in their own statement and index the
result.

Wrong:

    use std.nn.activation::{silu}

    pub op act<N: Dim, F: Dim>(x: Tensor[N, F; f32]) -> Tensor[N, F; f32] {
        let y[n, f] = silu(x[n, f]) * 2.0
        return y
    }

Fixed:

    use std.nn.activation::{silu}

    pub op act<N: Dim, F: Dim>(x: Tensor[N, F; f32]) -> Tensor[N, F; f32] {
        let s = silu(x)
        let y[n, f] = s[n, f] * 2.0
        return y
    }
""",
    "E0371": """\
A built-in function called with the wrong number of arguments.

Element functions take one argument (`exp(x)`), two (`max(a, b)`, `pow(x, p)`) or three
(`select(c, a, b)`); `iota`, `fill`, `program_id`, `load` and `store` have their own forms.

Wrong:

    pub op square<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = exp(x[n], 2.0)
        return y
    }

Fixed:

    pub op square<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = pow(x[n], 2.0)
        return y
    }
""",
    "E0380": """\
Indices on something that is not a tensor.

Only tensors (and repeated blocks) are indexed. Scalars are used as they are.

Wrong:

    pub op scale<N: Dim>(x: Tensor[N; f32], s: f32) -> Tensor[N; f32] {
        let y[n] = x[n] * s[n]
        return y
    }

Fixed:

    pub op scale<N: Dim>(x: Tensor[N; f32], s: f32) -> Tensor[N; f32] {
        let y[n] = x[n] * s
        return y
    }
""",
    "E0381": """\
A composite index whose parts do not multiply to the axis size.

`x[n, (h, d)]` reads an axis of size H * HD as two axes; the ranges of `h` and `d` must
multiply to exactly the axis's size.

Wrong:

    pub op split_heads<N: Dim, H: Dim, HD: Dim>(x: Tensor[N, H * HD; f32]) -> Tensor[N, H, HD; f32] {
        let y[n, h: H, d: H] = x[n, (h, d)]
        return y
    }

Fixed:

    pub op split_heads<N: Dim, H: Dim, HD: Dim>(x: Tensor[N, H * HD; f32]) -> Tensor[N, H, HD; f32] {
        let y[n, h: H, d: HD] = x[n, (h, d)]
        return y
    }
""",
    "E0382": """\
An index that is not an integer.

Positions are integers: index variables, integer tensors (a gather) and integer
arithmetic. Convert float positions with `as i32`.

Wrong:

    pub op pick<N: Dim, V: Dim>(table: Tensor[V; f32], ids: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = table[ids[n]]
        return y
    }

Fixed:

    pub op pick<N: Dim, V: Dim>(table: Tensor[V; f32], ids: Tensor[N; i32]) -> Tensor[N; f32] {
        let y[n] = table[ids[n]]
        return y
    }
""",
    "E0383": """\
An index variable is used in a computed index and again as a plain index after it.

`x[i + j, j]` reads along `j` twice in two ways, which one gather cannot express. Put the
plain index first: transpose in a `let`, then read with the computed index last.

Wrong:

    pub op shifted<N: Dim>(x: Tensor[N, N; f32]) -> Tensor[N, N; f32] {
        let y[i: N, j] = x[i + j, j]
        return y
    }

Fixed:

    pub op shifted<N: Dim>(x: Tensor[N, N; f32]) -> Tensor[N, N; f32] {
        let xt[c, r] = x[r, c]
        let y[i: N, j] = xt[j, i + j]
        return y
    }
""",
    "E0390": """\
`max` or `min` over bool values.

Reductions other than counting work on numbers; convert bools first (true is 1).

Wrong:

    pub op any_positive<N: Dim>(x: Tensor[N; f32]) -> f32 {
        let m[n] = x[n] > 0.0
        let a = max[n] m[n]
        return a
    }

Fixed:

    pub op any_positive<N: Dim>(x: Tensor[N; f32]) -> f32 {
        let m[n] = x[n] > 0.0
        let a = max[n] m[n] as f32
        return a
    }
""",
    # ------------------------------------------------------------ E04xx: types and calls
    "E0401": """\
A dimension that is not a compile-time integer.

Dimensions are integers, `Dim` generics and integer arithmetic on them (`+ - * /`).

Wrong:

    pub op f<N: Dim>(x: Tensor[2.5; f32]) -> Tensor[N; f32] {
        return x
    }

Fixed:

    pub op f<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        return x
    }
""",
    "E0402": """\
A dimension used as an element type.

After the `;` of a tensor type comes an element type (`f32`, `bf16`, `i32`, ...) or a
`DType` generic, not a `Dim`.

Wrong:

    pub op zeros_like<N: Dim, T: DType>(x: Tensor[N; N]) -> Tensor[N; f32] {
        let y[n] = x[n] * 0.0
        return y
    }

Fixed:

    pub op zeros_like<N: Dim, T: DType>(x: Tensor[N; T]) -> Tensor[N; f32] {
        let y[n] = (x[n] as f32) * 0.0
        return y
    }
""",
    "E0403": """\
An unknown element type.

Element types are bf16, f16, f32, f64, i8, i16, i32, i64, u8 and bool, or a `DType`
generic in scope.

Wrong:

    pub op scale<N: Dim>(x: Tensor[N; float32]) -> Tensor[N; f32] {
        let y[n] = x[n] * 2.0
        return y
    }

Fixed:

    pub op scale<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = x[n] * 2.0
        return y
    }
""",
    "E0404": """\
A block type where a tensor or scalar type is expected.

Parameters and results of functions are tensors and scalars; blocks are members, not
values.

Wrong:

    use std.nn.linear::{Linear}

    pub fn make<D: Dim>() -> Linear<D, D, f32> {
        return 1.0
    }

Fixed:

    pub fn make() -> f32 {
        return 1.0
    }
""",
    "E0420": """\
An in-place write to something that is not a state.

Only `state` members change in place (`self.cache[b, t, d] = ...`). Parameters are
read-only; compute a new value with `let` instead.

Wrong:

    block Counter<D: Dim> {
        param weight: Tensor[D; f32]

        fn reset() -> Tensor[D; f32] {
            self.weight[d] = 0.0
            return self.weight
        }
    }

Fixed:

    block Counter<D: Dim> {
        state weight: Tensor[D; f32]

        fn reset() -> Tensor[D; f32] {
            self.weight[d] = 0.0
            return self.weight
        }
    }
""",
    "E0421": """\
A state is written with values of another element type.

States keep their declared type; convert explicitly, so that a narrowing write is visible.

Wrong:

    block Cache<S: Dim, D: Dim> {
        state keys: Tensor[S, D; bf16]

        fn write(k: Tensor[D; f32], pos: i32) -> Tensor[S, D; bf16] {
            self.keys[pos, d] = k[d]
            return self.keys
        }
    }

Fixed:

    block Cache<S: Dim, D: Dim> {
        state keys: Tensor[S, D; bf16]

        fn write(k: Tensor[D; f32], pos: i32) -> Tensor[S, D; bf16] {
            self.keys[pos, d] = k[d] as bf16
            return self.keys
        }
    }
""",
    "E0430": """\
A block without a `forward` method is called like a function.

`self.member(x)` calls the member's `forward`. Call another method by name, or add a
`forward`.

Wrong:

    block Norm<D: Dim> {
        param weight: Tensor[D; f32]

        fn apply(x: Tensor[D; f32]) -> Tensor[D; f32] {
            let y[d] = x[d] * self.weight[d]
            return y
        }
    }

    block Layer<D: Dim> {
        block norm: Norm<D>

        fn forward(x: Tensor[D; f32]) -> Tensor[D; f32] {
            return self.norm(x)
        }
    }

Fixed:

    block Norm<D: Dim> {
        param weight: Tensor[D; f32]

        fn apply(x: Tensor[D; f32]) -> Tensor[D; f32] {
            let y[d] = x[d] * self.weight[d]
            return y
        }
    }

    block Layer<D: Dim> {
        block norm: Norm<D>

        fn forward(x: Tensor[D; f32]) -> Tensor[D; f32] {
            return self.norm.apply(x)
        }
    }
""",
    "E0431": """\
A block type is called like a function.

A block type describes parameters; declare a member of that type and call the member.

Wrong:

    use std.nn.linear::{Linear}

    block Head<D: Dim> {
        fn forward<N: Dim>(x: Tensor[N, D; f32]) -> Tensor[N, D; f32] {
            return Linear(x)
        }
    }

Fixed:

    use std.nn.linear::{Linear}

    block Head<D: Dim> {
        block proj: Linear<D, D, f32>

        fn forward<N: Dim>(x: Tensor[N, D; f32]) -> Tensor[N, D; f32] {
            return self.proj(x)
        }
    }
""",
    "E0432": """\
A call of something that is not a function.

Functions are `op`s, `fn`s, block methods, blocks with a `forward` and built-ins. Tensors
are indexed with `[...]`, not called.

Wrong:

    pub op first<N: Dim>(x: Tensor[N; f32]) -> f32 {
        return x(0)
    }

Fixed:

    pub op first<N: Dim>(x: Tensor[N; f32]) -> f32 {
        return x[0]
    }
""",
    "E0433": """\
An entry is called from Linnet code.

Entries are called by the runtime. Move the code two entries share into a `fn` of the
model and call that.

Wrong:

    pub model M<D: Dim> {
        param w: Tensor[D; f32]

        entry a(x: Tensor[D; f32]) -> Tensor[D; f32] {
            return x
        }

        entry b(x: Tensor[D; f32]) -> Tensor[D; f32] {
            return self.a(x)
        }
    }

Fixed:

    pub model M<D: Dim> {
        param w: Tensor[D; f32]

        fn shared(x: Tensor[D; f32]) -> Tensor[D; f32] {
            return x
        }

        entry a(x: Tensor[D; f32]) -> Tensor[D; f32] {
            return self.shared(x)
        }

        entry b(x: Tensor[D; f32]) -> Tensor[D; f32] {
            return self.shared(x)
        }
    }
""",
    "E0440": """\
A call with the wrong number of arguments.

Every parameter gets an argument, in order; there are no defaults. The help lists the
parameters.

Wrong:

    use std.nn.norm::{rms_norm}

    pub op norm<N: Dim, D: Dim>(x: Tensor[N, D; f32], w: Tensor[D; f32]) -> Tensor[N, D; f32] {
        return rms_norm(x, w)
    }

Fixed:

    use std.nn.norm::{rms_norm}

    pub op norm<N: Dim, D: Dim>(x: Tensor[N, D; f32], w: Tensor[D; f32]) -> Tensor[N, D; f32] {
        return rms_norm(x, w, 1e-5)
    }
""",
    "E0441": """\
A function returns a different number of values than it declares.

A function with results ends in `return` with one value per declared result.

Wrong:

    pub fn double(x: f32) -> f32 {
        let y = x * 2.0
    }

Fixed:

    pub fn double(x: f32) -> f32 {
        let y = x * 2.0
        return y
    }
""",
    "E0442": """\
A function returns a non-tensor where it declares a tensor.

A result declared `Tensor[...]` is a tensor; a number does not broadcast to it
implicitly. Build the tensor with index notation.

Wrong:

    pub fn ones<N: Dim>() -> Tensor[N; f32] {
        return 1.0
    }

Fixed:

    pub fn ones<N: Dim>() -> Tensor[N; f32] {
        let y[n: N] = 1.0
        return y
    }
""",
    "E0443": """\
A function returns a tensor of another shape than it declares.

The returned value's shape must equal the declared result's shape, dim by dim.

Wrong:

    pub op row_sum<R: Dim, C: Dim>(x: Tensor[R, C; f32]) -> Tensor[R; f32] {
        let y[r, c] = x[r, c] * 2.0
        return y
    }

Fixed:

    pub op row_sum<R: Dim, C: Dim>(x: Tensor[R, C; f32]) -> Tensor[R; f32] {
        let y[r] = sum[c] x[r, c] * 2.0
        return y
    }
""",
    "E0444": """\
A function returns another element type than it declares.

Linnet widens implicitly but never narrows: a body computing in f32 that declares a bf16
result converts explicitly before returning.

Wrong:

    pub op norm<N: Dim, D: Dim>(x: Tensor[N, D; bf16]) -> Tensor[N, D; bf16] {
        let ms[n] = mean[d] (x[n, d] as f32) * (x[n, d] as f32)
        let y[n, d] = (x[n, d] as f32) * rsqrt(ms[n] + 1e-5)
        return y
    }

Fixed:

    pub op norm<N: Dim, D: Dim>(x: Tensor[N, D; bf16]) -> Tensor[N, D; bf16] {
        let ms[n] = mean[d] (x[n, d] as f32) * (x[n, d] as f32)
        let y[n, d] = (x[n, d] as f32) * rsqrt(ms[n] + 1e-5)
        return y as bf16
    }
""",
    "E0445": """\
A call passes more generic arguments than the function has.

Explicit generic arguments `f<A, B>(...)` bind the function's generics in order.

Wrong:

    use std.nn.linear::{linear}

    pub op proj<N: Dim, D: Dim>(x: Tensor[N, D; f32], w: Tensor[D, D; f32]) -> Tensor[N, D; f32] {
        return linear<N, D, D, f32, 1>(x, w)
    }

Fixed:

    use std.nn.linear::{linear}

    pub op proj<N: Dim, D: Dim>(x: Tensor[N, D; f32], w: Tensor[D, D; f32]) -> Tensor[N, D; f32] {
        return linear<N, D, D, f32>(x, w)
    }
""",
    "E0446": """\
A non-tensor passed where a tensor parameter is declared.

Numbers do not become tensors implicitly at calls. Pass a tensor, or build one with index
notation.

Wrong:

    use std.nn.linear::{linear}

    pub op proj<N: Dim, D: Dim>(x: Tensor[N, D; f32]) -> Tensor[N, D; f32] {
        return linear(x, 2.0)
    }

Fixed:

    use std.nn.linear::{linear}

    pub op proj<N: Dim, D: Dim>(x: Tensor[N, D; f32], w: Tensor[D, D; f32]) -> Tensor[N, D; f32] {
        return linear(x, w)
    }
""",
    "E0447": """\
An argument has another number of dimensions than the parameter.

A `Tensor[N, I; T]` parameter takes two-dimensional arguments; add or remove an axis with
index notation first.

Wrong:

    use std.nn.linear::{linear}

    pub op project<D: Dim, O: Dim>(x: Tensor[D; f32], w: Tensor[O, D; f32]) -> Tensor[O; f32] {
        return linear(x, w)
    }

Fixed:

    use std.nn.linear::{linear}

    pub op project<D: Dim, O: Dim>(x: Tensor[D; f32], w: Tensor[O, D; f32]) -> Tensor[O; f32] {
        let y[o] = sum[d] x[d] * w[o, d]
        return y
    }
""",
    "E0448": """\
A tensor passed where a scalar parameter is declared.

A parameter typed `f32` (or `i32`, `bool`) takes a number, or a rank-0 tensor.

Wrong:

    use std.nn.norm::{rms_norm}

    pub op norm<N: Dim, D: Dim>(x: Tensor[N, D; f32], w: Tensor[D; f32]) -> Tensor[N, D; f32] {
        return rms_norm(x, w, w)
    }

Fixed:

    use std.nn.norm::{rms_norm}

    pub op norm<N: Dim, D: Dim>(x: Tensor[N, D; f32], w: Tensor[D; f32]) -> Tensor[N, D; f32] {
        return rms_norm(x, w, 1e-5)
    }
""",
    "E0449": """\
An argument's axis has another size than the parameter's type requires.

Generics bind from the arguments in order; a later axis that disagrees with the size
already bound is an error. Often the argument is transposed: `linear` takes its weight
as `[out, in]`.

Wrong:

    use std.nn.linear::{linear}

    pub op project<N: Dim, D: Dim, O: Dim>(x: Tensor[N, D; f32], w: Tensor[D, O; f32]) -> Tensor[N, O; f32] {
        return linear(x, w)
    }

Fixed:

    use std.nn.linear::{linear}

    pub op project<N: Dim, D: Dim, O: Dim>(x: Tensor[N, D; f32], w: Tensor[O, D; f32]) -> Tensor[N, O; f32] {
        return linear(x, w)
    }
""",
    "E0450": """\
The generics in a parameter's dim expression cannot be inferred.

From `x: Tensor[A * B; f32]` and an argument of size 32, `A` and `B` are not determined.
Name a generic on its own in some parameter's type, or pass the generics explicitly.

Wrong:

    fn unflatten<A: Dim, B: Dim>(x: Tensor[A * B; f32]) -> Tensor[A, B; f32] {
        let y[a: A, b: B] = x[(a, b)]
        return y
    }

    pub op rows_of_8<N: Dim>(x: Tensor[N * 8; f32]) -> Tensor[N, 8; f32] {
        return unflatten(x)
    }

Fixed:

    fn unflatten<A: Dim, B: Dim>(x: Tensor[A * B; f32]) -> Tensor[A, B; f32] {
        let y[a: A, b: B] = x[(a, b)]
        return y
    }

    pub op rows_of_8<N: Dim>(x: Tensor[N * 8; f32]) -> Tensor[N, 8; f32] {
        return unflatten<N, 8>(x)
    }
""",
    "E0451": """\
A generic of the called function cannot be inferred.

Generics are inferred from the arguments' shapes and types. A generic that no parameter
mentions (say, only the result) needs an explicit argument.

Wrong:

    fn zeros<N: Dim>() -> Tensor[N; f32] {
        let z[i: N] = 0.0
        return z
    }

    pub op pad<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let z = zeros()
        let y[n] = x[n] + z[n]
        return y
    }

Fixed:

    fn zeros<N: Dim>() -> Tensor[N; f32] {
        let z[i: N] = 0.0
        return z
    }

    pub op pad<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let z = zeros<N>()
        let y[n] = x[n] + z[n]
        return y
    }
""",
    "E0452": """\
An argument has another element type than the parameter requires.

A `DType` generic binds from the first argument that uses it; the others must agree.
Linnet does not convert at calls: write `as`.

Wrong:

    use std.nn.linear::{linear}

    pub op project<N: Dim, D: Dim, O: Dim>(x: Tensor[N, D; f32], w: Tensor[O, D; bf16]) -> Tensor[N, O; f32] {
        return linear(x, w)
    }

Fixed:

    use std.nn.linear::{linear}

    pub op project<N: Dim, D: Dim, O: Dim>(x: Tensor[N, D; f32], w: Tensor[O, D; bf16]) -> Tensor[N, O; f32] {
        let w32 = w as f32
        return linear(x, w32)
    }
""",
    "E0453": """\
A dimension passed for a `DType` generic.

Generic arguments are matched in order; an element-type generic takes `f32`, `bf16`, ...
or another `DType` generic.

Wrong:

    use std.nn.linear::{Linear}

    block Head<D: Dim> {
        block proj: Linear<D, D, 4>
    }

Fixed:

    use std.nn.linear::{Linear}

    block Head<D: Dim> {
        block proj: Linear<D, D, f32>
    }
""",
    "E0460": """\
A `where` clause does not hold for the sizes at hand.

`where` clauses state what a function, kernel or model needs of its generics
(`where H == KV * G`). They are checked when an entry is lowered with concrete sizes.

Wrong:

    $ linnet graph llama.linnet --entry decode --config toy --set H=3 --input token=1 --input pos=1

Fixed:

    $ linnet graph llama.linnet --entry decode --config toy --set H=4 --input token=1 --input pos=1
""",
    # ------------------------------------------------------------ E05xx: kernels and grads
    "E0501": """\
A kernel built-in outside a kernel.

`program_id`, `load` and `store` exist only in `kernel` bodies, which run once per program
on tiles. Ops work on whole tensors: index variables take the place of program ids.

Wrong:

    pub op double_rows<R: Dim, C: Dim>(x: Tensor[R, C; f32]) -> Tensor[R, C; f32] {
        let row = program_id(0)
        let y[r, c] = x[r, c] * 2.0
        return y
    }

Fixed:

    pub op double_rows<R: Dim, C: Dim>(x: Tensor[R, C; f32]) -> Tensor[R, C; f32] {
        let y[r, c] = x[r, c] * 2.0
        return y
    }
""",
    "E0502": """\
A kernel is called directly.

Kernels run in place of an op's body: bind the kernel in the op's header
(`-> T kernel name<...>`) and call the op. Backends without kernels run the body.

Wrong:

    use std.nn.activation::{row_softmax}

    pub op probs<R: Dim, C: Dim>(x: Tensor[R, C; f32]) -> Tensor[R, C; f32] {
        return row_softmax(x)
    }

Fixed:

    use std.nn.activation::{softmax}

    pub op probs<R: Dim, C: Dim>(x: Tensor[R, C; f32]) -> Tensor[R, C; f32] {
        return softmax(x)
    }
""",
    "E0503": """\
A kernel's tensor parameter is used outside `load`/`store`.

In a kernel, tensor parameters live in memory; a tile of one is read with `load(x[...])`,
with a mask where the tile runs past the tensor.

Wrong:

    kernel scale_rows<R: Dim, C: Dim, B: Dim>(x: Tensor[R, C; f32]) -> y: Tensor[R, C; f32] grid(R)
    where B >= C {
        let row = program_id(0)
        let cols = iota<i32>(B)
        let v = x[row, cols] * 2.0
        store(y[row, cols], v, cols < C)
    }

Fixed:

    kernel scale_rows<R: Dim, C: Dim, B: Dim>(x: Tensor[R, C; f32]) -> y: Tensor[R, C; f32] grid(R)
    where B >= C {
        let row = program_id(0)
        let cols = iota<i32>(B)
        let v = load(x[row, cols], cols < C) * 2.0
        store(y[row, cols], v, cols < C)
    }
""",
    "E0504": """\
`program_id` with an axis the grid does not have.

`grid(a, b)` has axes 0 and 1; `program_id(axis)` takes an integer below the grid's number
of axes.

Wrong:

    kernel copy<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N) {
        let i = program_id(1)
        store(y[i], load(x[i]))
    }

Fixed:

    kernel copy<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N) {
        let i = program_id(0)
        store(y[i], load(x[i]))
    }
""",
    "E0505": """\
A tile size that is not a power of two.

Triton and Pallas tiles have power-of-two sizes. Round the size up and mask the extra
lanes; the error appears where the op binds the kernel's generics.

Wrong:

    kernel row_scale<R: Dim, C: Dim, B: Dim>(x: Tensor[R, C; f32]) -> y: Tensor[R, C; f32] grid(R)
    where B >= C {
        let row = program_id(0)
        let cols = iota<i32>(B)
        store(y[row, cols], load(x[row, cols], cols < C) * 2.0, cols < C)
    }

    pub op scale<R: Dim, C: Dim>(x: Tensor[R, C; f32]) -> Tensor[R, C; f32] kernel row_scale<R, C, 1000> {
        let y[r, c] = x[r, c] * 2.0
        return y
    }

Fixed:

    kernel row_scale<R: Dim, C: Dim, B: Dim>(x: Tensor[R, C; f32]) -> y: Tensor[R, C; f32] grid(R)
    where B >= C {
        let row = program_id(0)
        let cols = iota<i32>(B)
        store(y[row, cols], load(x[row, cols], cols < C) * 2.0, cols < C)
    }

    pub op scale<R: Dim, C: Dim>(x: Tensor[R, C; f32]) -> Tensor[R, C; f32] kernel row_scale<R, C, 1024> {
        let y[r, c] = x[r, c] * 2.0
        return y
    }
""",
    "E0506": """\
`load` or `store` without an indexed tensor.

Their first argument names the tensor and the positions: `load(x[row, cols])`.

Wrong:

    kernel copy<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N) {
        let i = program_id(0)
        store(y[i], load(x))
    }

Fixed:

    kernel copy<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N) {
        let i = program_id(0)
        store(y[i], load(x[i]))
    }
""",
    "E0507": """\
`load` from something that is not a tensor parameter, or `store` into something that is
not a named result.

Kernels read their tensor parameters with `load` and write their named results
(`-> y: Tensor[...]`) with `store`. Parameters are read-only; tiles are already in
registers.

Wrong:

    kernel double<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N) {
        let i = program_id(0)
        store(x[i], load(x[i]) * 2.0)
    }

Fixed:

    kernel double<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N) {
        let i = program_id(0)
        store(y[i], load(x[i]) * 2.0)
    }
""",
    "E0508": """\
A kernel stores values of another element type than its result.

`store` does not narrow implicitly; convert with `as`.

Wrong:

    kernel to_half<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; bf16] grid(N) {
        let i = program_id(0)
        store(y[i], load(x[i]))
    }

Fixed:

    kernel to_half<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; bf16] grid(N) {
        let i = program_id(0)
        store(y[i], load(x[i]) as bf16)
    }
""",
    "E0509": """\
A kernel stores a tile of another shape than the positions it writes.

The positions' index tiles give the shape written (`y[rows, cols]` with `rows: [BM]` and
`cols: [BN]` is `[BM, BN]`); the value is a tile of that shape or a scalar.

Wrong:

    kernel clear<N: Dim, B: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N / B) {
        let i = program_id(0) * B + iota<i32>(B)
        store(y[i], fill(0.0, B, B), i < N)
    }

Fixed:

    kernel clear<N: Dim, B: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N / B) {
        let i = program_id(0) * B + iota<i32>(B)
        store(y[i], fill(0.0, B), i < N)
    }
""",
    "E0510": """\
A kernel without a grid.

A kernel says how many programs run: `grid(...)` with one to three compile-time sizes,
after its results.

Wrong:

    kernel copy<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] {
        let i = program_id(0)
        store(y[i], load(x[i]))
    }

Fixed:

    kernel copy<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N) {
        let i = program_id(0)
        store(y[i], load(x[i]))
    }
""",
    "E0511": """\
A kernel result without a name.

Kernels write their results with `store(name[...], ...)`, so each result is named.

Wrong:

    kernel copy<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] grid(N) {
        let i = program_id(0)
        store(y[i], load(x[i]))
    }

Fixed:

    kernel copy<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N) {
        let i = program_id(0)
        store(y[i], load(x[i]))
    }
""",
    "E0512": """\
A kernel uses `return`.

Kernels write their named results with `store`; they return nothing.

Wrong:

    kernel double<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N) {
        let i = program_id(0)
        return load(x[i]) * 2.0
    }

Fixed:

    kernel double<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N) {
        let i = program_id(0)
        store(y[i], load(x[i]) * 2.0)
    }
""",
    "E0513": """\
An op binds something that is not a kernel.

`-> T kernel name<...>` names a `kernel` declared in the module or imported.

Wrong:

    fn double_body<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        return x * 2.0
    }

    pub op double<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] kernel double_body<N> {
        return x * 2.0
    }

Fixed:

    kernel double_k<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N) {
        let i = program_id(0)
        store(y[i], load(x[i]) * 2.0)
    }

    pub op double<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] kernel double_k<N> {
        return x * 2.0
    }
""",
    "E0514": """\
A `fn` binds a kernel.

Only `op`s are bound to kernels: their bodies are the definition backends fall back to.

Wrong:

    kernel double_k<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N) {
        let i = program_id(0)
        store(y[i], load(x[i]) * 2.0)
    }

    pub fn double<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] kernel double_k<N> {
        return x * 2.0
    }

Fixed:

    kernel double_k<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N) {
        let i = program_id(0)
        store(y[i], load(x[i]) * 2.0)
    }

    pub op double<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] kernel double_k<N> {
        return x * 2.0
    }
""",
    "E0515": """\
An op's kernel binding gives the wrong number of generic arguments.

`kernel name<...>` binds every generic of the kernel, in order.

Wrong:

    kernel copy_k<N: Dim, B: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N) {
        let i = program_id(0)
        store(y[i], load(x[i]))
    }

    pub op copy<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] kernel copy_k<N> {
        return x
    }

Fixed:

    kernel copy_k<N: Dim, B: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N) {
        let i = program_id(0)
        store(y[i], load(x[i]))
    }

    pub op copy<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] kernel copy_k<N, 1024> {
        return x
    }
""",
    "E0516": """\
A kernel takes another number of parameters than the op it is bound to.

The kernel runs in place of the op, so it takes the op's parameters, in order.

Wrong:

    kernel scale_k<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N) {
        let i = program_id(0)
        store(y[i], load(x[i]) * 2.0)
    }

    pub op scale<N: Dim>(x: Tensor[N; f32], s: f32) -> Tensor[N; f32] kernel scale_k<N> {
        let y[n] = x[n] * s
        return y
    }

Fixed:

    kernel scale_k<N: Dim>(x: Tensor[N; f32], s: f32) -> y: Tensor[N; f32] grid(N) {
        let i = program_id(0)
        store(y[i], load(x[i]) * s)
    }

    pub op scale<N: Dim>(x: Tensor[N; f32], s: f32) -> Tensor[N; f32] kernel scale_k<N> {
        let y[n] = x[n] * s
        return y
    }
""",
    "E0517": """\
A kernel parameter's type differs from the op's parameter.

With the binding's generic arguments substituted, each kernel parameter has the type of
the op's parameter at the same position.

Wrong:

    kernel copy_k<N: Dim>(x: Tensor[N; bf16]) -> y: Tensor[N; bf16] grid(N) {
        let i = program_id(0)
        store(y[i], load(x[i]))
    }

    pub op copy<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] kernel copy_k<N> {
        return x
    }

Fixed:

    kernel copy_k<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N) {
        let i = program_id(0)
        store(y[i], load(x[i]))
    }

    pub op copy<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] kernel copy_k<N> {
        return x
    }
""",
    "E0518": """\
A kernel writes another number of results than its op returns.

The kernel's named results are the op's results, in order.

Wrong:

    kernel split_k<N: Dim>(x: Tensor[N; f32]) -> (y: Tensor[N; f32], z: Tensor[N; f32]) grid(N) {
        let i = program_id(0)
        store(y[i], load(x[i]))
        store(z[i], load(x[i]))
    }

    pub op copy<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] kernel split_k<N> {
        return x
    }

Fixed:

    kernel copy_k<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; f32] grid(N) {
        let i = program_id(0)
        store(y[i], load(x[i]))
    }

    pub op copy<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] kernel copy_k<N> {
        return x
    }
""",
    "E0519": """\
A kernel result's type differs from the op's result.

With the binding's generic arguments substituted, each kernel result has the type of the
op's result at the same position.

Wrong:

    kernel half_k<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; bf16] grid(N) {
        let i = program_id(0)
        store(y[i], load(x[i]) as bf16)
    }

    pub op half<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] kernel half_k<N> {
        return x
    }

Fixed:

    kernel half_k<N: Dim>(x: Tensor[N; f32]) -> y: Tensor[N; bf16] grid(N) {
        let i = program_id(0)
        store(y[i], load(x[i]) as bf16)
    }

    pub op half<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; bf16] kernel half_k<N> {
        return x as bf16
    }
""",
    "E0520": """\
A `grad` clause names another number of incoming gradients than the op has results.

`grad(dy) { ... }` names one incoming gradient per result of the op.

Wrong:

    pub op square<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = x[n] * x[n]
        return y
    } grad(dy, dx) {
        let g[n] = 2.0 * x[n] * dy[n]
        return g
    }

Fixed:

    pub op square<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = x[n] * x[n]
        return y
    } grad(dy) {
        let g[n] = 2.0 * x[n] * dy[n]
        return g
    }
""",
    "E0521": """\
A `grad` clause returns another number of gradients than the op has tensor parameters.

The clause returns one gradient per tensor parameter, in parameter order.

Wrong:

    pub op mul<N: Dim>(x: Tensor[N; f32], w: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = x[n] * w[n]
        return y
    } grad(dy) {
        let dx[n] = dy[n] * w[n]
        return dx
    }

Fixed:

    pub op mul<N: Dim>(x: Tensor[N; f32], w: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = x[n] * w[n]
        return y
    } grad(dy) {
        let dx[n] = dy[n] * w[n]
        let dw[n] = dy[n] * x[n]
        return dx, dw
    }
""",
    "E0522": """\
A gradient has another shape than its parameter.

The gradient of each tensor parameter has that parameter's shape.

Wrong:

    pub op double<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = x[n] * 2.0
        return y
    } grad(dy) {
        let s = sum[n] dy[n]
        return s
    }

Fixed:

    pub op double<N: Dim>(x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = x[n] * 2.0
        return y
    } grad(dy) {
        let dx[n] = dy[n] * 2.0
        return dx
    }
""",
    # ------------------------------------------------------------ E06xx: blocks and models
    "E0600": """\
The model to lower is not clear.

Lowering picks the file's one `model`. A file with several needs one named, and a file
with none cannot be lowered (check it with `linnet check` instead).

Wrong:

    $ linnet graph models.linnet --entry forward --input x=4

Fixed:

    $ linnet graph models.linnet --model Small --entry forward --input x=4
""",
    "E0601": """\
The model has no entry of that name.

`--entry` (or `lower(program, entry, ...)`) names one of the model's `entry` methods; the
help lists them.

Wrong:

    $ linnet graph llama.linnet --entry decoder --config toy --input token=1 --input pos=1

Fixed:

    $ linnet graph llama.linnet --entry decode --config toy --input token=1 --input pos=1
""",
    "E0602": """\
A config key that is neither a generic nor a `config` of the model.

Config files and `--set` give values to the model's generics (`D`, `T`, ...) and `config`
members. A misspelt or foreign key is an error rather than silently ignored; keys starting
with `_` are comments.

Wrong:

    $ linnet graph model.linnet --entry forward --set D=64 --set dim=64 --input x=2,64

Fixed:

    $ linnet graph model.linnet --entry forward --set D=64 --input x=2,64
""",
    "E0603": """\
A model generic is not determined by the config, the inputs or the weights.

Generics bind from the config, from entry input shapes, from weight shapes (with
`--weights`) and from `where` clauses. Whatever is left must be given.

Wrong:

    $ linnet graph head.linnet --entry forward --input x=2,64

Fixed:

    $ linnet graph head.linnet --entry forward --set V=1000 --input x=2,64
""",
    "E0604": """\
An input is given for a parameter the entry does not have.

`--input NAME=...` (or the `inputs` dict of `lower`) names the entry's parameters; the help
lists them.

Wrong:

    $ linnet graph model.linnet --entry forward --set D=4 --input y=2,4

Fixed:

    $ linnet graph model.linnet --entry forward --set D=4 --input x=2,4
""",
    "E0605": """\
An entry input's shape is not given.

Lowering is for concrete shapes: every entry parameter gets one, with `--input NAME=D0,D1`
or in the `inputs` dict of `lower`.

Wrong:

    >>> lower(program, "forward", {}, {"D": 4})

Fixed:

    >>> lower(program, "forward", {"x": [2, 4]}, {"D": 4})
""",
    "E0606": """\
An input has another number of dimensions than the entry declares.

Give one size per dimension of the parameter's type.

Wrong:

    $ linnet graph model.linnet --entry forward --set D=4 --input x=8

Fixed:

    $ linnet graph model.linnet --entry forward --set D=4 --input x=2,4
""",
    "E0607": """\
An input's size disagrees with a dim already bound.

The entry's type fixes the input's shape; a dim given in the config (or bound by another
input or by weights) must match the size passed.

Wrong:

    $ linnet graph model.linnet --entry forward --set D=4 --input x=2,5

Fixed:

    $ linnet graph model.linnet --entry forward --set D=4 --input x=2,4
""",
    "E0608": """\
An input's shape is not a list of positive sizes.

Each entry input takes one whole, positive size per dimension (`--input tokens=1,8`, or
`{"tokens": [1, 8]}` in Python). Negative, zero, fractional and non-number sizes are
refused when the entry is lowered, whatever passed them.

Wrong:

    $ linnet graph model.linnet --entry forward --set D=4 --input x=2,-1

Fixed:

    $ linnet graph model.linnet --entry forward --set D=4 --input x=2,4
""",
    "E0609": """\
A size is larger than a tensor dimension can be.

Sizes are int64 in every runtime: an input size, a config dim or a weight's size over
2^63 - 1 cannot be allocated or even indexed.

Wrong:

    $ linnet graph model.linnet --entry forward --set D=99999999999999999999 --input x=2,4

Fixed:

    $ linnet graph model.linnet --entry forward --set D=4 --input x=2,4
""",
    "E0610": """\
A member's `if` condition is not a compile-time bool.

`param w: ... if cond` keeps the member only when `cond` holds for the config; the
condition is a bool `config` or a comparison of dims.

Wrong:

    block Scale<D: Dim> {
        config scale: f32 = 1.0
        param w: Tensor[D; f32] if scale
    }

Fixed:

    block Scale<D: Dim> {
        config use_weight: bool = true
        param w: Tensor[D; f32] if use_weight
    }
""",
    "E0611": """\
A `param` or `state` whose type is not a tensor.

Parameters and states are tensors; sub-blocks are declared with `block`.

Wrong:

    use std.nn.linear::{Linear}

    block Head<D: Dim, V: Dim> {
        param proj: Linear<D, V, f32>
    }

Fixed:

    use std.nn.linear::{Linear}

    block Head<D: Dim, V: Dim> {
        block proj: Linear<D, V, f32>
    }
""",
    "E0612": """\
A `config` member without a default gets no value.

A config declared without `= default` must be given when lowering, in the config file or
with `--set`.

Wrong:

    $ linnet graph model.linnet --entry forward --set D=4 --input x=2,4

Fixed:

    $ linnet graph model.linnet --entry forward --set D=4 --set eps=1e-5 --input x=2,4
""",
    "E0613": """\
A config value of the wrong type.

Bool configs take `true`/`false`, float configs numbers, integer configs and `Dim`
generics positive integers, `DType` generics an element type name.

Wrong:

    $ linnet graph model.linnet --entry forward --set D=4 --set use_bias=1 --input x=2,4

Fixed:

    $ linnet graph model.linnet --entry forward --set D=4 --set use_bias=true --input x=2,4
""",
    "E0614": """\
A `block` member whose type is not a block.

`block name: Type<...>` declares a sub-block; tensors are declared with `param` or `state`.

Wrong:

    block Scale<D: Dim> {
        block weight: Tensor[D; f32]
    }

Fixed:

    block Scale<D: Dim> {
        param weight: Tensor[D; f32]
    }
""",
    "E0615": """\
A `block` member names a type that is not a block.

The type is not declared, not imported, or is a function rather than a block.

Wrong:

    block Head<D: Dim> {
        block act: Gelu
    }

Fixed:

    use std.nn.linear::{Linear}

    block Head<D: Dim> {
        block proj: Linear<D, D, f32>
    }
""",
    "E0616": """\
A block type with too many generic arguments.

`Name<...>` gives the block's generics in order; the declaration shows how many it has.

Wrong:

    use std.nn.linear::{Linear}

    block Head<D: Dim> {
        block proj: Linear<D, D, f32, 2>
    }

Fixed:

    use std.nn.linear::{Linear}

    block Head<D: Dim> {
        block proj: Linear<D, D, f32>
    }
""",
    "E0617": """\
A block type without a generic argument that has no default.

Every generic of the block without a `= default` is given.

Wrong:

    use std.nn.linear::{Linear}

    block Head<D: Dim, V: Dim> {
        block proj: Linear<D, V>
    }

Fixed:

    use std.nn.linear::{Linear}

    block Head<D: Dim, V: Dim> {
        block proj: Linear<D, V, f32>
    }
""",
    "E0618": """\
A tensor would hold 2^63 elements or more.

Each size fits, but their product does not: no runtime can allocate or index a tensor of
more than 2^63 - 1 elements. The message names the input, parameter, state or value.

Wrong:

    $ linnet graph model.linnet --entry forward --set D=4294967296 --input x=4294967296,4294967296

Fixed:

    $ linnet graph model.linnet --entry forward --set D=4 --input x=2,4
""",
    "E0619": """\
A tensor's size came out negative.

A dimension written as an expression (`D - K`, say) is negative for the sizes given.

Wrong:

    $ linnet graph model.linnet --entry forward --set D=2 --set K=3 --input x=2

Fixed:

    $ linnet graph model.linnet --entry forward --set D=4 --set K=3 --input x=4
""",
    "E0620": """\
Two parameters of a function have the same name.

Wrong:

    pub op add<N: Dim>(x: Tensor[N; f32], x: Tensor[N; f32]) -> Tensor[N; f32] {
        let y[n] = x[n] + x[n]
        return y
    }

Fixed:

    pub op add<N: Dim>(x: Tensor[N; f32], y: Tensor[N; f32]) -> Tensor[N; f32] {
        let z[n] = x[n] + y[n]
        return z
    }
""",
    "E0621": """\
A function parameter of block type.

Functions take tensors and scalars. Make the function a method of the block (and use
`self`), or pass the block's tensors.

Wrong:

    use std.nn.linear::{Linear}

    pub fn apply<D: Dim>(layer: Linear<D, D, f32>, x: Tensor[D; f32]) -> Tensor[D; f32] {
        return x
    }

Fixed:

    pub fn apply<D: Dim>(weight: Tensor[D, D; f32], x: Tensor[D; f32]) -> Tensor[D; f32] {
        let y[o] = sum[i] weight[o, i] * x[i]
        return y
    }
""",
    "E0622": """\
Two members of a block have the same name.

Member names are parameter paths (`proj.weight`), so each is unique in its block.

Wrong:

    block Norm<D: Dim> {
        param weight: Tensor[D; f32]
        param bias: Tensor[D; f32]
        param weight: Tensor[D; f32]
    }

Fixed:

    block Norm<D: Dim> {
        param weight: Tensor[D; f32]
        param bias: Tensor[D; f32]
    }
""",
    "E0623": """\
A model without entries.

A model's `entry` methods are what runtimes call and `linnet graph --entry` lowers. A
collection of layers without entries is a `block`.

Wrong:

    pub model Tiny<D: Dim> {
        param w: Tensor[D; f32]

        fn forward(x: Tensor[D; f32]) -> Tensor[D; f32] {
            let y[d] = x[d] * self.w[d]
            return y
        }
    }

Fixed:

    pub model Tiny<D: Dim> {
        param w: Tensor[D; f32]

        entry forward(x: Tensor[D; f32]) -> Tensor[D; f32] {
            let y[d] = x[d] * self.w[d]
            return y
        }
    }
""",
    "E0624": """\
The weights number a repeated block's layers with a gap.

A count like `NL` in `block layers: [Layer<...>; NL]` is read from the weights' names
(`model.layers.0.*` ... `model.layers.15.*`). A tensor past a gap (`model.layers.99999999.x`
beside layers 0 and 1) is a stray: it would make the model unroll millions of layers.

Wrong:

    >>> lower(program, "decode", inputs, config, weights=checkpoint | {
    ...     "model.layers.99999999.x": ((4,), "f32")})

Fixed:

    >>> lower(program, "decode", inputs, config, weights=checkpoint)
""",
    "E0625": """\
A repeated block's count is too large.

Lowering unrolls a block array one block at a time; more than 4096 blocks (no published
model has close to that many layers) would run for hours. The count comes from the config
or from the weights' names.

Wrong:

    $ linnet graph llama.linnet --entry decode --config toy.json --set NL=100000000

Fixed:

    $ linnet graph llama.linnet --entry decode --config toy.json --set NL=2
""",
    "E0630": """\
A parameter of the model has no weight.

With weights given (`--weights file.safetensors`, or `weights=` to `lower`), every
parameter path needs a tensor. The weights may belong to another model, or name their
tensors differently.

Wrong:

    >>> lower(program, "forward", {"x": [2, 4]}, {"D": 4}, weights={})

Fixed:

    >>> lower(program, "forward", {"x": [2, 4]}, {"D": 4},
    ...       weights={"proj.weight": ((4, 4), "f32")})
""",
    "E0631": """\
A weight that is no parameter of the model.

Every tensor of the weights must be a parameter path of the model, so that a checkpoint
for another architecture or config is not half loaded.

Wrong:

    >>> lower(program, "forward", {"x": [2, 4]}, {"D": 4},
    ...       weights={"proj.weight": ((4, 4), "f32"), "proj.bias": ((4,), "f32")})

Fixed:

    >>> lower(program, "forward", {"x": [2, 4]}, {"D": 4},
    ...       weights={"proj.weight": ((4, 4), "f32")})
""",
    "E0632": """\
A weight's shape differs from its parameter's shape under this config.

The parameter's type, with the model's generics bound, fixes the shape. Usually the
weights were made for another config (another hidden size, head count, vocabulary).

Wrong:

    >>> lower(program, "forward", {"x": [2, 4]}, {"D": 4},
    ...       weights={"proj.weight": ((4, 8), "f32")})

Fixed:

    >>> lower(program, "forward", {"x": [2, 8]}, {"D": 8},
    ...       weights={"proj.weight": ((8, 8), "f32")})
""",
    "E0633": """\
A weight's element type differs from its parameter's.

Parameters declare their element type, often through a `DType` generic such as `T`; set it
to the checkpoint's type, or convert the checkpoint.

Wrong:

    $ linnet graph llama.linnet --entry decode --config toy --set T=f32 --weights bf16.safetensors --input token=1 --input pos=1

Fixed:

    $ linnet graph llama.linnet --entry decode --config toy --set T=bf16 --weights bf16.safetensors --input token=1 --input pos=1
""",
    "E0634": """\
A checkpoint's `model.safetensors.index.json` is not a safetensors index.

An index is a JSON object whose `weight_map` maps each tensor name to a shard file beside
it. It is not JSON, nests too deeply, has no `weight_map`, or names a shard by a path
rather than a file name (`../other/model.safetensors`).

Wrong:

    $ linnet run llama.linnet --weights broken-download/

Fixed:

    $ linnet run llama.linnet --weights Llama-3.2-1B/
""",
    "E0635": """\
A shard that a checkpoint's index names is missing.

`model.safetensors.index.json` lists the files its tensors are in; one of them is not in
the directory (an interrupted download, or a shard left out of a copy). Every missing shard
is listed, with the tensors the index puts in it.

Wrong:

    $ linnet run llama.linnet --weights partial-download/

Fixed:

    $ linnet run llama.linnet --weights complete-download/
""",
    "E0636": """\
A shard holds a tensor that its checkpoint's index does not list, or lists in another shard.

The index and the shards come from different saves. Loading would either miss the tensor
or read it from the wrong file, so it is an error.

Wrong:

    $ linnet run llama.linnet --weights mixed-checkpoint/

Fixed:

    $ linnet run llama.linnet --weights Llama-3.2-1B/
""",
    "E0637": """\
A checkpoint's index lists a tensor that its shard does not hold.

Wrong:

    $ linnet run llama.linnet --weights mixed-checkpoint/

Fixed:

    $ linnet run llama.linnet --weights Llama-3.2-1B/
""",
    "E0638": """\
The same tensor is in two of a checkpoint's files.

A checkpoint holds each tensor once; with two copies it is not clear which to use. Often a
file was given twice, or an old shard was left beside new ones.

Wrong:

    >>> load("llama.linnet", weights=["a.safetensors", "b.safetensors", "a.safetensors"])

Fixed:

    >>> load("llama.linnet", weights=["a.safetensors", "b.safetensors"])
""",
    "E0639": """\
The weights are not a checkpoint: a directory without safetensors files, or another value.

`weights=` (and `--weights`) takes a safetensors file, a checkpoint directory (its
`model.safetensors.index.json`, else every `*.safetensors` in it), an index file, or a
non-empty list of files.

Wrong:

    $ linnet graph llama.linnet --entry decode --weights empty-dir/ --input token=1 --input pos=1

Fixed:

    $ linnet graph llama.linnet --entry decode --weights Llama-3.2-1B/ --input token=1 --input pos=1
""",
    "E0640": """\
A config file cannot be found.

`--config` takes a JSON file, or the name of one in the model's `configs/` folder
(`--config toy` reads `configs/toy.json`).

Wrong:

    $ linnet graph llama.linnet --entry decode --config tiny --input token=1 --input pos=1

Fixed:

    $ linnet graph llama.linnet --entry decode --config toy --input token=1 --input pos=1
""",
    "E0641": """\
A config file is not one JSON object.

A config is a JSON object of names to values: `{"D": 64, "T": "f32"}`. Keys starting with
`_` are comments.

Wrong:

    $ echo '[64, 4]' > cfg.json && linnet graph model.linnet --entry forward --config cfg.json

Fixed:

    $ echo '{"D": 64, "H": 4}' > cfg.json && linnet graph model.linnet --entry forward --config cfg.json
""",
    "E0642": """\
A `--set` without `NAME=VALUE`.

Wrong:

    $ linnet graph model.linnet --entry forward --set D --input x=2,64

Fixed:

    $ linnet graph model.linnet --entry forward --set D=64 --input x=2,64
""",
    "E0643": """\
An `--input` shape with something other than integers.

`--input NAME=D0,D1` gives an input's sizes as comma-separated integers; `--input x=` is a
scalar.

Wrong:

    $ linnet graph model.linnet --entry forward --set D=64 --input x=two,64

Fixed:

    $ linnet graph model.linnet --entry forward --set D=64 --input x=2,64
""",
    "E0644": """\
No entry can be generated: none had all its input shapes.

Generating code lowers each entry whose inputs all have shapes (`--input NAME=...`);
entries missing one are skipped, and with none left there is nothing to write.

Wrong:

    $ linnet torch llama.linnet --config toy -o llama_toy.py

Fixed:

    $ linnet torch llama.linnet --config toy --input token=1 --input pos=1 -o llama_toy.py
""",
    "E0645": """\
A config file is not UTF-8 text.

Configs are read as UTF-8 (a leading byte-order mark is skipped). The message gives the
offset and line of the first byte that is not UTF-8; the file was probably saved in another
encoding, such as UTF-16 or Latin-1.

Wrong:

    $ iconv -t UTF-16 cfg.json > cfg16.json && linnet graph model.linnet --entry forward --config cfg16.json --input x=2,64

Fixed:

    $ linnet graph model.linnet --entry forward --config cfg.json --input x=2,64
""",
    "E0646": """\
A config file is nested too deeply to read.

A config is one flat JSON object of names to values; thousands of nested brackets cannot be
a config, and are refused before they exhaust the reader.

Wrong:

    $ python -c 'print("[" * 100000)' > cfg.json && linnet graph model.linnet --entry forward --config cfg.json --input x=2,64

Fixed:

    $ echo '{"D": 64}' > cfg.json && linnet graph model.linnet --entry forward --config cfg.json --input x=2,64
""",
    "E0647": """\
A config file exists but cannot be read.

`--config` names a directory, or a file the user may not read.

Wrong:

    $ linnet graph llama.linnet --entry decode --config configs --input token=1 --input pos=1

Fixed:

    $ linnet graph llama.linnet --entry decode --config configs/toy.json --input token=1 --input pos=1
""",
    "E0648": """\
An `--input` size is negative or too large.

Sizes are 0 or more, at most 2**63 - 1, and so is their product (the number of elements):
no tensor can be larger.

Wrong:

    $ linnet graph model.linnet --entry forward --set D=64 --input x=-1,64

Fixed:

    $ linnet graph model.linnet --entry forward --set D=64 --input x=2,64
""",
    "E0649": """\
An `--input` without a name, with a name twice, or without `=`.

Each `--input NAME=D0,D1` names one of the entry's inputs once; `NAME=` is a scalar.

Wrong:

    $ linnet graph model.linnet --entry forward --set D=64 --input x=2,64 --input x=4,64

Fixed:

    $ linnet graph model.linnet --entry forward --set D=64 --input x=4,64
""",
    "E0650": """\
A weights file is not a readable safetensors file.

Its header is truncated, not JSON, or describes tensors outside the file. The file may be
incomplete (an interrupted download) or in another format.

Wrong:

    $ linnet graph llama.linnet --entry decode --config toy --weights model.bin --input token=1 --input pos=1

Fixed:

    $ linnet graph llama.linnet --entry decode --config toy --weights model.safetensors --input token=1 --input pos=1
""",
    "E0651": """\
A weights file cannot be found or read.

Wrong:

    $ linnet graph llama.linnet --entry decode --config toy --weights modle.safetensors --input token=1 --input pos=1

Fixed:

    $ linnet graph llama.linnet --entry decode --config toy --weights model.safetensors --input token=1 --input pos=1
""",
    "E0652": """\
A checkpoint's `config.json` is not a JSON object.

It is not UTF-8 JSON, is too large, nests too deeply, or is another JSON value.

Wrong:

    $ linnet run llama.linnet --weights checkpoint-with-broken-config/

Fixed:

    $ linnet run llama.linnet --weights Llama-3.2-1B/
""",
    "E0653": """\
A model's checkpoint mapping (`<model>.hf.json`) does not have the documented form.

The mapping beside a model says which `config.json` keys set which config names: sections
`architectures`, `model_types`, `set`, `check`, `runtime`, `require`, `ignore` and `rope`
(see docs/torch.md, "Checkpoint mappings").

Wrong:

    >>> validate_mapping({"set": {"H": 4}})

Fixed:

    >>> validate_mapping({"set": {"H": "num_attention_heads"}})
""",
    "E0654": """\
A checkpoint's architecture is not the model's.

`config.json`'s `architectures` (or `model_type`) names another model than the ones the
model's checkpoint mapping lists: a Qwen2 checkpoint given to the Llama model, say. Its
tensors might even have the right names, and it would compute the wrong thing.

Wrong:

    $ linnet run examples/llama/llama.linnet --weights Qwen2-0.5B/

Fixed:

    $ linnet run examples/llama/llama.linnet --weights Llama-3.2-1B/
""",
    "E0655": """\
A checkpoint's `config.json` sets a key that the model does not model.

Every key must be one that the model's checkpoint mapping reads, requires or ignores. A
key that changes the math (a soft cap on the logits, a partial rotary factor) would
otherwise be silently dropped and the model would compute something else. If the key does
not change the math, add it to the mapping's `ignore` list.

Wrong:

    $ linnet run llama.linnet --weights checkpoint-with-logit-softcap/

Fixed:

    $ linnet run gemma.linnet --weights checkpoint-with-logit-softcap/
""",
    "E0656": """\
A checkpoint's `config.json` has a value that the model does not compute.

The model's checkpoint mapping lists, under `require`, the values its math assumes (no
attention bias, the SiLU activation, no sliding window...); the checkpoint asks for
another.

Wrong:

    $ linnet run llama.linnet --weights checkpoint-with-attention-bias/

Fixed:

    $ linnet run qwen2.linnet --weights checkpoint-with-attention-bias/
""",
    "E0657": """\
A checkpoint's rope type is not one the model implements.

`rope_scaling` (or transformers 5's `rope_parameters`) names a `rope_type` (`yarn`,
`dynamic`, ...) that the model's checkpoint mapping does not list. Running with the
original rotary frequencies would be silently wrong past the trained length. The Llama
example implements `default`, `linear`, `llama3` and `dynamic`.

Wrong:

    $ linnet run llama.linnet --weights checkpoint-with-yarn-rope/

Fixed:

    $ linnet run llama.linnet --weights Llama-3.1-8B/
""",
    "E0658": """\
A checkpoint's `config.json` contradicts its weights.

A value that `config.json` states (`hidden_size`, `intermediate_size`, the heads...) differs
from what the safetensors files' shapes say: the two files come from different
checkpoints.

Wrong:

    $ linnet run llama.linnet --weights config-from-another-model/

Fixed:

    $ linnet run llama.linnet --weights Llama-3.2-1B/
""",
    "E0659": """\
A config given by hand contradicts the checkpoint's `config.json`.

The values `config.json` states are facts about the weights (the heads, the norm's epsilon,
the rope); `config=` may repeat them but not change them. Runtime choices such as the
cache length `S` are the user's to set.

Wrong:

    >>> load("llama.linnet", weights="Llama-3.2-1B/", config={"H": 16})

Fixed:

    >>> load("llama.linnet", weights="Llama-3.2-1B/", config={"S": 8192})
""",
    "E0660": """\
Linnet's cache directory cannot be used.

Linnet writes generated source, timings and demo checkpoints under `$LINNET_HOME` (default
`$XDG_CACHE_HOME/linnet`, or `~/.cache/linnet`). The path names a file, or a directory that
cannot be created (permissions, a read-only file system).

Wrong:

    $ LINNET_HOME=notes.txt linnet run

Fixed:

    $ LINNET_HOME=/tmp/linnet-cache linnet run
""",
    "E0661": """\
A file cannot be written.

The directory does not exist, is read-only or full, the target is a directory, or the file
is read-only. Files are written to a temporary file and renamed into place, so the old file
is left as it was.

Wrong:

    $ linnet torch llama.linnet --config toy --input token=1 --input pos=1 -o no/such/dir/decode.py

Fixed:

    $ mkdir -p out && linnet torch llama.linnet --config toy --input token=1 --input pos=1 -o out/decode.py
""",
    "E0662": """\
`-o` names a file the command reads.

Writing the output there would overwrite the model's source (or a module it uses, its
config or its weights); Linnet refuses, also through symbolic and hard links.

Wrong:

    $ linnet torch llama.linnet --config toy --input token=1 --input pos=1 -o llama.linnet

Fixed:

    $ linnet torch llama.linnet --config toy --input token=1 --input pos=1 -o llama_toy.py
""",
    "E0663": """\
A command stopped on a file or device error.

The operating system refused something the command needed (an input/output error, a file
that vanished, too many open files). `LINNET_DEBUG=1` shows where it happened.

Wrong:

    $ linnet check /mnt/failing-disk/model.linnet

Fixed:

    $ cp /mnt/failing-disk/model.linnet . && linnet check model.linnet
""",
    "E0664": """\
A config file gives a name twice.

JSON readers disagree on which of two equal keys counts, so Linnet takes neither.

Wrong:

    $ echo '{"D": 64, "H": 4, "D": 32}' > cfg.json && linnet graph model.linnet --entry forward --config cfg.json --input x=2,64

Fixed:

    $ echo '{"D": 64, "H": 4}' > cfg.json && linnet graph model.linnet --entry forward --config cfg.json --input x=2,64
""",
    "E0670": """\
A checkpoint has a `config.json`, but the model has no checkpoint mapping to read it with.

Without the mapping (`<model>.hf.json` beside the model) nothing says which keys the model
reads, and values such as the rope scaling would be silently ignored.

Wrong:

    $ linnet run mine.linnet --weights Llama-3.2-1B/

Fixed:

    $ cp examples/llama/llama.hf.json mine.hf.json && linnet run mine.linnet --weights Llama-3.2-1B/
""",
    "E0671": """\
A value in a checkpoint's `config.json` is not of the kind the model reads.

Dims (heads, sizes, positions) are positive integers, and other values numbers or
booleans; rope parameters are numbers.

Wrong:

    >>> checkpoint_config({"num_attention_heads": "four"}, {"set": {"H": "num_attention_heads"}})

Fixed:

    >>> checkpoint_config({"num_attention_heads": 4}, {"set": {"H": "num_attention_heads"}})
""",
    # ------------------------------------------------------------ E09xx: graphs
    "E0900": """\
The data read as a graph is not a Linnet graph.

Runtimes read graphs written by `linnet graph --format json` (or `Graph.dumps`); other JSON
is rejected.

Wrong:

    >>> Graph.from_json({"steps": []})

Fixed:

    >>> Graph.from_json(json.loads(Path("decode.json").read_text()))
""",
    "E0901": """\
A graph written in another version of the graph format.

Graphs record the format version they were written in; write the graph again with the
installed linnet-lang.

Wrong:

    >>> Graph.from_json(json.loads(Path("old-decode.json").read_text()))

Fixed:

    $ linnet graph llama.linnet --entry decode --config toy --format json -o decode.json
""",
    "E0920": """\
Internal error: a graph reads a value before any step makes it.

The graph verifier (`linnet.lang.ir.verify`, run after lowering and after every pass
under `LINNET_DEBUG=1`) found a step whose operand is neither an entry input nor made by an
earlier step, or an entry output that no step makes. Lowering or a pass put steps out of
order. This is a bug in linnet-lang, not in the model: please report it.

Wrong:

    >>> g.steps = [Step("exp", ["%y"], ["%z"]), Step("neg", ["%x"], ["%y"])]

Fixed:

    >>> g.steps = [Step("neg", ["%x"], ["%y"]), Step("exp", ["%y"], ["%z"])]
""",
    "E0921": """\
Internal error: a graph makes one value twice.

Values are SSA: each is made by one step, or is an entry input. The verifier found a
second step making a value (or a step making an entry input). This is a bug in
linnet-lang, not in the model: please report it.

Wrong:

    >>> g.steps = [Step("neg", ["%x"], ["%y"]), Step("exp", ["%x"], ["%y"])]

Fixed:

    >>> g.steps = [Step("neg", ["%x"], ["%y"]), Step("exp", ["%x"], ["%z"])]
""",
    "E0922": """\
Internal error: a graph's call spans do not nest or leave the steps.

Each inlined call covers steps `start..stop` of the graph; two calls are either disjoint
or one lies inside the other, and every span lies inside the graph's steps. A pass that
moves steps must move the spans with them. This is a bug in linnet-lang, not in the
model: please report it.

Wrong:

    >>> g.calls = [Call("m::f", "fn", 0, 2, 1), Call("m::g", "fn", 1, 3, 2)]

Fixed:

    >>> g.calls = [Call("m::f", "fn", 0, 2, 1), Call("m::g", "fn", 1, 2, 2, depth=1)]
""",
    "E0923": """\
Internal error: a graph writes a state other than by scatter.

States (KV caches) are written in place only by `scatter`, whose first operand is the
`@state`; no step makes a `@path` as its result, and a scatter never writes a parameter
or a value. This is a bug in linnet-lang, not in the model: please report it.

Wrong:

    >>> Step("scatter", ["@model.layers.0.attn.q.weight", "%v", "%pos"], [])

Fixed:

    >>> Step("scatter", ["@model.layers.0.attn.k_cache", "%v", "%pos"], [])
""",
    "E0924": """\
Internal error: a graph step calls an unknown primitive.

Every step's op is a row of `linnet.lang.ir.primitives.PRIMITIVES`, the table every
emitter and interpreter keys on. This is a bug in linnet-lang (or in a pass that made the
step), not in the model: please report it.

Wrong:

    >>> Step("expm1", ["%x"], ["%y"])

Fixed:

    >>> Step("exp", ["%x"], ["%y"])
""",
    "E0925": """\
Internal error: a graph step has the wrong number of operands or results.

Each primitive takes the operands its row in `PRIMITIVES` says (`arity`, or at least
`min_arity`) and makes one result, except `scatter`, which makes none. This is a bug in
linnet-lang, not in the model: please report it.

Wrong:

    >>> Step("add", ["%x", "%y", "%z"], ["%s"])

Fixed:

    >>> Step("add", ["%x", "%y"], ["%s"])
""",
    "E0926": """\
Internal error: a graph value, parameter or state has no valid type.

Every value a step makes or an entry takes has a shape and dtype in `graph.values`, every
parameter and state one in `graph.parameters` or `graph.states` (a known dtype, sizes of
0 or more), and every `@path` operand names one of them. This is a bug in linnet-lang,
not in the model: please report it.

Wrong:

    >>> g.values["%y"] = ValueType((-1, 4), "f8")

Fixed:

    >>> g.values["%y"] = ValueType((1, 4), "f32")
""",
}
