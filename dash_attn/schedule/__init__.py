"""The pure-Python schedule engine (imports neither torch nor triton)."""

from .generators import (
    applicable_schedules,
    auto_schedule_name,
    build_schedule,
    check_schedule_fits,
    make_schedule,
    schedule_names,
)
from .invariance import SequenceOrder, invariance_errors, sequence_order
from .render import dq_orders, render_ascii, schedule_from_json, schedule_to_json
from .simulate import SimResult, simulate
from .types import (
    CAUSAL,
    FULL,
    MASK_KINDS,
    MASK_NAMES,
    TABLE_FIELDS,
    Dispatch,
    Mask,
    Schedule,
    ScheduleSpec,
)
from .validate import ValidationReport, dkv_predecessors, rank_predecessors, validate

__all__ = [
    "CAUSAL",
    "FULL",
    "MASK_KINDS",
    "MASK_NAMES",
    "TABLE_FIELDS",
    "Dispatch",
    "Mask",
    "Schedule",
    "ScheduleSpec",
    "SequenceOrder",
    "SimResult",
    "ValidationReport",
    "applicable_schedules",
    "auto_schedule_name",
    "build_schedule",
    "check_schedule_fits",
    "dq_orders",
    "invariance_errors",
    "make_schedule",
    "dkv_predecessors",
    "rank_predecessors",
    "render_ascii",
    "schedule_from_json",
    "schedule_names",
    "schedule_to_json",
    "sequence_order",
    "simulate",
    "validate",
]
