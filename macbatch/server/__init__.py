"""Headless mode: a local OpenAI-compatible HTTP API over the shared engine (``macbatch serve``).

Nothing is imported here so that importing the command stays light; see ``app.create_app`` and
``command.serve_command``.
"""
