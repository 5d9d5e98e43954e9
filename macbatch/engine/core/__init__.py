"""The engine core's parts: a request and what it reports (outputs), the scheduler and its step
plan, the step in flight, and the engine's counters. ``engine.py`` composes them."""
