"""`python -m envdoctor` works like the `envdoctor` command."""

from envdoctor.program import module_main

if __name__ == "__main__":
    module_main()
