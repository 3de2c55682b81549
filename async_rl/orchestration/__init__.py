"""The services the driver's loop composes: actor groups, weight sync, checkpoints, metrics,
evaluation, the replay buffer's supervision, placement, and the sync/async schedules."""
