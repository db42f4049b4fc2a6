"""Self-contained Open WebUI Tools modules (search, google_scholar, visit)."""
