"""`asearch corpus ...` commands."""

import typer

app = typer.Typer(help="corpus commands", no_args_is_help=True)
