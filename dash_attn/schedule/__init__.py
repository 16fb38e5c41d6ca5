"""The pure-Python schedule engine (imports neither torch nor triton)."""

from .generators import (
    applicable_schedules,
    auto_schedule_name,
    build_schedule,
    make_schedule,
    schedule_names,
)
from .types import Dispatch, Schedule, ScheduleSpec

__all__ = [
    "Dispatch",
    "Schedule",
    "ScheduleSpec",
    "applicable_schedules",
    "auto_schedule_name",
    "build_schedule",
    "make_schedule",
    "schedule_names",
]
