"""`python -m asearch` runs the CLI."""

from asearch.cli.app import main

main()
