"""The coded errors of linnet.serve: one function a code, so that each says where, why and how
to fix in one place.

Codes: E0862 (an engine or server option), E0863 (a request that can never fit the model's
cache or page pool), E0864 (the queue is full), E0865 (a page freed twice or never held),
E0869 (a model without the paged entries), E0876 (a request the server cannot read),
E0877 (the engine is closed). Sampling options reuse ``generate``'s codes (E0811-E0815,
E0819).

>>> queue_full(4).diagnostics[0].code
'E0864'
"""

from __future__ import annotations

from linnet.lang.diagnostics.core import LinnetError
from linnet.lang.host.inputs import error


def option_error(name: str, value: object, rule: str, example: str) -> LinnetError:
    """E0862: an engine or server option out of its range.

    >>> option_error("max_batch", 0, "a positive int", "max_batch=32").diagnostics[0].message
    'max_batch must be a positive int, not 0'
    """
    return error("E0862", f"{name} must be {rule}, not {value!r}", help=f"e.g. {example}")


def too_long(prompt: int, max_tokens: int, why: str, fix: str) -> LinnetError:
    """E0863: a request that no amount of waiting would let run (longer than the cache, or
    needing more pages than the pool has).

    >>> too_long(10, 5, "why", "fix").diagnostics[0].code
    'E0863'
    """
    return error(
        "E0863",
        f"a request of {prompt} prompt tokens and max_tokens={max_tokens} can never run: {why}",
        help=fix,
    )


def queue_full(limit: int) -> LinnetError:
    """E0864: ``limit`` requests already wait; a new one is refused rather than queued
    without bound."""
    return error(
        "E0864",
        f"the engine's queue is full ({limit} requests wait)",
        help="retry later, or start the engine with a longer queue (max_queue=..., "
        "`linnet serve --max-queue N`)",
    )


def page_error(page: int, why: str) -> LinnetError:
    """E0865: a page freed that the caller does not hold (freed twice, the sink page, or
    out of the pool).

    >>> page_error(3, "it is free already").diagnostics[0].message
    'page 3 cannot be freed: it is free already'
    """
    return error(
        "E0865",
        f"page {page} cannot be freed: {why}",
        help="free each page once, with the list allocate() or match() gave",
    )


def bad_request(message: str, fix: str) -> LinnetError:
    """E0876: an HTTP request the server cannot read (not JSON, a missing or mistyped field,
    an unknown model).

    >>> bad_request("x", "y").diagnostics[0].code
    'E0876'
    """
    return error("E0876", message, help=fix)


def closed() -> LinnetError:
    """E0877: a request submitted to an engine that was closed."""
    return error(
        "E0877",
        "the engine is closed: it takes no new requests",
        help="submit before Engine.close(), or make a new engine",
    )
