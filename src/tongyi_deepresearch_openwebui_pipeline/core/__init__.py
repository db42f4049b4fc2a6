"""The pure core: prompts, protocol parsing, budgets and the ReAct loop.

Nothing in this package imports Open WebUI or an HTTP client; the loop talks to
the model and the tools through the small protocols in `core.ports`.
"""
