"""`python -m gradlint` runs the command-line interface."""

from gradlint.cli import main

main()
