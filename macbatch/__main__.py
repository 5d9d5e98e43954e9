"""`python -m macbatch` runs the command line."""

from macbatch.cli import app

app(prog_name="macbatch")
