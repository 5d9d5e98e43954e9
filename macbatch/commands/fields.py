"""Command-line options generated from dataclass fields, so that an option is declared once: its
field (name, type, default) and, in the field's metadata, its flag, help and checks. A command
takes the dataclass as one parameter; ``takes`` turns it into the fields' options for typer and
builds the dataclass from what was parsed (as vLLM's ``EngineArgs.add_cli_args`` turns each
field of the engine's arguments into a flag). ``Pick.argv`` writes an instance back as the
options that give it."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, get_type_hints

import typer

Command = TypeVar("Command", bound=Callable[..., Any])


@dataclass(frozen=True)
class Flag:
    """How one field shows on the command line: its names (the first is the long one; a
    "--yes/--no" pair for a bool that may stay unset), the help that ``--help`` shows, the
    parameter's type where it differs from the field's (a repeatable option is a list, the field
    a tuple) with ``convert`` from the parsed value to the field's, and the rest of
    ``typer.Option``'s keywords (min, callback, metavar, envvar, ...)."""

    names: tuple[str, ...]
    help: str
    cli_type: Any = None
    convert: Callable[[Any], Any] | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def option(
    default: Any,
    *names: str,
    help: str,
    cli_type: Any = None,
    convert: Callable[[Any], Any] | None = None,
    **options: Any,
) -> Any:
    """A dataclass field that is also a command-line option (no names: ``--field-name``)."""
    flag = Flag(names, help, cli_type, convert, options)
    return dataclasses.field(default=default, metadata={"option": flag})


def flag_of(field: dataclasses.Field[Any]) -> Flag:
    """The field's option, its names filled in."""
    flag: Flag = field.metadata["option"]
    names = flag.names or ("--" + field.name.replace("_", "-"),)
    return dataclasses.replace(flag, names=names)


@dataclass(frozen=True)
class Pick:
    """The fields of ``table`` a command offers (None: all), each with the table's flag, help
    and checks; ``names`` keeps the flag a command has always had for a field where it differs
    from the table's (run's ``--max-seqs``), ``defaults`` the command's own default where it has
    one (run's options default to its job file's)."""

    table: type
    fields: tuple[str, ...] | None = None
    names: Mapping[str, str] = dataclasses.field(default_factory=dict)
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def chosen(self) -> list[dataclasses.Field[Any]]:
        """The fields offered, in the order given (a name the table lacks is a typo here)."""
        fields = {f.name: f for f in dataclasses.fields(self.table) if "option" in f.metadata}
        unknown = set(self.fields or ()) - fields.keys()
        if unknown:
            raise TypeError(f"{self.table.__name__} has no option field {sorted(unknown)}")
        return [fields[name] for name in self.fields] if self.fields else list(fields.values())

    def names_of(self, field: dataclasses.Field[Any]) -> tuple[str, ...]:
        """The field's flag names in this command."""
        return (self.names[field.name],) if field.name in self.names else flag_of(field).names

    def parameters(self) -> list[inspect.Parameter]:
        """The typer parameters of the chosen fields, in their order."""
        hints = get_type_hints(self.table)
        params = []
        for field in self.chosen():
            flag, names = flag_of(field), self.names_of(field)
            default = self.defaults.get(field.name, field.default)
            if flag.convert is not None:
                default = None  # a repeatable option's "not given"
            info = typer.Option(default, *names, help=flag.help, **flag.options)
            annotation = flag.cli_type if flag.cli_type is not None else hints[field.name]
            params.append(
                inspect.Parameter(
                    field.name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=annotation
                )
            )
        return params

    def build(self, values: dict[str, Any]) -> Any:
        """The dataclass from the parsed values (taken out of ``values``)."""
        given = {}
        for field in self.chosen():
            value, convert = values.pop(field.name), flag_of(field).convert
            given[field.name] = convert(value) if convert is not None else value
        return self.table(**given)

    def argv(self, settings: Any) -> list[str]:
        """The options that give ``settings`` back: each chosen field that is set (a launchd
        plist repeats serve's own command line)."""
        argv: list[str] = []
        for field in self.chosen():
            value, yes_no = getattr(settings, field.name), self.names_of(field)[0].split("/")
            if len(yes_no) == 2 and value is not None:
                argv.append(yes_no[0] if value else yes_no[1])
            elif isinstance(value, bool):
                argv += [yes_no[0]] if value else []
            elif isinstance(value, tuple):
                argv += [part for item in value for part in (yes_no[0], str(item))]
            elif value is not None:
                argv += [yes_no[0], str(value)]
        return argv


def takes(**tables: Pick | type) -> Callable[[Command], Command]:
    """Make each parameter named in ``tables`` (annotated with its dataclass) the options of that
    dataclass's fields: typer sees those options, the command receives the dataclass."""
    picks = {name: p if isinstance(p, Pick) else Pick(p) for name, p in tables.items()}

    def decorate(command: Command) -> Command:
        signature = inspect.signature(command, eval_str=True)
        params: list[inspect.Parameter] = []
        for param in signature.parameters.values():
            if param.name in picks:
                params += picks[param.name].parameters()
            else:
                params.append(param.replace(kind=inspect.Parameter.KEYWORD_ONLY))

        @functools.wraps(command)
        def run(**values: Any) -> Any:
            for name, pick in picks.items():
                values[name] = pick.build(values)
            return command(**values)

        del run.__wrapped__  # typer reads the signature below, not the command's own
        run.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        if signature.return_annotation is not inspect.Signature.empty:
            run.__annotations__["return"] = signature.return_annotation
        return run  # type: ignore[return-value]

    return decorate
