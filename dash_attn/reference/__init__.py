"""Reference math on any device: eager attention (fp32/fp64) and a CPU executor of schedules."""
