"""A working minimal backend: it runs on every target and takes no region."""

from linnet.backends import CONTRACT, Capabilities


class Good:
    name = "good"
    version = "0.2.0"
    contract = CONTRACT

    def probe(self, target):
        return Capabilities(notes="takes nothing")

    def match(self, graph, target):
        return []

    def compile(self, region, target, options):
        raise RuntimeError("good matches no region, so the planner never compiles one")

    def estimate_cost(self, region, target):
        return None
