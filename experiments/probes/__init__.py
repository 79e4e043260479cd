"""Probes beside the paper's tables: why a stand-in result differs from the paper's (crowding, label-noise capacity)."""
