"""A backend for CUDA devices of compute capability 8.0 or later: `linnet backends` must list
it as unavailable on any other machine, with the reason its `decline_reason` gives."""

from linnet.backends import CONTRACT, Capabilities


class CudaOnly:
    name = "cuda-only"
    version = "0.1.0"
    contract = CONTRACT

    def probe(self, target):
        return None if self.decline_reason(target) else Capabilities(notes="takes nothing")

    def decline_reason(self, target):
        if target.kind != "cuda":
            return f"cuda-only runs on CUDA devices only; this target is {target.kind}"
        if target.capability is None or tuple(target.capability) < (8, 0):
            return (
                f"cuda-only needs compute capability 8.0 or later; {target.name} has "
                f"{target.capability}"
            )
        return None

    def match(self, graph, target):
        return []

    def compile(self, region, target, options):
        raise RuntimeError("cuda-only matches no region, so the planner never compiles one")

    def estimate_cost(self, region, target):
        return None
