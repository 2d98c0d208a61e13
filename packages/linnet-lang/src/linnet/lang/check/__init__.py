"""Checking and lowering: the abstract interpreter (`evaluate`) run over generic code to check
it, and over concrete shapes to lower an entry to a graph (`driver`)."""
