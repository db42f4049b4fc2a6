"""End-to-end tests against a real ``open-webui serve`` process."""
