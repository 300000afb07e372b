"""Which path ran, for tests that assert it (not only that the result equals eager's)."""
import tempa


def counts():
    """(captures, graph_breaks, recompiles, eager_fallbacks) since the test began."""
    s = tempa.stats()
    return s.captures, s.graph_breaks, s.recompiles, s.eager_fallbacks
