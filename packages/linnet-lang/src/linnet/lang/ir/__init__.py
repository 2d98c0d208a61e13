"""The graph format (`graph`), its primitives (`primitives`, the one registry), the builder
lowering writes through, passes, slices and analyses over graphs."""
