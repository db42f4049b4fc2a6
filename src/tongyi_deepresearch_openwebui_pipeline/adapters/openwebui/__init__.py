"""Thin adapters between the pure core and Open WebUI (0.6 – 0.12)."""
