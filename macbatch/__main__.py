"""`python -m macbatch` runs the command line."""

from macbatch.cli import command

command()(prog_name="macbatch")
