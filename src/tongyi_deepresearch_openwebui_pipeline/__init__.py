"""Run Tongyi DeepResearch as a deep-research assistant inside Open WebUI."""

__version__ = "0.2.0"
