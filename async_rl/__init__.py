"""Ray-based asynchronous distributed RL: actors, algorithms and environments."""
__version__ = "0.1.0"
