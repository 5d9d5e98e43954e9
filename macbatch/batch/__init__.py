"""The batch job runner: `macbatch run FILE` (see docs/jobs.md)."""
