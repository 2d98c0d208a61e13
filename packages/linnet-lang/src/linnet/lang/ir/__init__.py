"""The graph format (`graph`), its primitives (`primitives`, the one registry), the builder
lowering writes through, the verifier and the shape rules, and the analyses over graphs that
every stage shares (`stepsets`, `accesses`, `validity`). A data layer: it imports neither
`check/` nor `syntax/`, nor the graph-to-graph passes in `linnet.lang.passes` (the
import-graph test enforces it)."""
