"""pipesched: choose, predict and run pipeline-parallel training schedules."""
__version__ = "0.1.0"
