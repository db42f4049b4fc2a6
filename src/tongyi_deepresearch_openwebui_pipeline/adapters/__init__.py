"""Adapters between the core and the outside world (model server, Open WebUI)."""
