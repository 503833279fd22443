"""Measuring and explaining: reference figures, repeat statistics, telemetry and verdicts."""
