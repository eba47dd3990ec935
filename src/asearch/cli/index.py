"""`asearch index ...` commands."""

import typer

app = typer.Typer(help="index commands", no_args_is_help=True)
