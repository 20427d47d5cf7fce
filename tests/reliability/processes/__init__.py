"""The parts of the real-process trials (``process_trials.py`` is their entry point)."""
