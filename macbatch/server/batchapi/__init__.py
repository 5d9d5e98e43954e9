"""OpenAI's Batch API (``/v1/files``, ``/v1/batches``) over the job runner's planning, ledger
and output files, on the server's one engine (docs/serve.md, "The Batch API")."""
