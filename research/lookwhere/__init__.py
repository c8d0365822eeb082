"""LookWhere research tooling (not in the wheel): the distillation entry and the study."""
