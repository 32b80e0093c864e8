"""The summarization options of ``request`` and ``simulate``, generated from the methods'
configuration fields.

Every field of every method (:mod:`dpmarket.common.summarization.methods`) becomes one option,
its default, type, choices and help taken from the field and its metadata, so the options cannot
drift from what the methods read. The help lists them by the part of a configuration that
declares them (:data:`SECTIONS`: the kernel, h2 releases, PrivAuction, each method's own), after
the basics; a value out of range is refused as the configuration refuses it, whichever method
reads it, and an option given on the command line that the chosen method does not read is refused
by name (:func:`check_method_options`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import click
from click.core import ParameterSource

from dpmarket.common.summarization.methods import (
    METHOD_CONFIGS,
    METHODS,
    AllocationFields,
    AuctionFields,
    CandidatesConfig,
    GaussianFields,
    H2Fields,
    PrivateConfig,
    RoundsConfig,
    SummarizationConfig,
    check_field,
    config_class,
    config_from_fields,
    method_fields,
    param_info,
)
from dpmarket.runtime.cli import SectionedOption

__all__ = [
    "BASIC_FIELDS",
    "METHOD_SECTIONS",
    "SECTIONS",
    "check_method_options",
    "method_options",
    "summarization_config",
]

#: The help section of the fields each part of a configuration declares, in the help's order.
SECTIONS: dict[type[SummarizationConfig], str] = {
    SummarizationConfig: "h1's kernel (every method)",
    H2Fields: "h2 (MWEM) releases (private; rounds with an mwem release)",
    AuctionFields: "PrivAuction (private and rounds)",
    PrivateConfig: f"--method private: {PrivateConfig.title}",
    RoundsConfig: f"--method rounds: {RoundsConfig.title}",
    AllocationFields: f"--method candidates: {CandidatesConfig.title}",
    CandidatesConfig: f"--method candidates: {CandidatesConfig.title}",
}
#: The methods' sections in the help's order.
METHOD_SECTIONS: tuple[str, ...] = tuple(
    dict.fromkeys(
        SECTIONS[cls]
        for cls in (
            SummarizationConfig,
            CandidatesConfig,
            PrivateConfig,
            RoundsConfig,
            H2Fields,
            AuctionFields,
        )
    )
)
#: Fields listed with the basics, by name: p, and the default method's epsilon and delta per
#: party.
BASIC_FIELDS: tuple[str, ...] = (
    "summary_size",
    *(
        f.name
        for f in dataclasses.fields(GaussianFields)
        if f.name in GaussianFields.__annotations__
    ),
)


def _declaring_class(name: str) -> type[SummarizationConfig]:
    """The part of a configuration that declares the field ``name``."""
    for cls in METHOD_CONFIGS.values():
        for part in cls.__mro__:
            if name in inspect.get_annotations(part):
                return part
    raise KeyError(name)


def _check(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """The option's callback: the field's own check (the configuration's message)."""
    if value is not None and param.name is not None:
        try:
            check_field(param.name, value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from exc
    return value


def _option(name: str, field: dataclasses.Field[Any]) -> Callable[[Any], Any]:
    """The option of one configuration field."""
    info = param_info(field)
    decls = [f"--{name.replace('_', '-')}", *([info.short] if info.short else []), name]
    help_text = info.help if info.unit in ("choice", "flag") else f"{info.help} [{info.unit}]"
    section = "Basics" if name in BASIC_FIELDS else SECTIONS[_declaring_class(name)]
    kwargs: dict[str, Any] = {
        "help": help_text,
        "cls": SectionedOption,
        "section": section,
        "brief": info.brief,
    }
    if name == "summary_size":
        return click.option(
            *decls, required=True, type=click.IntRange(min=1), metavar="INTEGER", **kwargs
        )
    default = field.default
    if isinstance(default, bool):
        return click.option(*decls, is_flag=True, default=default, **kwargs)
    if info.choices:
        kind: Any = click.Choice(info.choices)
    else:
        kind = type(default)
    return click.option(
        *decls, type=kind, default=default, show_default=True, callback=_check, **kwargs
    )


def method_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``-p``, ``--method`` and one option per field of every method (defaults: Section 4,
    Table 1), generated from the fields."""
    options = [
        _option("summary_size", method_fields()["summary_size"]),
        click.option(
            "--method",
            type=click.Choice(METHODS),
            default=METHODS[0],
            show_default=True,
            metavar="METHOD",
            cls=SectionedOption,
            section="Basics",
            help="; ".join(f"{m}: {config_class(m).title}" for m in METHODS)
            + ". Each method's own options follow.",
            brief=f"{', '.join(METHODS[:-1])} or {METHODS[-1]}: see their options below.",
        ),
        *(_option(name, f) for name, f in method_fields().items() if name != "summary_size"),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def summarization_config(
    summary_size: int, method: str, kwargs: dict[str, Any]
) -> SummarizationConfig:
    """The session's configuration from ``-p``, ``--method`` and the method's options in
    ``kwargs`` (other keys are ignored); a value out of range is a bad parameter, whichever
    method reads it."""
    known = method_fields()
    values = {k: v for k, v in kwargs.items() if k in known and k != "summary_size"}
    try:
        for name, value in values.items():
            check_field(name, value)
        return config_from_fields(method, {**values, "summary_size": summary_size})
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def check_method_options(ctx: click.Context, method: str) -> None:
    """Refuse an option given on the command line that ``method`` does not read, naming the
    methods that do (options from a ``--config`` file, which serves several commands, are
    left to the methods that read them).

    Raises
    ------
    click.UsageError
        For the first such option.
    """
    reads = {f.name for f in dataclasses.fields(config_class(method))}
    for name in method_fields():
        if name in reads or ctx.get_parameter_source(name) is not ParameterSource.COMMANDLINE:
            continue
        readers = [
            m for m in METHODS if name in {f.name for f in dataclasses.fields(config_class(m))}
        ]
        raise click.UsageError(
            f"--{name.replace('_', '-')} is read by --method {' or --method '.join(readers)}, "
            f"not by --method {method}"
        )
