"""An LLM-emulating Ray Serve app and an open-loop load generator, for tests and the demo."""
