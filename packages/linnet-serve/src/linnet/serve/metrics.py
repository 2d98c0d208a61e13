"""The engine's counters and histograms, and their Prometheus text (``GET /metrics``).

>>> h = Histogram("linnet_ttft_seconds", "time to first token", (0.1, 1.0))
>>> h.observe(0.05); h.observe(3.0)
>>> print("\\n".join(h.lines()))  # doctest: +NORMALIZE_WHITESPACE
# HELP linnet_ttft_seconds time to first token
# TYPE linnet_ttft_seconds histogram
linnet_ttft_seconds_bucket{le="0.1"} 1
linnet_ttft_seconds_bucket{le="1.0"} 1
linnet_ttft_seconds_bucket{le="+Inf"} 2
linnet_ttft_seconds_sum 3.05
linnet_ttft_seconds_count 2
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

#: Bucket bounds (seconds) of the latency histograms: from a GPU's milliseconds to a busy
#: CPU's seconds.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass
class Histogram:
    """A Prometheus histogram: cumulative bucket counts, a sum and a count."""

    name: str
    help: str
    bounds: Sequence[float] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        at = bisect.bisect_left(self.bounds, value)
        if at < len(self.counts):
            self.counts[at] += 1
        self.total += value
        self.count += 1

    def lines(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        running = 0
        for bound, n in zip(self.bounds, self.counts):
            running += n
            out.append(f'{self.name}_bucket{{le="{bound}"}} {running}')
        out.append(f'{self.name}_bucket{{le="+Inf"}} {self.count}')
        out.append(f"{self.name}_sum {round(self.total, 6)}")
        out.append(f"{self.name}_count {self.count}")
        return out


@dataclass
class Metrics:
    """What the engine counts (under its lock)."""

    tokens_generated: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    requests: dict[str, int] = field(default_factory=dict)  # by finish reason
    preemptions: int = 0
    steps: int = 0
    peak_running: int = 0
    ttft: Histogram = field(
        default_factory=lambda: Histogram(
            "linnet_time_to_first_token_seconds", "time to first token"
        )
    )
    itl: Histogram = field(
        default_factory=lambda: Histogram(
            "linnet_inter_token_latency_seconds", "time between tokens"
        )
    )


def gauge(name: str, help: str, value: float, kind: str = "gauge") -> list[str]:
    """One metric's three lines.

    >>> gauge("linnet_requests_running", "running requests", 3)
    ['# HELP linnet_requests_running running requests', '# TYPE linnet_requests_running gauge', 'linnet_requests_running 3']
    """
    return [f"# HELP {name} {help}", f"# TYPE {name} {kind}", f"{name} {value}"]


def prometheus(m: Metrics, running: int, waiting: int, used: int, free: int, cached: int) -> str:
    """The Prometheus text exposition of ``m`` and the engine's gauges."""
    lines = [
        *gauge("linnet_requests_running", "requests in the decode batch", running),
        *gauge("linnet_requests_waiting", "requests waiting to start", waiting),
        *gauge("linnet_kv_pages_used", "KV pages held by requests", used),
        *gauge("linnet_kv_pages_free", "KV pages free (or cached and unheld)", free),
        *gauge("linnet_kv_pages_cached", "KV pages in the prefix cache", cached),
        *gauge(
            "linnet_requests_running_peak", "most requests ever running at once", m.peak_running
        ),
        *gauge("linnet_generation_tokens_total", "tokens generated", m.tokens_generated, "counter"),
        *gauge("linnet_prompt_tokens_total", "prompt tokens admitted", m.prompt_tokens, "counter"),
        *gauge(
            "linnet_prompt_tokens_cached_total",
            "prompt tokens found in the prefix cache",
            m.cached_prompt_tokens,
            "counter",
        ),
        *gauge("linnet_preemptions_total", "requests preempted", m.preemptions, "counter"),
        *gauge("linnet_steps_total", "engine steps run", m.steps, "counter"),
        "# HELP linnet_requests_finished_total requests ended, by reason",
        "# TYPE linnet_requests_finished_total counter",
        *(
            f'linnet_requests_finished_total{{reason="{r}"}} {n}'
            for r, n in sorted(m.requests.items())
        ),
        *m.ttft.lines(),
        *m.itl.lines(),
    ]
    return "\n".join(lines) + "\n"
