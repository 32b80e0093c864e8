"""Each party's web console: ``dpmarket console --config PARTY.toml``.

A party runs the console for itself, on its own certificate: it is a client of the party's own
services (over mTLS) and files, serves on 127.0.0.1 by default, and asks for the party's token on
every page (:mod:`dpmarket.console.auth`). Its pages are the role's: the consumer's catalogue,
exploration, rankings and summaries (:mod:`dpmarket.console.consumer`), the owner's budget,
charges, sketches and policy (:mod:`dpmarket.console.owner`), the curator's owners, sessions,
catalogue and load (:mod:`dpmarket.console.curator`), rendered by :mod:`dpmarket.console.app`.
See docs/howto-console.md.

In the package layers the console sits above the roles (it reads each role's own state through
that role's modules) and below ``deploy``, whose command line adds ``console``.
"""
