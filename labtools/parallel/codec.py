"""A rank function's config on its way to the ranks: a dataclass, sent as JSON, rebuilt typed and validated.

    config_type(fn)            the dataclass fn's one argument is annotated with (None: fn takes no argument)
    encode_config(fn, config)  JSON-ready data, after checking config is an instance of that dataclass
    decode_config(cls, data)   the dataclass again (tuples, nested dataclasses), __post_init__ run once more
"""

import dataclasses
import inspect
import json
import typing


def config_type(fn) -> type | None:
    """The dataclass a rank function takes (from its annotation), or None for a function of no arguments."""
    params = list(inspect.signature(fn).parameters.values())
    if not params:
        return None
    hint = typing.get_type_hints(fn).get(params[0].name) if len(params) == 1 else None
    if not (isinstance(hint, type) and dataclasses.is_dataclass(hint)):
        raise ValueError(f"rank function {fn.__module__}.{fn.__qualname__} must take no arguments or one argument "
                         "annotated with a dataclass (its config), e.g. `def fn(cfg: MyJob) -> dict`")
    return hint



def encode_config(fn, config) -> dict | None:
    """The config as JSON-ready data, after checking it is an instance of the function's config dataclass."""
    cls = config_type(fn)
    if cls is None:
        if config is not None:
            raise ValueError(f"{fn.__qualname__} takes no config, got {config!r}")
        return None
    if config is None:
        config = cls()  # the dataclass's defaults (raises TypeError if a field has none)
    if not isinstance(config, cls):
        raise ValueError(f"config must be a {cls.__qualname__} (the type {fn.__qualname__} is annotated with), "
                         f"got {type(config).__name__}")
    try:
        return json.loads(json.dumps(dataclasses.asdict(config)))
    except (TypeError, ValueError) as e:
        raise ValueError(f"config fields must be JSON-serialisable (numbers, strings, tuples): {e}") from e


def decode_config(cls: type, data: dict):
    """Rebuild a config dataclass from JSON data: lists become tuples where the field is a tuple, nested
    dataclasses are rebuilt, and __post_init__ validates it again."""
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ValueError(f"unknown field(s) {unknown} for {cls.__qualname__}; its fields: "
                         f"{[f.name for f in dataclasses.fields(cls)]}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        value, hint = data[f.name], hints.get(f.name)
        if isinstance(hint, type) and dataclasses.is_dataclass(hint) and isinstance(value, dict):
            value = decode_config(hint, value)
        elif typing.get_origin(hint) is tuple or hint is tuple:
            value = _tuples(value)
        kwargs[f.name] = value
    return cls(**kwargs)


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value
