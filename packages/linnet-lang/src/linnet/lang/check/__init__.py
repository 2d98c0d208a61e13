"""Checking and lowering: one abstract interpreter (`evaluate.Evaluator`), run over generic code
to check it (`checker`) and over concrete shapes to lower an entry to a graph (`lowering`).

The Evaluator is composed of one mixin per idea: `names` (resolution, lookup), `statements`,
`expressions` (positional values), `elementwise` (the typing of elementwise primitives: result
types, casts, broadcasting; `TYPING_RULES`), `folding` (constant folding; `FOLDING_RULES`),
`indexing` / `reductions` / `binders` (index notation: reads, gathers, reductions,
contractions, range inference, `let y[...]`), `calls` and `generics` (inlining, generics,
where-clauses), `kernels` (builtins and kernel memory access) and `hints` (did-you-means and
other help). `core` holds what they share (Frame, Fail, limits); `blocks` instantiates blocks;
`instantiate` lowers a loop over repeated blocks once and replays it for the other elements
(the same graph, much faster); `weight_checks` checks a checkpoint against the parameters;
`driver` re-exports the pipeline's entry points."""
