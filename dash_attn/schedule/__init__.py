"""The pure-Python schedule engine (imports neither torch nor triton)."""

from .generators import (
    applicable_schedules,
    auto_schedule_name,
    build_schedule,
    make_schedule,
    schedule_names,
)
from .render import dq_orders, render_ascii, schedule_from_json, schedule_to_json
from .simulate import SimResult, simulate
from .types import Dispatch, Schedule, ScheduleSpec
from .validate import ValidationReport, rank_predecessors, validate

__all__ = [
    "Dispatch",
    "Schedule",
    "ScheduleSpec",
    "SimResult",
    "ValidationReport",
    "applicable_schedules",
    "auto_schedule_name",
    "build_schedule",
    "dq_orders",
    "make_schedule",
    "rank_predecessors",
    "render_ascii",
    "schedule_from_json",
    "schedule_names",
    "schedule_to_json",
    "simulate",
    "validate",
]
