"""A backend written for contract 0: discovery must skip it and say so."""


class OldContract:
    name = "old-contract"
    version = "0.1.0"
    contract = 0

    def probe(self, target):
        return None

    def match(self, graph, target):
        return []

    def compile(self, region, target, options):
        raise RuntimeError("old-contract is skipped by discovery and matches nothing")

    def estimate_cost(self, region, target):
        return None


def make_backend():
    """The entry point may name a function that returns the backend."""
    return OldContract()
