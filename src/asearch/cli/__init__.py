"""The `asearch` command line: thin typer commands over the library."""
