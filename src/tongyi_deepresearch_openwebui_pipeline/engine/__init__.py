"""The run engine: composes research runs (single, heavy) for every front end."""
