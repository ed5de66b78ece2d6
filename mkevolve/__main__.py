"""Entry point for `python -m mkevolve`."""

from mkevolve.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
