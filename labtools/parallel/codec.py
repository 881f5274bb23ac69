"""What crosses into and out of the ranks: dataclasses, sent as JSON, rebuilt typed and validated.

    config_type(fn)            the dataclass fn's one argument is annotated with (None: fn takes no argument)
    encode_config(fn, config)  JSON-ready data, after checking config is an instance of that dataclass
    decode_config(cls, data)   the dataclass again (tuples, nested dataclasses), __post_init__ run once more
    result_type(fn)            the dataclass fn's return is annotated with
    encode_result(fn, result)  JSON-ready data, after checking the result is an instance of it
    decode_result(cls, data)   the result again, every field rebuilt as its annotation says

A field may be a number, a string, a bool, None, an enum of strings (labtools.keys.Key), a dataclass, or a list,
tuple or dict of them (dict keys str, int or a Key: JSON turns keys into strings, decoding turns them back).
"""

import dataclasses
import enum
import inspect
import json
import types
import typing


def config_type(fn) -> type | None:
    """The dataclass a rank function takes (from its annotation), or None for a function of no arguments."""
    params = list(inspect.signature(fn).parameters.values())
    if not params:
        return None
    hint = typing.get_type_hints(fn).get(params[0].name) if len(params) == 1 else None
    if not (isinstance(hint, type) and dataclasses.is_dataclass(hint)):
        raise ValueError(f"rank function {fn.__module__}.{fn.__qualname__} must take no arguments or one argument "
                         "annotated with a dataclass (its config), e.g. `def fn(cfg: MyJob) -> MyResult`")
    return hint


def result_type(fn) -> type:
    """The dataclass a rank function returns (from its return annotation)."""
    hint = typing.get_type_hints(fn).get("return")
    if not (isinstance(hint, type) and dataclasses.is_dataclass(hint)):
        raise ValueError(f"rank function {fn.__module__}.{fn.__qualname__} must be annotated to return a dataclass "
                         f"(its result), e.g. `def fn(cfg: MyJob) -> MyResult`; got {hint!r}")
    return hint


def _json(value, what: str):
    try:
        return json.loads(json.dumps(dataclasses.asdict(value)))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} fields must be JSON-serialisable (numbers, strings, lists, dicts, dataclasses): "
                         f"{e}") from e


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
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):  # before any process starts: a field of the wrong type is named here
        _check(cls, f.name, hints.get(f.name), getattr(config, f.name))
    return _json(config, "config")


def encode_result(fn, result) -> dict:
    """The result as JSON-ready data, after checking it is an instance of the function's result dataclass."""
    cls = result_type(fn)
    if not isinstance(result, cls):
        raise TypeError(f"{fn.__module__}.{fn.__qualname__} must return a {cls.__qualname__} (its annotation), "
                        f"returned {type(result).__name__}")
    return _json(result, "result")


def decode_config(cls: type, data: dict):
    """Rebuild a config dataclass from JSON data: lists become tuples where the field is a tuple, nested
    dataclasses are rebuilt, and __post_init__ validates it again."""
    return _decode_dataclass(cls, data)


def decode_result(cls: type, data: dict):
    """Rebuild a result dataclass from JSON data, every field as its annotation says."""
    return _decode_dataclass(cls, data)


def _decode_dataclass(cls: type, data: dict):
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__qualname__} must come as a JSON object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ValueError(f"unknown field(s) {unknown} for {cls.__qualname__}; its fields: {names}")
    kwargs = {}
    for name in names:
        if name in data:
            value = _decode(hints.get(name), data[name])
            _check(cls, name, hints.get(name), value)
            kwargs[name] = value
    return cls(**kwargs)


def _check(cls: type, name: str, hint, value) -> None:
    """A field of a plain type holds a value of that type (an int for a float is fine; a bool is not an int)."""
    if value is None or hint not in (int, float, str, bool):
        return
    ok = (isinstance(value, bool) if hint is bool else
          isinstance(value, (int, float)) and not isinstance(value, bool) if hint is float else
          isinstance(value, int) and not isinstance(value, bool) if hint is int else isinstance(value, str))
    if not ok:
        raise ValueError(f"{cls.__qualname__}.{name} must be {hint.__name__}, got {type(value).__name__} "
                         f"{value!r}")


def _decode(hint, value):
    """value (from JSON) as the annotation `hint` says: dataclasses rebuilt, tuples from lists, int keys from
    strings; Optional and unions tried in order."""
    if hint is None or value is None or hint is typing.Any:
        return value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for arm in args:
            if arm is type(None):
                continue
            try:
                return _decode(arm, value)
            except (TypeError, ValueError):
                continue
        return value
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _decode_dataclass(hint, value)
    if hint is tuple or origin is tuple:
        if not isinstance(value, (list, tuple)):
            return value
        if args and args[-1] is not Ellipsis and len(args) == len(value):
            return tuple(_decode(a, v) for a, v in zip(args, value))
        arm = args[0] if args else None
        return tuple(_decode(arm, v) if arm is not None else _tuples(v) for v in value)
    if origin is list:
        return [_decode(args[0] if args else None, v) for v in value]
    if origin is dict:
        key, val = (args or (None, None))
        return {_key(key, k): _decode(val, v) for k, v in value.items()}
    if isinstance(hint, type) and issubclass(hint, enum.Enum) and not isinstance(value, hint):
        return hint(value)
    return value


def _key(hint, k):
    """A dict key from JSON (always a string) as its annotation says: an int, or an enum member by its value."""
    if hint is int:
        return int(k)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(k)
    return k


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value
