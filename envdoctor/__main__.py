"""`python -m envdoctor` works like the `envdoctor` command."""

from envdoctor.cli import main

if __name__ == "__main__":
    main()
