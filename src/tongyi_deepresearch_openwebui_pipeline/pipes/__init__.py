"""The Open WebUI pipe (a manifold with one model: Tongyi DeepResearch)."""
