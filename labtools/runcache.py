"""A memo of expensive runs for a panel: a setting seen before answers at once (labtools.widgets.Panel)."""

import json
from collections.abc import Callable, Mapping


class RunCache:
    """Memoise an expensive function of keyword primitives: fn(**config) runs once per config."""

    def __init__(self, fn: Callable[..., object]):
        self.fn = fn
        self.store: dict[str, object] = {}

    @staticmethod
    def key(config: Mapping) -> str:
        return json.dumps(dict(config), sort_keys=True, default=str)

    def __call__(self, **config):
        k = self.key(config)
        if k not in self.store:
            self.store[k] = self.fn(**config)
        return self.store[k]

    def put(self, result: object, **config) -> None:
        """Keep a result of fn(**config) computed elsewhere (e.g. by a launch that ran it beside its own work)."""
        self.store[self.key(config)] = result

    def __contains__(self, config: Mapping) -> bool:
        return self.key(config) in self.store

    def __len__(self) -> int:
        return len(self.store)
