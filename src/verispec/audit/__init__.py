"""Exactness audits: an exact rational oracle and exhaustive enumeration of the engine's own
random choices."""
