"""`python -m app` runs the coretrain CLI."""

from app.cli import main

if __name__ == "__main__":
    main()
