"""``python -m dpmarket``: the ``dpmarket`` command."""

from dpmarket.deploy.entry import main

if __name__ == "__main__":
    main()
