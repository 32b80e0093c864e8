"""``python -m dpmarket``: the ``dpmarket`` command."""

from dpmarket.deploy.cli import main

if __name__ == "__main__":
    main(prog_name="dpmarket")
