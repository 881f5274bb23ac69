"""Names that key results: an enum whose members are strings, print as their value and hash as their value, so a
result that crossed JSON (plain strings for keys) still answers to the member: results["gpipe"] is
results[Schedule.GPIPE]. Each name is defined once (labtools.pipeline.Schedule, labtools.compute.Convention, ...),
and what a reader sees is a separate label."""

from enum import StrEnum


class Key(StrEnum):
    def __hash__(self) -> int:
        return hash(self.value)
