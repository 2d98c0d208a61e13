"""`linnet serve`'s flags: the server warms (plans every batch size's decode step) before it
listens unless told not to."""

from __future__ import annotations

import argparse

from linnet.serve.cli import register_serve


def parse(*argv: str) -> argparse.Namespace:
    sub = argparse.ArgumentParser().add_subparsers()
    register_serve(sub)
    return sub.choices["serve"].parse_args(list(argv))


def test_the_server_warms_unless_told_not_to() -> None:
    assert parse("m.gguf").warm is True
    assert parse("m.gguf", "--no-warm").warm is False
